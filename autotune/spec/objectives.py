"""The study's objectives: what each one optimises, and which trial metric it reads.

Contract: :data:`OBJECTIVES` maps an objective's name to its :class:`Objective`;
:func:`directions` gives Optuna's directions of a list of names, :func:`objective_values` the
values to tell for a trial's metrics (None when one is missing or not finite), and
:func:`length_free` whether a shorter trial leaves every one of them meaning the same (then a
trial may stop measuring once it knows its step time well enough: ``trial.precision``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # "maximize" or "minimize"
    metric: str  # the trial metric it reads (`autotune.jobs.METRICS`)
    # the value depends on how many steps the trial ran (not only on how precisely it measured)
    needs_full_trial: bool = False


OBJECTIVES = {
    o.name: o
    for o in (
        Objective("goodput", "maximize", "goodput"),
        Objective("peak_memory", "minimize", "peak_memory_mb"),
        # the loss after trial.steps updates: a trial stopped sooner reports a higher one
        Objective("final_loss", "minimize", "loss_last", needs_full_trial=True),
    )
}


def length_free(objectives) -> bool:
    """Whether no objective of ``objectives`` needs the trial's full ``trial.steps``."""
    return not any(OBJECTIVES[name].needs_full_trial for name in objectives)


def directions(objectives) -> list[str]:
    return [OBJECTIVES[name].direction for name in objectives]


def objective_values(objectives, metrics: dict) -> list[float] | None:
    """The values to tell for ``metrics``; None when one is missing or not finite."""
    values = []
    for name in objectives:
        value = metrics.get(OBJECTIVES[name].metric)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            return None
        values.append(float(value))
    return values
