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
  candidate (:func:`requeue_trial`); a live driver's trials are never touched, and a driver
  never fails its own (``me``) — not even after a gap in its own heartbeats (a database outage, a
  paused VM): it knows it lives. On a storage without heartbeats (SQLite: one driver) every
  RUNNING trial not of ``me`` is gone — a driver on another host (a fresh container, a copied
  database) cannot be judged there, and waiting for it would never end. On a server storage the
  heartbeat is the truth: a trial is gone when its heartbeats stopped for ``GRACE_S`` (by the
  database's clock), or at once when its driver's ``/proc`` can be read here
  (`autotune.storage.drivers.alive`: same host, boot and pid namespace) and that process has
  ended; a trial without a driver (a study run before drivers were recorded, or a driver that
  died between asking and recording itself) after ``GRACE_S`` from its start. There, the trial
  is failed in one write (its driver may be finishing it that very moment: its result then
  comes late, `autotune.storage.schema.record`), so it has no ``outcome`` attr of its own and
  `autotune.storage.schema.outcome_of` reads it as ``interrupted``; on SQLite it gets
  ``outcome: interrupted``.
"""

from __future__ import annotations

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


def _gone(frozen, shared: bool, stale: set) -> bool:
    """Whether the driver of a RUNNING trial is gone (see the module doc)."""
    if not shared:
        return True  # one driver: whatever runs but is not its own was left by a dead one
    owner = frozen.user_attrs.get(OWNER)
    if owner is None:
        return datetime.now() - frozen.datetime_start > timedelta(seconds=GRACE_S)
    known = alive(owner)
    return known is False or (known is None and frozen._trial_id in stale)


def recover_interrupted(study: optuna.Study, me: str | None = None) -> list[int]:
    """Fail the RUNNING trials whose driver is gone (never those of ``me``, this driver) and
    queue their candidates again; return their numbers."""
    storage, numbers = study._storage, []
    shared = heartbeats(storage)
    stale = set(storage._get_stale_trial_ids(study._study_id)) if shared else set()
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        mine = me is not None and frozen.user_attrs.get(OWNER) == me
        if mine or not _gone(frozen, shared, stale):
            continue
        try:
            if not shared:
                storage.set_trial_user_attr(frozen._trial_id, "outcome", "interrupted")
            if not storage.set_trial_state_values(frozen._trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another driver recovered it first, or its driver finished it after all
        requeue_trial(study, frozen)
        numbers.append(frozen.number)
    return sorted(numbers)
