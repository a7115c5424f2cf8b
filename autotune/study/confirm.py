"""The confirm phase: the winners and the baseline measured again, side by side.

A single trial's goodput on a shared machine can be off by tens of percent; one slow baseline
run once made a 1.0× configuration look 1.6× better. So every study on a backend whose runs are
noisy ends by running the top trials and the baseline again, interleaved, and reports means with
their spread (`autotune.analysis.ranking`).

Contract: :func:`plan` names the trials to confirm — the top ``top`` by the ranking
(`autotune.analysis.ranking`: one objective, the ``top`` best ``ok`` trials; several, the first
``top`` of the Pareto front) and the baseline — each as many times as it still needs re-runs to
have ``runs`` (a re-run lost to the infrastructure and retried is not one, nor one interrupted,
nor a trial that repeated a measurement instead of making one), in the order to run
them: round by round, every other round in reverse (A B C, C B A), so a machine that speeds up or
slows down through the phase moves every configuration's mean alike, and a trial's last re-run of
one round and its first of the next run side by side (a warm pool of one size may take both). It
reads storage only.
"""

from __future__ import annotations

import optuna

from autotune.analysis.ranking import baseline_of, best_trials, ranked_ok
from autotune.storage.counting import retried
from autotune.storage.schema import outcome_of


def plan(study: optuna.Study, top: int, runs: int) -> list:
    """The trials to re-run, one entry per re-run still missing, round by round (every other
    round reversed)."""
    chosen = (ranked_ok(study) if len(study.directions) == 1 else best_trials(study))[:top]
    baseline = baseline_of(study)
    if baseline is not None and baseline.values is not None and baseline not in chosen:
        chosen.append(baseline)
    done = {}
    for t in study.get_trials(deepcopy=False):
        if (
            "confirm_of" in t.user_attrs
            and "repeat_of" not in t.user_attrs
            and t.state.is_finished()
            and outcome_of(t) != "interrupted"
            and not retried(t)
        ):
            done[t.user_attrs["confirm_of"]] = done.get(t.user_attrs["confirm_of"], 0) + 1
    return [
        t
        for round_ in range(runs)
        for t in (chosen[::-1] if round_ % 2 else chosen)
        if done.get(t.number, 0) <= round_
    ]
