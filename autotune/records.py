"""How a trial's outcome is written to, and read back from, Optuna storage.

Contract: the driver is the only writer. Each trial carries the user attrs ``outcome`` (ok,
infeasible, oom, diverged, timeout, pruned, error, interrupted), ``detail`` (reason or log tail, not for
ok), every metric of :data:`METRICS` (the trial's ``metrics.json``, defined in
``autotune/train/metrics.py``) under its own name, ``estimate`` (the cost model's dict) and the
knobs that were not sampled (under their knob names). Only ``ok`` trials get objective values
(state COMPLETE). A bad candidate (infeasible, oom, diverged, timeout, pruned) is PRUNED so the sampler
learns to avoid its region; an error or interruption is FAIL (a FAIL trial without a failing
``outcome`` was failed by a recovery: :func:`outcome_of` reads it as interrupted). An error that was not the
candidate's own (`autotune.runner`) also has ``infrastructure: true``; a trial that runs a
candidate again after such a failure has ``retry_of`` = the failed trial's number
(`autotune.failures`). An ``ok`` trial with an estimate also keeps its ``diagnosis``
(`autotune.diagnosis`).
"""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from autotune import diagnosis
from autotune.spec import OBJECTIVES

METRICS = ("goodput", "throughput", "step_time_ms", "peak_memory_mb", "overflow_steps",
           "backoff_steps", "overflow_rate", "underflow_share", "loss_first", "loss_last", "diverged",
           "compile_s")
OBJECTIVE_METRIC = {"goodput": "goodput", "peak_memory": "peak_memory_mb", "final_loss": "loss_last"}
# pruned: stopped while running because it was clearly slower than the best (autotune.pruning)
PRUNED_OUTCOMES = ("infeasible", "oom", "diverged", "timeout", "pruned")
OUTCOMES = ("ok",) + PRUNED_OUTCOMES + ("error", "interrupted")


def directions(objectives) -> list[str]:
    return [OBJECTIVES[name] for name in objectives]


def objective_values(objectives, metrics: dict) -> list[float] | None:
    """The values to tell for ``metrics``; None when one is missing or not finite."""
    values = []
    for name in objectives:
        value = metrics.get(OBJECTIVE_METRIC[name])
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        values.append(float(value))
    return values


def _json_safe(value):
    # Storage serialises user attrs as JSON, which has no NaN or infinity.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def settle(objectives, outcome: str, metrics: dict | None = None, detail: str = "",
           extra: dict | None = None) -> tuple[TrialState, list[float] | None, dict]:
    """How a trial ends in storage: (state, objective values, user attrs)."""
    assert outcome in OUTCOMES, outcome
    metrics = metrics or {}
    values = objective_values(objectives, metrics) if outcome == "ok" else None
    if outcome == "ok" and values is None:
        outcome, detail = "error", "an objective metric is missing or not finite"
    attrs = {"outcome": outcome}
    if detail:
        attrs["detail"] = detail[-4000:]
    attrs.update({name: _json_safe(metrics[name]) for name in METRICS if name in metrics})
    attrs.update({key: _json_safe(value) for key, value in (extra or {}).items()})
    if outcome == "ok":
        return TrialState.COMPLETE, values, attrs
    return (TrialState.PRUNED if outcome in PRUNED_OUTCOMES else TrialState.FAIL), None, attrs


def record(study: optuna.Study, trial: optuna.Trial, objectives, outcome: str,
           metrics: dict | None = None, detail: str = "", extra: dict | None = None) -> None:
    """Store a trial's outcome, metrics and extra attrs, then tell the study how it ended."""
    state, values, attrs = settle(objectives, outcome, metrics, detail, extra)
    if state == TrialState.COMPLETE:  # why it is as fast as it is, kept beside what it measured
        found = diagnosis.from_attrs(attrs, knobs_of(trial), study.user_attrs)
        if found:
            attrs["diagnosis"] = found
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study.tell(trial, values, state=state)


def outcome_of(frozen: optuna.trial.FrozenTrial) -> str:
    """A trial's outcome. A FAIL trial whose attrs say otherwise (none, or one its driver was
    still writing) was failed by a recovery when its driver was gone: ``interrupted``
    (`autotune.study.recover_interrupted`)."""
    if frozen.state == TrialState.RUNNING:
        return "running"
    outcome = frozen.user_attrs.get("outcome")
    if frozen.state == TrialState.FAIL and outcome not in ("error", "interrupted"):
        return "interrupted"
    return outcome or "error"


def counted(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial counts toward the study's N finished trials: interrupted ones rerun, a
    repeat of an earlier candidate (``repeat_of``) was answered from storage, not run, a
    confirm-phase re-run (``confirm_of``) measures a trial again, a first infrastructure
    failure is retried (only a retry's, ``retry_of``, counts), and a trial brought in from an
    earlier study (``warm_start``, `autotune.warmstart`) ran there."""
    return (frozen.state.is_finished() and outcome_of(frozen) != "interrupted"
            and not {"repeat_of", "confirm_of", "warm_start"} & set(frozen.user_attrs)
            and not retried(frozen))


def will_count(t) -> bool:
    """Whether a RUNNING trial (of any driver) will count toward N when it ends, as far as can
    be told now (a repeat, a confirm re-run, a copy of an earlier study will not)."""
    return (t.state == TrialState.RUNNING
            and not {"repeat_of", "confirm_of", "warm_start"} & set(t.user_attrs))


def wanted(study, n_trials: int) -> int:
    """How many more trials to ask for ``n_trials`` finished ones: N less the finished and the
    running (any driver's) that count — but every queued candidate runs, even past N (an
    interrupted one on a finished study)."""
    trials = study.get_trials(deepcopy=False)
    done = sum(counted(t) or will_count(t) for t in trials)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    return max(n_trials - done, waiting)


def ranked(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial is one of the study's own measurements of its candidate (what rankings,
    failure memory and the prior see): a counted trial, or one brought in by a warm start."""
    return counted(frozen) or (frozen.state.is_finished() and "warm_start" in frozen.user_attrs)


def is_infrastructure(frozen) -> bool:
    """Whether a trial failed by no fault of its candidate (a lost worker, a failed launch)."""
    return bool(frozen.user_attrs.get("infrastructure"))


def retried(frozen) -> bool:
    """A first infrastructure failure: a new trial (``retry_of``) runs its candidate again."""
    return is_infrastructure(frozen) and "retry_of" not in frozen.user_attrs


ROLES = ("baseline", "confirm_of")  # user attrs that say what a trial is for, kept on a re-run


def role_of(trial) -> dict:
    """The role attrs of a trial, frozen or live (``baseline``, ``confirm_of``), for the trial
    that re-runs it."""
    return {key: trial.user_attrs[key] for key in ROLES if key in trial.user_attrs}


def metrics_of(frozen: optuna.trial.FrozenTrial) -> dict:
    """The :data:`METRICS` a trial stored (a trial that never ran has none)."""
    return {name: frozen.user_attrs[name] for name in METRICS if name in frozen.user_attrs}


def knobs_of(frozen: optuna.trial.FrozenTrial) -> dict:
    """Every knob value of a trial: sampled params, and the rest from user attrs."""
    from autotune.knobs import KNOB_NAMES

    return {name: frozen.params.get(name, frozen.user_attrs.get(name)) for name in KNOB_NAMES}
