"""Which trials count: toward a study's N, and as the trials the search ran.

Contract (reads trials only; every rule on a frozen trial's state and user attrs,
`autotune.storage.schema`):

- :func:`counted`: a trial counts toward the study's N finished trials — finished, not
  interrupted (its candidate runs again), not a repeat of an earlier candidate (``repeat_of``:
  answered from storage, not run), not a confirm-phase re-run (``confirm_of``: it measures a
  trial again), not brought in from an earlier study (``warm_start``: it ran there), and not a
  first infrastructure failure (:func:`retried`: only its retry, ``retry_of``, counts).
- :func:`will_count`: a RUNNING trial (of any driver) that will count when it ends, as far as
  can be told now; :func:`wanted`: how many more trials to ask for N.
- :func:`ran` — a trial that ran its candidate to an end, whatever came of it: finished, not a
  repeat, not a warm-start copy, neither ``infeasible`` (never run) nor ``interrupted``.
- :func:`is_search_trial` — the one definition of *the trials the search ran*: the study's own
  measurement of each candidate it tried, i.e. a counted trial or one a warm start brought in.
  Rankings, the confirm phase, export, ``show``, ``report`` and ``compare``, the failure memory
  and the prior see these and no others; :func:`search_trials` lists them in trial order.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.storage.schema import is_infrastructure, outcome_of

NOT_COUNTED = ("repeat_of", "confirm_of", "warm_start")


def retried(frozen) -> bool:
    """A first infrastructure failure: a new trial (``retry_of``) runs its candidate again."""
    return is_infrastructure(frozen) and "retry_of" not in frozen.user_attrs


def counted(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial counts toward the study's N finished trials (see the module doc)."""
    return (
        frozen.state.is_finished()
        and outcome_of(frozen) != "interrupted"
        and not set(NOT_COUNTED) & set(frozen.user_attrs)
        and not retried(frozen)
    )


def will_count(t) -> bool:
    """Whether a RUNNING trial (of any driver) will count toward N when it ends, as far as can
    be told now (a repeat, a confirm re-run, a copy of an earlier study will not)."""
    return t.state == TrialState.RUNNING and not set(NOT_COUNTED) & set(t.user_attrs)


def wanted(trials, n_trials: int) -> int:
    """How many more trials to ask for ``n_trials`` finished ones, of a study whose trials
    (frozen, as just read) are ``trials``: N less the finished and the running (any driver's)
    that count — but every queued candidate runs, even past N (an interrupted one on a finished
    study)."""
    done = sum(counted(t) or will_count(t) for t in trials)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    return max(n_trials - done, waiting)


def ran(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial ran its candidate (see the module doc)."""
    return (
        frozen.state.is_finished()
        and outcome_of(frozen) not in ("infeasible", "interrupted")
        and not {"repeat_of", "warm_start"} & set(frozen.user_attrs)
    )


def is_search_trial(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial is one the search ran (see the module doc)."""
    return counted(frozen) or (frozen.state.is_finished() and "warm_start" in frozen.user_attrs)


def search_trials(trials) -> list:
    """The trials the search ran, of ``trials`` (frozen), in trial order."""
    return sorted((t for t in trials if is_search_trial(t)), key=lambda t: t.number)
