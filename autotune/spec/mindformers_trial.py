"""MindFormers as what a trial runs (``trial.program: mindformers``): what the spec decides.

Contract:
- :func:`cpu_refusals` says why MindFormers cannot run a candidate on CPU (measured:
  docs/mindformers.md, "On CPU"): semi-auto parallel (tp or pp > 1) and the parallel optimizer.
  The export writes such a candidate's device form and refuses to launch it here; a study whose
  trials are MindFormers runs on CPU screens it as infeasible before running it
  (`autotune.spec.constraints`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.spec.candidate import Candidate


def cpu_refusals(c: Candidate) -> list[str]:
    """Why MindFormers cannot run ``c`` on CPU (empty: it can)."""
    reasons = []
    if c.tp > 1 or c.pp > 1:
        reasons.append(
            f"tp = {c.tp}, pp = {c.pp} is semi-auto parallel, which MindSpore refuses "
            "on CPU ('Invalid backend: CPU')"
        )
    if c.parallel_optimizer:
        reasons.append(
            "the parallel optimizer: MindSpore runs it in data-parallel mode on Ascend only"
        )
    return reasons
