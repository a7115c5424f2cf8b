"""The retry policy: which failed trials the study remembers, and which it runs again.

Whose failure it was is decided where the facts are: the runner and the dispatcher set
``Result.infrastructure`` (`autotune.execution.classify`, `autotune.execution.dispatch`). What
follows from it is decided here, for the study's loop (`autotune.study.loop`), which alone acts
on it.

Contract:
- A candidate's own failure — an ``error`` of the trial program (a config error, a model that
  does not build or compile, an exception while training), like every bad outcome (oom,
  diverged, timeout, pruned, infeasible) — is remembered: the candidate does not run again, in
  this run (a repeat proposal is answered from memory, ``repeat_of``) or after a restart.
- An infrastructure failure (a lost Ray worker, a launch or cluster join that failed before the
  candidate ran) is recorded as an ``error`` with ``infrastructure: true`` and the reason in
  ``detail``, does not count toward N (`autotune.storage.counting.counted`), and its params are queued
  once more as a new trial with user attr ``retry_of`` = the failed trial's number and the
  failed trial's role (`autotune.storage.schema.role_of`: baseline, confirm_of).
- A retry that fails by infrastructure too is recorded the same way but counts, and is
  remembered for the rest of this run. A restart forgets infrastructure failures (the cluster
  may have been fixed since): a later proposal of the candidate runs.
- Interrupted trials are not failures: the driver stopped, `autotune.storage.recovery.requeue`.
"""

from __future__ import annotations

import optuna

from autotune.storage.counting import is_search_trial, rejected
from autotune.storage.schema import is_infrastructure, role_of

RETRY_OF = "retry_of"


def attrs(result) -> dict:
    """The user attrs that say whose failure ``result`` was (none for the candidate's own)."""
    return {"infrastructure": True} if result.outcome == "error" and result.infrastructure else {}


def needs_retry(trial, result) -> bool:
    """A first infrastructure failure: its candidate runs once more."""
    return bool(attrs(result)) and RETRY_OF not in trial.user_attrs


def remembered(trial, result) -> bool:
    """Whether this run answers later proposals of ``trial``'s candidate with ``result``: its
    own result, not a confirm-phase re-run (that adds a sample), not a retried failure."""
    return (
        result.outcome != "interrupted"
        and "confirm_of" not in trial.user_attrs
        and not needs_retry(trial, result)
    )


def remembered_after_restart(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a resumed run answers proposals of this stored trial's candidate from it (one
    brought in by a warm start too, and a rejected one: it is not run, as in the run that
    rejected it)."""
    return (is_search_trial(frozen) or rejected(frozen)) and not is_infrastructure(frozen)


def retry(study: optuna.Study, trial) -> None:
    """Queue ``trial``'s params to run again, keeping its role, marked ``retry_of``."""
    study.enqueue_trial(trial.params, user_attrs={**role_of(trial), RETRY_OF: trial.number})


def retry_note(number: int, result) -> str:
    """The progress line of a retry: which trial, why."""
    reason = (result.detail.strip().splitlines() or [""])[0][:160]
    return f"#{number} failed by infrastructure, not by its candidate ({reason}): running it again once"
