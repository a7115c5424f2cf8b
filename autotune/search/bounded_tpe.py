"""TPE that reads a long study's best trials and its latest ones, not every trial at every ask.

Optuna's TPE fits its two densities to every finished trial on every ask: l(x) to the best
``gamma(n) = min(⌈n/10⌉, 25)`` and g(x) to all the others, weighted by recency (the oldest at
1/n, the latest 25 at 1). Its cost per ask grows faster than the study (measured here,
`benchmarks/overhead.py --scale`: 13 ms at 500 trials, 33 ms at 1,000, 0.53 s at 10,000), so a
10,000-trial study spends most of its time in the sampler, not the trials.

Contract: a :class:`BoundedTPESampler` is Optuna's ``TPESampler`` (same arguments) that, once a
study has more than :data:`WINDOW` + :data:`BEST` finished trials, samples from a view of it
holding (every running trial, for the constant liar, and) the :data:`BEST` best complete trials
by each objective plus the :data:`WINDOW` latest finished ones. Below that it samples from every
trial, as Optuna's TPE does (the same proposals for the same seed), but from the study as read
once per ask, not again for each param it samples (its constant liar re-reads the study each
time: a trial another driver starts within the same ask is not seen as running until the next).

Why this bound keeps what TPE learns: with one objective l(x) is fitted to the same trials as
before — the best 25 of the study, whatever their age — and g(x) to the latest 500 of the
others instead of all of them, which TPE's own recency weights already count least (a trial
half a study old weighs half a new one). With several objectives TPE's l(x) takes ⌈n/10⌉ of the
trials by non-domination rank: the view's best by each objective and its latest stand in for them
(the Pareto front of a long study may lose a point that is best by no single objective).
The cost per ask is then that of a 525-trial study, whatever the study's length.
"""

from __future__ import annotations

import bisect
from collections import deque

import optuna
from optuna.trial import TrialState

from autotune.storage.feed import Feed
from autotune.storage.schema import loss_signs

WINDOW = 500  # the latest finished trials g(x) is fitted to
BEST = 25  # the best complete trials by each objective: TPE's l(x) takes at most 25


class BoundedTPESampler(optuna.samplers.TPESampler):
    """Optuna's TPE over a bounded view of a long study (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._feed = Feed()
        self._latest: deque = deque(maxlen=WINDOW)  # finished trials, in the order they ended
        self._best: list = []  # per objective: [(key, number, trial)] ascending, BEST at most
        self._view_of = None  # (the study's trials list it was built from, the view)

    def sample_relative(self, study, trial, search_space):
        return super().sample_relative(self._bounded(study), trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return super().sample_independent(
            self._bounded(study), trial, param_name, param_distribution
        )

    def _bounded(self, study):
        """A view of ``study``: all of it, or once it is long its best and latest trials (see
        the module doc) — as read once in this ask."""
        trials = study._get_trials(deepcopy=False, use_cache=True)  # once per ask (Optuna's)
        self._read(study, trials)
        finished = len(trials) - len(self._feed.unfinished)
        if finished <= WINDOW + BEST:
            return _View(study, trials)
        if self._view_of is None or self._view_of[0] is not trials:
            kept = {t.number: t for t in self._latest}
            for ranked in self._best:
                kept.update((number, t) for _, number, t in ranked)
            kept.update(
                (t.number, t)
                for t in self._feed.unfinished.values()
                if t.state == TrialState.RUNNING
            )
            self._view_of = (trials, _View(study, [kept[n] for n in sorted(kept)]))
        return self._view_of[1]

    def _read(self, study, trials) -> None:
        """Take in the trials that finished since the last ask."""
        signs = loss_signs(study)
        if not self._best:
            self._best = [[] for _ in signs]
        for t in self._feed.update(trials):
            if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                continue  # TPE reads nothing of a failed trial
            self._latest.append(t)
            if t.state != TrialState.COMPLETE:
                continue
            for ranked, sign, value in zip(self._best, signs, t.values):
                entry = (sign * value, t.number, t)
                if len(ranked) < BEST or entry[:2] < ranked[-1][:2]:
                    bisect.insort(ranked, entry, key=lambda e: e[:2])
                    del ranked[BEST:]


class _View:
    """A study whose trials are ``trials`` (in number order); everything else is the study's."""

    def __init__(self, study, trials: list):
        self._study, self._trials = study, trials

    def __getattr__(self, name):
        return getattr(self._study, name)

    def _get_trials(self, deepcopy=False, states=None, use_cache=False):
        assert not deepcopy, "TPE reads its trials without copying them"
        return self._trials if states is None else [t for t in self._trials if t.state in states]
