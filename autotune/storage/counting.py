"""Which trials count: toward a study's N, and as the trials the search ran.

A trial is a run: ``--trials N`` (``n_trials``), the progress line's ``[k/N]`` and the budget
count the candidates dispatched to the pool. What is answered without a run is recorded, as
every trial is, and does not count.

Contract (reads trials only; every rule on a frozen trial's state and user attrs,
`autotune.storage.schema`):

- :func:`rejected`: a candidate turned down before it ran — by the constraints or the memory
  screen, or a replay table without it (outcome ``infeasible``, its reason in ``detail``); a
  repeat of one (``repeat_of``) is a repeat, not a rejection. A candidate the trial program
  itself refused at start-up (MindFormers refusing a setting for the backend) is ``infeasible``
  too, but it was dispatched and ran until refused (its ``run_s`` is recorded): a run, counted.
- :func:`counted`: a trial counts toward the study's N — finished, not rejected (never ran), not
  interrupted (its candidate runs again), not a repeat of an earlier candidate (``repeat_of``:
  answered from storage, not run), not a confirm-phase re-run (``confirm_of``: it measures a
  trial again), not brought in from an earlier study (``warm_start``: it ran there), and not a
  first infrastructure failure (:func:`retried`: only its retry, ``retry_of``, counts).
- :func:`will_count`: a RUNNING trial (of any driver) that will count when it ends, as far as
  can be told now; :func:`wanted`: how many more trials to ask for N. A :class:`Tally` answers
  :meth:`Tally.wanted` from the study read again and again, each finished trial judged once
  (`autotune.storage.feed`): what a loop asks before every proposal, at a cost that does not
  grow with the study.
- :func:`ran` — a trial that ran its candidate to an end, whatever came of it: finished, not a
  repeat, not a warm-start copy, neither rejected (never run) nor ``interrupted``.
- :func:`is_search_trial` — the one definition of *the trials the search ran*: the study's own
  measurement of each candidate it ran, i.e. a counted trial or one a warm start brought in.
  Rankings, the confirm phase, export, ``show``, ``report`` and ``compare`` (its "trials to
  3 %" is in runs, the unit of N), the failure memory and the prior see these and no others; a
  rejected candidate measured nothing and is no step of the search's progress (the failure
  memory remembers it too, `autotune.study.retry`, and ``show`` counts it by outcome).
  :func:`search_trials` lists them in trial order.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.storage.feed import Feed
from autotune.storage.schema import is_infrastructure, outcome_of

NOT_COUNTED = ("repeat_of", "confirm_of", "warm_start")


def retried(frozen) -> bool:
    """A first infrastructure failure: a new trial (``retry_of``) runs its candidate again."""
    return is_infrastructure(frozen) and "retry_of" not in frozen.user_attrs


def rejected(frozen) -> bool:
    """Whether a trial is a candidate turned down before it ran (see the module doc)."""
    return (
        frozen.state.is_finished()
        and _never_ran(frozen)
        and outcome_of(frozen) == "infeasible"
        and not {"repeat_of", "warm_start"} & set(frozen.user_attrs)
    )


def _never_ran(frozen) -> bool:
    """Interrupted, or infeasible without a run (a program's refusal at start-up ran: run_s)."""
    outcome = outcome_of(frozen)
    return outcome == "interrupted" or (
        outcome == "infeasible" and "run_s" not in frozen.user_attrs
    )


def counted(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial counts toward the study's N finished trials (see the module doc)."""
    return (
        frozen.state.is_finished()
        and not _never_ran(frozen)
        and not set(NOT_COUNTED) & set(frozen.user_attrs)
        and not retried(frozen)
    )


def will_count(t) -> bool:
    """Whether a RUNNING trial (of any driver) will count toward N when it ends, as far as can
    be told now (a repeat, a confirm re-run, a copy of an earlier study will not; nor will a
    rejected candidate, which cannot be told from a running one)."""
    return t.state == TrialState.RUNNING and not set(NOT_COUNTED) & set(t.user_attrs)


def wanted(trials, n_trials: int) -> int:
    """How many more trials to ask for ``n_trials`` finished ones, of a study whose trials
    (frozen, as just read) are ``trials``: N less the finished and the running (any driver's)
    that count — but every queued candidate runs, even past N (an interrupted one on a finished
    study)."""
    tally = Tally()
    tally.update(trials)
    return tally.wanted(n_trials)


class Tally:
    """What counts toward N, from the study read again and again (see the module doc)."""

    def __init__(self):
        self.feed = Feed()
        self.counted = 0  # finished trials that count

    def update(self, trials) -> list:
        """Judge what finished since the last update (``trials``: the study's, in number
        order); returns those trials."""
        return self._judge(self.feed.update(trials))

    def read(self, study) -> list:
        """:meth:`update` from ``study`` as it is now, read by the feed itself (only what
        changed: `autotune.storage.feed.Feed.read`)."""
        return self._judge(self.feed.read(study))

    def _judge(self, finished: list) -> list:
        self.counted += sum(map(counted, finished))
        return finished

    def running(self) -> list:
        """The trials running at the last update (any driver's)."""
        return [t for t in self.feed.unfinished.values() if t.state == TrialState.RUNNING]

    def waiting(self) -> int:
        """How many trials waited in the queue at the last update."""
        return sum(t.state == TrialState.WAITING for t in self.feed.unfinished.values())

    def wanted(self, n_trials: int) -> int:
        """:func:`wanted` of the study as last updated."""
        done = self.counted + sum(map(will_count, self.running()))
        return max(n_trials - done, self.waiting())


def ran(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial ran its candidate (see the module doc)."""
    return (
        frozen.state.is_finished()
        and not _never_ran(frozen)
        and not {"repeat_of", "warm_start"} & set(frozen.user_attrs)
    )


def is_search_trial(frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial is one the search ran (see the module doc)."""
    return counted(frozen) or (frozen.state.is_finished() and "warm_start" in frozen.user_attrs)


def search_trials(trials) -> list:
    """The trials the search ran, of ``trials`` (frozen), in trial order."""
    return sorted((t for t in trials if is_search_trial(t)), key=lambda t: t.number)
