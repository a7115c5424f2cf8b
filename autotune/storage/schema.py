"""How a trial's outcome is written to, and read back from, Optuna storage.

Contract: the driver is the only writer. Each trial carries the user attrs ``outcome`` (one of
`autotune.jobs.OUTCOMES`), ``detail`` (reason or log tail, not for ok), every metric of
`autotune.jobs.METRICS` under its own name, ``estimate`` (the cost model's dict), the knobs that
were not sampled (under their knob names) and whatever else the caller hands :func:`record`
(a ``diagnosis``, timings, roles) — this module computes nothing about a trial. Only ``ok``
trials get objective values (state COMPLETE). A bad candidate (infeasible, oom, diverged,
timeout, pruned) is PRUNED so the sampler learns to avoid its region; an error or interruption
is FAIL (a FAIL trial without a failing ``outcome`` was failed by a recovery: :func:`outcome_of`
reads it as interrupted). Values storage cannot hold (NaN, infinity) are stored as None.

Readers: :func:`outcome_of`, :func:`metrics_of`, :func:`knobs_of` (every knob, sampled or not),
:func:`role_of` (what a trial is for, kept by a trial that runs it again) and :func:`maximizes`
(the direction of a study's first objective). Which trials count is `autotune.storage.counting`.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.files import json_safe
from autotune.jobs import METRICS, OUTCOMES
from autotune.spec.knobs import KNOB_NAMES, KNOBS
from autotune.spec.objectives import objective_values

PRUNED_OUTCOMES = ("infeasible", "oom", "diverged", "timeout", "pruned")
ROLES = ("baseline", "confirm_of")  # user attrs that say what a trial is for, kept on a re-run


def settle(objectives, outcome: str, metrics: dict | None = None, detail: str = "",
           extra: dict | None = None) -> tuple[TrialState, list[float] | None, dict]:
    """How a trial ends in storage: (state, objective values, user attrs). A ``repeat_of``
    copy (``extra``: a candidate answered from an earlier trial, not run) is stored FAIL without
    values, whatever its outcome attr says: Optuna's samplers, ``study.best_trials`` and the
    dashboard take a COMPLETE trial for a measurement, and it is none (:func:`outcome_of` reads
    its outcome from the attr)."""
    assert outcome in OUTCOMES, outcome
    metrics = metrics or {}
    values = objective_values(objectives, metrics) if outcome == "ok" else None
    if outcome == "ok" and values is None:
        outcome, detail = "error", "an objective metric is missing or not finite"
    attrs = {"outcome": outcome}
    if detail:
        attrs["detail"] = detail[-4000:]
    attrs.update({name: json_safe(metrics[name]) for name in METRICS if name in metrics})
    attrs.update({key: json_safe(value) for key, value in (extra or {}).items()})
    if "repeat_of" in attrs:
        return TrialState.FAIL, None, attrs
    if outcome == "ok":
        return TrialState.COMPLETE, values, attrs
    return (TrialState.PRUNED if outcome in PRUNED_OUTCOMES else TrialState.FAIL), None, attrs


def record(study: optuna.Study, trial: optuna.Trial, objectives, outcome: str,
           metrics: dict | None = None, detail: str = "", extra: dict | None = None) -> None:
    """Store a trial's outcome, metrics and extra attrs, then tell the study how it ended."""
    state, values, attrs = settle(objectives, outcome, metrics, detail, extra)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study.tell(trial, values, state=state)


def outcome_of(frozen: optuna.trial.FrozenTrial) -> str:
    """A trial's outcome. A FAIL trial whose attrs say otherwise (none, or one its driver was
    still writing) was failed by a recovery when its driver was gone: ``interrupted``
    (`autotune.storage.recovery`) — unless it is a ``repeat_of`` copy, stored FAIL whatever
    its outcome (:func:`settle`)."""
    if frozen.state == TrialState.RUNNING:
        return "running"
    outcome = frozen.user_attrs.get("outcome")
    repeat = "repeat_of" in frozen.user_attrs and outcome in OUTCOMES
    if frozen.state == TrialState.FAIL and outcome not in ("error", "interrupted") and not repeat:
        return "interrupted"
    return outcome or "error"


def is_infrastructure(frozen) -> bool:
    """Whether a trial failed by no fault of its candidate (a lost worker, a failed launch)."""
    return bool(frozen.user_attrs.get("infrastructure"))


def role_of(trial) -> dict:
    """The role attrs of a trial, frozen or live (``baseline``, ``confirm_of``), for the trial
    that re-runs it."""
    return {key: trial.user_attrs[key] for key in ROLES if key in trial.user_attrs}


def metrics_of(frozen: optuna.trial.FrozenTrial) -> dict:
    """The metrics a trial stored (a trial that never ran has none)."""
    return {name: frozen.user_attrs[name] for name in METRICS if name in frozen.user_attrs}


def knobs_of(frozen: optuna.trial.FrozenTrial) -> dict:
    """Every knob value of a trial: sampled params, and the rest from user attrs; a knob added
    since the trial was stored (`autotune.spec.knobs.Knob.added_later`) at its default, the
    value the trial ran with."""
    return {name: frozen.params.get(name, frozen.user_attrs.get(
                name, KNOBS[name].default if KNOBS[name].added_later else None))
            for name in KNOB_NAMES}


def maximizes(study: optuna.Study) -> bool:
    """Whether the study's first objective (the one rankings and the pruner go by) is maximised."""
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
