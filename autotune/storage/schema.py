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

A result that comes back for a trial another driver already failed (it took this driver for
dead: `autotune.storage.recovery`) is a *late* result: :func:`record` stores a measured one as a
new finished trial with the same params and user attrs, plus ``late_of`` = the failed trial's
number, and withdraws the copy that recovery queued to run again if no driver asked it yet
(under the study's lock: state FAIL, ``outcome: interrupted``, ``withdrawn_for`` = the new
trial). So the candidate is measured once and nothing raises; a late answer that measured
nothing (interrupted, infeasible, a repeat) is dropped — the failed trial already says
``interrupted``.

Readers: :func:`outcome_of`, :func:`metrics_of`, :func:`knobs_of` (every knob, sampled or not),
:func:`role_of` (what a trial is for, kept by a trial that runs it again), :func:`maximizes`
(the direction of a study's first objective) and :func:`loss_signs` (of every objective).
Which trials count is `autotune.storage.counting`.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.files import json_safe
from autotune.jobs import METRICS, OUTCOMES
from autotune.spec.knobs import KNOB_NAMES, KNOBS
from autotune.spec.objectives import objective_values
from autotune.storage.drivers import locked
from autotune.storage.writes import batched

PRUNED_OUTCOMES = ("infeasible", "oom", "diverged", "timeout", "pruned")
ROLES = ("baseline", "confirm_of")  # user attrs that say what a trial is for, kept on a re-run


def settle(
    objectives,
    outcome: str,
    metrics: dict | None = None,
    detail: str = "",
    extra: dict | None = None,
) -> tuple[TrialState, list[float] | None, dict]:
    """How a trial ends in storage: (state, objective values, user attrs). A ``repeat_of``
    copy (``extra``: a candidate answered from an earlier trial, not run) is stored PRUNED
    without values, whatever its outcome attr says (:func:`outcome_of` reads it from the attr):
    Optuna's samplers, ``study.best_trials`` and the dashboard take a COMPLETE trial for a
    measurement, and it is none; and TPE ranks a pruned trial below every measured one, so a
    sampler that proposed a tried candidate is pushed elsewhere (stored FAIL, TPE saw nothing
    and proposed the same candidate until the loop gave up: tests/storage/test_drivers.py)."""
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
        return TrialState.PRUNED, None, attrs
    if outcome == "ok":
        return TrialState.COMPLETE, values, attrs
    return (TrialState.PRUNED if outcome in PRUNED_OUTCOMES else TrialState.FAIL), None, attrs


def record(
    study: optuna.Study,
    trial: optuna.Trial,
    objectives,
    outcome: str,
    metrics: dict | None = None,
    detail: str = "",
    extra: dict | None = None,
    study_attrs: dict | None = None,
) -> int | None:
    """Store a trial's outcome, metrics and extra attrs (and ``study_attrs``, user attrs of the
    study, in the same transaction), then tell the study how it ended. Returns the number of
    the trial that holds it: ``trial``'s, a new one for a late result, None for a late answer
    that measured nothing (see the module doc)."""
    state, values, attrs = settle(objectives, outcome, metrics, detail, extra)
    try:
        # its attrs, the study's and its end (what study.tell does): one transaction
        with batched(trial, study_attrs, end=(state, values)):
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
        return trial.number
    except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
        frozen = study._storage.get_trial(trial._trial_id)
        if not frozen.state.is_finished():
            raise
        for key, value in (study_attrs or {}).items():  # the study's, whatever the trial's fate
            study.set_user_attr(key, value)
        return _record_late(study, frozen, state, values, attrs)


def _record_late(study: optuna.Study, failed, state, values, attrs: dict) -> int | None:
    """A late result for ``failed`` (frozen, failed by another driver): see the module doc."""
    if attrs["outcome"] in ("interrupted", "infeasible") or "repeat_of" in failed.user_attrs:
        return None
    kept = {k: v for k, v in failed.user_attrs.items() if k not in ("outcome", "detail")}
    storage = study._storage
    number = storage.get_trial_number_from_id(
        storage.create_new_trial(
            study._study_id,
            template_trial=optuna.trial.create_trial(
                state=state,
                values=values,
                params=failed.params,
                distributions=failed.distributions,
                user_attrs={**kept, **attrs, "late_of": failed.number},
            ),
        )
    )
    with locked(storage, study._study_id):  # no driver asks the queued copy meanwhile
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            if (
                t.system_attrs.get("fixed_params") == failed.params  # recovery's copy only,
                and not {"retry_of", "confirm_of"} & set(t.user_attrs)
            ):  # no other job
                storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")
                storage.set_trial_user_attr(t._trial_id, "withdrawn_for", number)
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                break
    return number


def outcome_of(frozen: optuna.trial.FrozenTrial) -> str:
    """A trial's outcome. A FAIL trial whose attrs say otherwise (none, or one its driver was
    still writing) was failed by a recovery when its driver was gone: ``interrupted``
    (`autotune.storage.recovery`). A ``repeat_of`` copy's outcome is its attr, whatever its
    state (:func:`settle`)."""
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
    return {
        name: frozen.params.get(
            name,
            frozen.user_attrs.get(name, KNOBS[name].default if KNOBS[name].added_later else None),
        )
        for name in KNOB_NAMES
    }


def maximizes(study: optuna.Study) -> bool:
    """Whether the study's first objective (the one rankings and the pruner go by) is maximised."""
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def loss_signs(study: optuna.Study) -> list[float]:
    """Per objective, the factor that makes its value a loss (smaller is better): -1 where it is
    maximised, 1 where minimised."""
    return [-1.0 if d == optuna.study.StudyDirection.MAXIMIZE else 1.0 for d in study.directions]
