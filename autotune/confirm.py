"""Which trials are best, and how sure we are: the ranking of a study's own trials and the
confirm phase that measures the winners and the baseline again, side by side.

A single trial's goodput on a shared machine can be off by tens of percent; one slow baseline
run once made a 1.0× configuration look 1.6× better. So every real-backend study ends by running
the top trials and the baseline again, interleaved, and reports means with their spread.

Contract (reads storage only, through the ``optuna.Study`` it is given):
- :func:`best_trials`: the best ranked ``ok`` trial (one objective) or the Pareto front of the
  ranked ``ok`` trials sorted by the first objective — never a repeat or a confirm re-run
  (`autotune.records.ranked`: a trial brought in by a warm start is one).
- :func:`baseline_of`: the baseline trial that ran (a re-run of an interrupted baseline counts).
- :func:`plan`: the trials to confirm — the top ``top`` of :func:`best_trials` (one objective:
  the ``top`` best ``ok`` trials) and the baseline — each with how many re-runs it still needs
  to have ``runs`` (a re-run lost to the infrastructure and retried is not one); in the order to
  run them: round by round, so machine noise hits all alike.
- :func:`summarize`: for every trial with confirm re-runs (user attr ``confirm_of``), its first
  objective over the original and its ``ok`` re-runs: mean and sample standard deviation.
- :func:`noise_floor`: the median over confirmed trials of std / mean (None below two).
- :func:`best_confirmed`: the confirmed trial with the best mean (what export takes), or None.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import optuna
from optuna.study._multi_objective import _get_pareto_front_trials_by_trials  # Optuna 5.0 (pinned)

from autotune import records


def _maximize(study: optuna.Study) -> bool:
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def _ranked(study: optuna.Study, trials: list) -> list:
    return sorted(trials, key=lambda t: t.values[0], reverse=_maximize(study))


def _ok(study: optuna.Study) -> list:
    return [t for t in study.get_trials(deepcopy=False)
            if records.ranked(t) and t.values is not None]


def best_trials(study: optuna.Study) -> list:
    ok = _ok(study)
    if len(study.directions) == 1:
        return _ranked(study, ok)[:1]
    return _ranked(study, _get_pareto_front_trials_by_trials(ok, study.directions))


def baseline_of(study: optuna.Study):
    return next((t for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get("baseline") and records.ranked(t)), None)


def plan(study: optuna.Study, top: int, runs: int) -> list:
    """The trials to re-run, one entry per re-run still missing, round by round."""
    if len(study.directions) == 1:
        chosen = _ranked(study, _ok(study))[:top]
    else:
        chosen = best_trials(study)[:top]
    baseline = baseline_of(study)
    if baseline is not None and baseline.values is not None and baseline not in chosen:
        chosen.append(baseline)
    done = {}
    for t in study.get_trials(deepcopy=False):
        if ("confirm_of" in t.user_attrs and t.state.is_finished()
                and records.outcome_of(t) != "interrupted" and not records.retried(t)):
            done[t.user_attrs["confirm_of"]] = done.get(t.user_attrs["confirm_of"], 0) + 1
    return [t for round_ in range(runs) for t in chosen if done.get(t.number, 0) <= round_]


@dataclass(frozen=True)
class Confirmed:
    number: int          # the original trial
    values: tuple        # its first objective, original first, then each ok re-run
    baseline: bool

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
        if "confirm_of" in t.user_attrs and t.values is not None:
            reruns.setdefault(t.user_attrs["confirm_of"], []).append(t.values[0])
    confirmed = []
    for number, values in sorted(reruns.items()):
        original = trials.get(number)
        if original is None or original.values is None:
            continue
        confirmed.append(Confirmed(number, (original.values[0], *values),
                                   bool(original.user_attrs.get("baseline"))))
    return confirmed


def noise_floor(confirmed: list[Confirmed]) -> float | None:
    spreads = [c.std / c.mean for c in confirmed if len(c.values) > 1 and c.mean]
    return statistics.median(spreads) if spreads else None


def best_confirmed(study: optuna.Study, include_baseline: bool = True) -> Confirmed | None:
    """The confirmed configuration with the best mean (None when nothing was confirmed)."""
    confirmed = [c for c in summarize(study) if include_baseline or not c.baseline]
    if not confirmed:
        return None
    pick = max if _maximize(study) else min
    return pick(confirmed, key=lambda c: c.mean)
