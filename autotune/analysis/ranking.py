"""Which trials are best, and how sure we are: the ranking of the trials the search ran, and
the statistics of the confirm phase that measured the winners and the baseline again.

Contract (reads storage only, through the ``optuna.Study`` it is given; every function sees the
trials the search ran, `autotune.storage.counting.is_search_trial`, and, for the statistics,
the confirm-phase re-runs of them):
- :func:`best_trials`: the best ``ok`` trial (one objective) or the Pareto front of the ``ok``
  trials sorted by the first objective.
- :func:`ranked_ok`: every ``ok`` trial the search ran, best first objective first.
- :func:`baseline_of`: the baseline trial that ran (a re-run of an interrupted baseline counts),
  or the one that was rejected before it could (`autotune.storage.counting.rejected`: what
  the study says of its baseline then).
- :func:`summarize`: for every trial with confirm re-runs (user attr ``confirm_of``), its first
  objective over its ``ok`` re-runs only — measured in the confirm phase, interleaved round by
  round with the baseline's re-runs — as mean and sample standard deviation. The original's own
  value is kept beside them (``original``), never in them: it won the selection, so it is the
  reading most likely to be lucky. A trial that merely repeated an earlier one (``repeat_of``)
  measured nothing and is no re-run. Beside them, ``within_run``: the median of the re-runs'
  ``step_time_ci`` (how precisely one run knew its mean step time, 95%; goodput's relative
  interval to first order), None where none stored one (a replay row may not carry it).
- :func:`noise_floor`: the median over confirmed trials of std / mean (None below two).
- :func:`median_within_run`: the median ``step_time_ci`` over every confirm-phase re-run that
  has one (None: none has), to set against the noise floor: run-to-run noise when the floor is
  above it, the steps' own noise when it is not.
- :func:`best_confirmed`: the confirmed trial with the best mean, or None.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import optuna
from optuna.study._multi_objective import _get_pareto_front_trials_by_trials  # Optuna 5.0 (pinned)

from autotune.storage.counting import is_search_trial, rejected
from autotune.storage.schema import maximizes


def ranked_ok(study: optuna.Study) -> list:
    """The ``ok`` trials the search ran, best first objective first."""
    ok = [
        t for t in study.get_trials(deepcopy=False) if is_search_trial(t) and t.values is not None
    ]
    return sorted(ok, key=lambda t: t.values[0], reverse=maximizes(study))


def best_trials(study: optuna.Study) -> list:
    ok = ranked_ok(study)
    if len(study.directions) == 1:
        return ok[:1]
    front = _get_pareto_front_trials_by_trials(ok, study.directions)
    return sorted(front, key=lambda t: t.values[0], reverse=maximizes(study))


def baseline_of(study: optuna.Study):
    return next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("baseline") and (is_search_trial(t) or rejected(t))
        ),
        None,
    )


@dataclass(frozen=True)
class Confirmed:
    number: int  # the original trial
    values: tuple  # its first objective in each ok confirm-phase re-run, in order
    baseline: bool
    original: float  # the original trial's own first objective (shown beside, not averaged)
    intervals: tuple = ()  # the step_time_ci of each re-run that stored one

    @property
    def within_run(self) -> float | None:
        return statistics.median(self.intervals) if self.intervals else None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else float("nan")


def summarize(study: optuna.Study) -> list[Confirmed]:
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    reruns: dict[int, list] = {}
    for t in trials.values():
        if (
            "confirm_of" in t.user_attrs
            and "repeat_of" not in t.user_attrs
            and t.values is not None
        ):
            reruns.setdefault(t.user_attrs["confirm_of"], []).append(t)
    confirmed = []
    for number, runs in sorted(reruns.items()):
        original = trials.get(number)
        if original is None or original.values is None:
            continue
        intervals = tuple(
            t.user_attrs["step_time_ci"]
            for t in runs
            if t.user_attrs.get("step_time_ci") is not None
        )
        confirmed.append(
            Confirmed(
                number,
                tuple(t.values[0] for t in runs),
                bool(original.user_attrs.get("baseline")),
                original.values[0],
                intervals,
            )
        )
    return confirmed


def noise_floor(confirmed: list[Confirmed]) -> float | None:
    spreads = [c.std / c.mean for c in confirmed if len(c.values) > 1 and c.mean]
    return statistics.median(spreads) if spreads else None


def median_within_run(confirmed: list[Confirmed]) -> float | None:
    intervals = [h for c in confirmed for h in c.intervals]
    return statistics.median(intervals) if intervals else None


def best_confirmed(study: optuna.Study, include_baseline: bool = True) -> Confirmed | None:
    """The confirmed configuration with the best mean (None when nothing was confirmed)."""
    confirmed = [c for c in summarize(study) if include_baseline or not c.baseline]
    if not confirmed:
        return None
    pick = max if maximizes(study) else min
    return pick(confirmed, key=lambda c: c.mean)
