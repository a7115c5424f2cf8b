"""The config a trial program reads: made here, next to the program that reads it.

Contract: :func:`trial_config` is the one writer of the ``config.json`` format described in
this package's docstring; the search loop uses it for trials and export for the full-length run.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path


def trial_config(spec, candidate, *, study: str, number: int, out_dir: str | Path,
                 steps: int, measure_after: int, backend: str | None = None) -> dict:
    """``config.json`` for ``candidate`` of ``spec``: ``steps`` optimizer steps, timing after
    ``measure_after``, outputs in ``out_dir`` (kept as given: export writes a relative one)."""
    return {"study": study, "trial_number": number,
            "backend": backend or spec.cluster.backend, "seed": spec.search.seed or 0,
            "out_dir": str(out_dir),
            "model": spec.model.as_config(), "train": asdict(spec.train),
            "trial": {"steps": steps, "measure_after": measure_after},
            "knobs": candidate.as_dict()}
