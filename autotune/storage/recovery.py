"""What a driver that is gone left behind: its RUNNING trials, failed and their candidates
queued again.

Contract:
- :func:`requeue` queues params to run again (a resumed study runs them under a new trial
  number), unless they already wait. :func:`requeue_trial` queues an interrupted trial's
  candidate, keeping its role (`autotune.storage.schema.role_of`) — but not a repeat's (its
  candidate is its original's) nor a confirm-phase re-run's: the confirm phase recomputes from
  storage which re-runs are missing (`autotune.study.confirm.plan`), and a queued copy would
  be asked by the search, found already measured and stored as a copy of the original's value —
  a confirmation that measured nothing.
- :func:`recover_interrupted` fails the RUNNING trials whose driver is gone and requeues each
  candidate (keeping its role, `autotune.storage.schema.role_of`); a live driver's trials are
  never touched, nor this driver's own (``me``). On a storage without heartbeats (SQLite: one
  driver) every RUNNING trial not of ``me`` is gone — a driver on another host (a fresh
  container, a copied database) cannot be judged there, and waiting for it would never end. On a
  storage with heartbeats, gone means: its driver (user attr ``driver``,
  `autotune.storage.drivers`) ran on this machine and its process has ended; or its heartbeats
  are stale (Optuna's ``fail_stale_trials``, whose callback on a server storage is
  :class:`RequeueStale`); or, a trial without a driver (a study run before drivers were
  recorded, or a driver that died between asking and recording itself), after ``GRACE_S`` from
  its start. A trial failed through its heartbeats has no ``outcome`` attr (a
  finished trial's attrs cannot be set): `autotune.storage.schema.outcome_of` reads it as
  ``interrupted``.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta

import optuna
from optuna.trial import TrialState

from autotune.storage.drivers import GRACE_S, OWNER, alive, heartbeats
from autotune.storage.schema import role_of


def requeue(study: optuna.Study, params: dict, user_attrs: dict | None = None) -> None:
    """Queue ``params`` to run again, unless they already wait. (Optuna's own
    ``skip_if_exists`` also skips params that merely *ran* before — the very trial being
    re-run — so it cannot be used here.)"""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if params and not any(t.params == params for t in waiting):
        study.enqueue_trial(params, user_attrs=user_attrs)


def requeue_trial(study: optuna.Study, trial) -> None:
    """Queue the candidate of ``trial`` (frozen or live), interrupted, to run again with its
    role — unless it is a repeat or a confirm-phase re-run (see the module doc)."""
    if not {"repeat_of", "confirm_of"} & set(trial.user_attrs):
        requeue(study, trial.params, role_of(trial))


class RequeueStale:
    """The storage's stale-trial callback: queues the candidate of each trial Optuna's
    ``fail_stale_trials`` failed, and keeps their numbers for the caller to report."""

    def __init__(self):
        self.numbers: list[int] = []

    def __call__(self, study: optuna.Study, frozen) -> None:
        requeue_trial(study, frozen)
        self.numbers.append(frozen.number)


def _gone(frozen, shared: bool) -> bool:
    """Whether the driver of a RUNNING trial is gone (see the module doc)."""
    if not shared:
        return True  # one driver: whatever runs but is not its own was left by a dead one
    owner = frozen.user_attrs.get(OWNER)
    if owner is not None:
        return alive(owner) is False
    return datetime.now() - frozen.datetime_start > timedelta(seconds=GRACE_S)


def recover_interrupted(study: optuna.Study, me: str | None = None) -> list[int]:
    """Fail the RUNNING trials whose driver is gone (never those of ``me``, this driver) and
    queue their candidates again; return their numbers."""
    storage, numbers = study._storage, []
    shared = heartbeats(storage)
    callback = storage.get_heartbeat_stale_trial_callback() if shared else None
    if isinstance(callback, RequeueStale):
        before = len(callback.numbers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        numbers += callback.numbers[before:]
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        mine = me is not None and frozen.user_attrs.get(OWNER) == me
        if mine or not _gone(frozen, shared):
            continue
        try:
            optuna.Trial(study, frozen._trial_id).set_user_attr("outcome", "interrupted")
            study.tell(frozen.number, state=TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another driver recovered it first, or its driver finished it after all
        requeue_trial(study, frozen)
        numbers.append(frozen.number)
    return sorted(numbers)
