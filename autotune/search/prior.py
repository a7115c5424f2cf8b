"""The cost model as the prior of a study (``search.sampler: auto``), and how sure it is.

Contract: a :class:`Prior` holds the cost model's estimate of every candidate of the space that
breaks no constraint and might fit in memory (a seeded sample of :data:`PRIOR_LIMIT` where the
space is larger) and answers :meth:`Prior.next`: the candidate to try next, given the
measurements so far, and whether every knob of it is fixed (a layout being explored) or the
sampler chooses the knobs the cost model does not estimate. It reads no storage and runs
nothing; the proposer (`autotune.search.proposer`) asks it and tells it every candidate proposed
and how each ended (:meth:`Prior.mark`), so nothing running or finished is proposed again.
`autotune.search.study_prior.prior_for` is the prior of a study's spec (None: not ``auto``, or
nothing to rank).

- Belief: the estimate of each candidate — priced as the program its trials run
  (`autotune.costmodel.estimate.default_engine`) — is corrected by what was measured,
  mechanism by mechanism, with an uncertainty that shrinks where measurements exercised the
  same mechanisms and layout and a scale of the model's error the measurements weigh
  (`autotune.search.belief`); memory likewise, runs out of memory included, as the probability
  that the candidate fits.
- Acquisition: the expected improvement of a candidate's noise-free log goodput over the
  incumbent's — the candidate measured (or running: believed at its expected value) with the
  best corrected goodput — judged on what the candidate is believed to differ from the
  incumbent by (`autotune.search.belief.Belief.predict_against`), times its probability of
  fitting: a variant the estimate says changes little is worth little, however unsure the
  incumbent's own value is. Candidates under :data:`FIT_AT_LEAST` likely to fit, estimated as
  large as one that ran out of memory, or — after a run out of memory — under :data:`LIKELY`
  likely to fit, are not proposed; nothing measured yet, the model's best candidate at least
  :data:`LIKELY` to fit goes first.
- No parallel split within what the model may be off by goes unmeasured: a layout is a (dp, tp,
  pp, micro-batch count) split, its (dp, tp, pp) its parallel split. The measurements show the
  model wrong by δ (`autotune.search.belief.Belief.miss`: how far apart the measured layouts'
  misses are, at least one run's noise); the candidates at least :data:`LIKELY` to fit of
  parallel splits that have not run are in the *band* where their corrected goodput is within
  :data:`BAND` × δ of the best measured, in the *wide band* within :data:`WIDE` × δ or
  :data:`UNMEASURED`, whichever is more. When the acquisition's choice merely polishes — a
  variant of a measured split (a fusion threshold, the parallel optimizer, an accumulation)
  estimated within one run's noise of one of that split's measured candidates
  (:meth:`Prior.polishes`) — a candidate of the wide band that uses a
  parallel mechanism no measured candidate uses (`autotune.search.acquisition.MECHANISMS`: data
  parallel alone, tp > 1 without pipeline stages, pp > 1 without tp, both, each recompute mode)
  runs instead, else the band's best. Such a first trial of a split fixes every knob, the ones
  the cost model does not estimate at the baseline's value.
- Trials running now (``pending``): a running layout's next variant waits while another layout
  may run, so k trial slots take k layouts.
- Several objectives the model estimates (goodput, peak memory): the proposer takes them in turn
  (:attr:`Prior.objectives`); by peak memory the prior ranks by the corrected memory estimate.
  ``final_loss`` is not estimated: a study with no estimated objective, or a model without
  dimensions, has no prior (`autotune.search.study_prior.usable`).
- `autotune.search.layouts` says, for every layout, whether it ran and, if not, why not.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from autotune import costmodel
from autotune.search.acquisition import (
    BAND,
    FIT_AT_LEAST,
    LIKELY,
    MECHANISMS,
    NOISE_AT_MOST,
    UNMEASURED,
    WIDE,
    before_the_choice,
    expected_gain,
    mechanisms_of,
)
from autotune.search.belief import PARTS, Belief, Row, memory_parts, position
from autotune.spec.backends import backend_of
from autotune.spec.knobs import KNOB_NAMES, KNOBS, micro_steps

PRIOR_LIMIT = 20_000  # candidates estimated at most (≈0.2 ms each)
ESTIMATED = ("goodput", "peak_memory")
MEMORY_REACH = 2.0  # candidates estimated up to this × the limit may still fit
NOT_RUN = ("infeasible",)


def raw_parts(estimate) -> np.ndarray:
    """The step-time parts of ``estimate`` before the study's calibration scaled them."""
    scale = estimate.calibration.time_factor if estimate.calibration else 1.0
    return np.array([estimate.breakdown["time_s"][k] / scale for k in PARTS])


def layout_of(candidate) -> tuple:
    """(dp, tp, pp, micro-batches per step) of ``candidate``."""
    split = micro_steps(
        pp=candidate.pp, micro_batches=candidate.micro_batches, grad_accum=candidate.grad_accum
    )
    return candidate.dp, candidate.tp, candidate.pp, split


class Prior:
    """The cost model's ranking of a space, corrected by measurements (see the module doc)."""

    def __init__(self, spec, space, seed: int | None = None, limit: int = PRIOR_LIMIT):
        self.spec, self.space = spec, space
        self.objectives = tuple(o for o in spec.search.objectives if o in ESTIMATED)
        self.estimated = backend_of(spec.cluster.backend).kind == "estimate"
        self.left_to_sampler = tuple(n for n in space.searched() if not KNOBS[n].estimable)
        self.base = space.baseline()
        self.projected = replace(
            space,
            domains={
                **space.domains,
                **{n: (getattr(self.base, n),) for n in self.left_to_sampler},
            },
        )
        self.limit_gb = (
            spec.cluster.max_device_memory_gb
            or costmodel.resolve_profile(spec.cluster).memory_gb * costmodel.SAFETY_MARGIN
        )
        self.candidates, self.index, self.layout_ids = [], {}, {}
        self.split_ids: dict = {}  # (dp, tp, pp) → its id
        self.mechanisms = [
            *MECHANISMS,
            *(f"recompute {m}" for m in self.projected.domains.get("recompute", ())),
        ]
        self._split, self._uses = [], []  # per candidate: its split's id, the mechanisms it uses
        rows = []
        for c in _candidates(self.projected, limit, seed):
            row = self._row(c)
            if row is not None and row.memory_gb <= MEMORY_REACH * self.limit_gb:
                rows.append(self._add(c, row))
        self.belief = Belief(rows, self.limit_gb)
        self.tried = np.zeros(len(self.candidates), dtype=bool)
        self.ran_layouts: dict = {}  # layout id → how many of its candidates ran
        self.ooms: set = set()
        self.pending_layouts: set = set()  # layouts of the candidates running now
        self.peaks = 0  # peaks measured so far
        self._fixed_values = None  # an estimate backend's (mean, sd): the belief never moves
        self._arrayed = None  # :meth:`_arrays`, kept until a candidate is added

    # -- the candidates --------------------------------------------------------------------

    def _row(self, candidate) -> Row | None:
        """The belief's row of ``candidate``; None if nothing can be estimated."""
        e = costmodel.estimate(self.spec, candidate)
        if not e.breakdown or not math.isfinite(e.step_time_s):
            return None
        dp, tp, pp, split = layout_of(candidate)
        return Row(
            raw_parts(e),
            memory_parts(e.breakdown["memory_gb"]),
            candidate.pp > 1,
            candidate.recompute != "none",
            layout=-1,  # given by :meth:`_add`
            position=position(tp, pp, self.spec.train.global_batch_size / (dp * split)),
        )

    def _add(self, candidate, row: Row) -> Row:
        """Hold ``candidate``: its index, its split's id and mechanisms, and its layout's id in
        its ``row``."""
        layout = self.layout_ids.setdefault(layout_of(candidate), len(self.layout_ids))
        split = layout_of(candidate)[:3]
        self._split.append(self.split_ids.setdefault(split, len(self.split_ids)))
        used = mechanisms_of(candidate)
        self._uses.append([m in used for m in self.mechanisms])
        self.index[candidate] = len(self.candidates)
        self.candidates.append(candidate)
        return replace(row, layout=layout)

    def split_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(each candidate's parallel split's id, candidates × the mechanisms each uses)."""
        if self._arrayed is None or len(self._arrayed[0]) != len(self._split):
            uses = np.array(self._uses, dtype=bool).reshape(-1, len(self.mechanisms))
            self._arrayed = np.array(self._split, dtype=int), uses
        return self._arrayed

    def _index_of(self, candidate) -> int | None:
        """Where ``candidate``'s projection is (added when it ran but was not held)."""
        c = self.project(candidate)
        if c in self.index:
            return self.index[c]
        row = self._row(c)
        if row is None:
            return None
        self.belief.add(self._add(c, row))  # its row, the last
        self.tried = np.append(self.tried, False)
        self._fixed_values = None
        return len(self.candidates) - 1

    def project(self, candidate):
        """``candidate`` with the knobs left to the sampler at the baseline's value."""
        return candidate.replace(**{n: self.projected.domains[n][0] for n in self.left_to_sampler})

    def mark(self, candidate, outcome: str | None = None) -> None:
        """``candidate`` was proposed (or ran before): never propose its projection again.
        ``outcome``: how its run ended, once it has (``oom`` bounds the memory belief; any run
        makes its layout one that ran)."""
        i = self._index_of(candidate)
        if i is None:
            return
        self.tried[i] = True
        if outcome == "oom":
            self.ooms.add(i)
        elif outcome is not None and outcome not in NOT_RUN:
            layout = int(self.belief.layout[i])
            self.ran_layouts[layout] = self.ran_layouts.get(layout, 0) + 1

    def params(self, candidate, fixed: bool = False) -> dict:
        """The params to enqueue for ``candidate``: all but the knobs left to the sampler
        (``fixed``: all)."""
        mine = (
            set()
            if fixed
            else {p.name for n, p in self.space.params.items() if n in self.left_to_sampler}
        )
        return {k: v for k, v in self.space.params_of(candidate).items() if k not in mine}

    # -- choosing --------------------------------------------------------------------------

    def _fit(self, measurements, pending=()) -> np.ndarray:
        """Refit the belief from ``measurements`` ``[(candidate, peak MB, step ms)]`` and the
        candidates running now (``pending``); returns the rows measured."""
        times, peaks = [], []
        for candidate, memory_mb, step_ms in measurements:
            i = self._index_of(candidate)
            if i is None:
                continue
            if step_ms:
                times.append((i, step_ms / 1000))
            if memory_mb:
                peaks.append((i, memory_mb / 1024))
        waiting = [i for i in map(self._index_of, pending) if i is not None]
        self.belief.fit(times, peaks, sorted(self.ooms), waiting)
        self.peaks = len(peaks)
        self.pending_layouts = {int(self.belief.layout[i]) for i in waiting}
        # the running ones count as measured at what the belief expects (the believer)
        return np.array(sorted({i for i, _ in times} | set(waiting)), dtype=int)

    def next(self, measurements, objective: str | None = None, pending=()):
        """``(candidate, fixed)``: the candidate to try next by ``objective`` (default: the
        first the model estimates) and whether all its knobs are fixed; None when every
        candidate that may fit was tried (see the module doc). ``pending``: candidates running
        now, whose outcome is not known yet."""
        measured, fits, open_ = self.open_candidates(measurements, pending)
        if not open_.any():
            return None
        likely = open_ & (fits >= LIKELY)
        if not self.peaks and likely.any():  # no peak yet says how far to trust the memory model
            open_ = likely
        # a running layout's next variant waits for its outcome while another layout as likely
        # to fit may run
        elsewhere = likely & ~np.isin(self.belief.layout, list(self.pending_layouts))
        open_ = elsewhere if elsewhere.any() else open_
        if (objective or self.objectives[0]) == "peak_memory":
            memory = self.belief.memory_mean()
            return self.candidates[int(np.argmax(np.where(open_, -memory, -np.inf)))], False
        gain, sd = self.values()
        if self.estimated:  # the estimate is the trial: nothing to learn, nothing to explore
            return self.candidates[int(np.argmax(np.where(open_, gain, -np.inf)))], False
        if not len(measured):  # nothing measured: the model's best of those likely to fit
            likely &= open_
            if likely.any():
                return self.candidates[int(np.argmax(np.where(likely, gain, -np.inf)))], True
        best = float(gain[measured].max()) if len(measured) else -math.inf
        score = np.where(open_, self._improvement(gain, sd, measured) * fits, -np.inf)
        choice = int(np.argmax(score))
        band, wide = self.bands(gain, best, open_ & (fits >= LIKELY))
        _, uses = self.split_arrays()
        polishing = self.polishes(choice, gain, measured)
        first = before_the_choice(score, band, wide, uses, measured, polishing)
        if first is not None:
            return self.candidates[first], True
        return self.candidates[choice], not self._ran(choice)

    def _improvement(self, gain: np.ndarray, sd: np.ndarray, measured: np.ndarray):
        """Each candidate's expected improvement over the best measured one (the incumbent, by
        corrected goodput), judged on what it is believed to differ from the incumbent by — so a
        variant the estimate says changes little is worth little, however uncertain both are."""
        if not len(measured):
            return expected_gain(gain, sd, -math.inf)
        incumbent = int(measured[np.argmax(gain[measured])])
        slower, var = self.belief.predict_against(incumbent)
        return expected_gain(-slower, np.sqrt(var), 0.0)

    def bands(self, gain: np.ndarray, best: float, may: np.ndarray) -> tuple:
        """(the band, the wide band): the candidates of ``may`` of parallel splits that have
        not run whose corrected goodput ``gain`` is within :meth:`widths` of ``best``."""
        split, _ = self.split_arrays()
        fresh = may & ~np.isin(split, self.ran_splits())
        band, wide = self.widths()
        return fresh & (gain >= best - band), fresh & (gain >= best - wide)

    def widths(self) -> tuple[float, float]:
        """The bands' widths in log goodput: :data:`BAND` × the model's demonstrated error
        (`Belief.miss`), and :data:`WIDE` × that error or :data:`UNMEASURED`, whichever is
        more."""
        miss = self.belief.miss()
        return BAND * miss, max(WIDE * miss, UNMEASURED)

    def polishes(self, row: int, gain: np.ndarray, measured: np.ndarray) -> bool:
        """Whether candidate ``row`` is a variant of a parallel split measured (or running)
        whose corrected goodput ``gain`` is within one run's noise (the belief's, at most
        :data:`NOISE_AT_MOST`) of one of that split's measured candidates: a fusion threshold,
        the parallel optimizer, an accumulation that changes little."""
        split, _ = self.split_arrays()
        same = measured[split[measured] == split[row]]
        noise = min(self.belief.step.noise_sd(), NOISE_AT_MOST)
        return bool(len(same)) and float(np.abs(gain[same] - gain[row]).min()) < noise

    def _ran(self, row: int) -> bool:
        """Whether row ``row``'s layout ran or is running."""
        layout = int(self.belief.layout[row])
        return layout in self.ran_layouts or layout in self.pending_layouts

    def ran_splits(self) -> list:
        """The ids of the parallel splits that ran or are running."""
        split, _ = self.split_arrays()
        layouts = [*self.ran_layouts, *self.pending_layouts]
        return sorted({int(s) for s in split[np.isin(self.belief.layout, layouts)]})

    def open_candidates(self, measurements, pending=()):
        """(the rows measured, each candidate's probability to fit, which may be proposed)
        after refitting the belief: not tried, not as large as one that ran out of memory, and
        likely enough to fit — at least :data:`FIT_AT_LEAST`; after n runs out of memory at
        least 1 − (1 − :data:`LIKELY`)ⁿ, or the likeliest to fit there is when none is that
        likely (a peak to learn from, not the end of the prior)."""
        if self.estimated:
            fits = (self.belief.memory_gb <= self.limit_gb).astype(float)
            self.pending_layouts, self.peaks = set(), 0
            return np.zeros(0, dtype=int), fits, ~self.tried & (fits > 0)
        measured = self._fit(measurements, pending)
        fits = self.belief.fit_probability()
        left = ~self.tried & ~self.belief.closed() & (fits >= FIT_AT_LEAST)
        if self.ooms and left.any():  # each run out of memory halves the risk the next takes
            floor = min(1 - (1 - LIKELY) ** len(self.ooms), float(fits[left].max()))
            left &= fits >= floor
        return measured, fits, left

    def values(self):
        """(mean, sd) of each candidate's noise-free log goodput — once on an estimate backend,
        whose belief nothing measured moves (15,000 candidates: 0.15 s a prediction)."""
        if self._fixed_values is not None:
            return self._fixed_values
        mean, var = self.belief.predict()
        values = math.log(self.spec.train.global_batch_size) - mean, np.sqrt(var)
        if self.estimated:
            self._fixed_values = values
        return values


def _candidates(space, limit: int, seed: int | None) -> list:
    """Every distinct candidate of ``space``, or ``limit`` of them drawn at random (seeded)
    when the space has more."""
    if math.prod(len(space.domains[n]) for n in KNOB_NAMES) <= 2 * limit:
        everything = list(space.candidates())
        if len(everything) <= limit:
            return everything
        return random.Random(seed).sample(everything, limit)
    rng, drawn = random.Random(seed), {}
    for _ in range(20 * limit):  # distinct draws get rare only in spaces far larger than limit
        if len(drawn) == limit:
            break
        drawn.setdefault(space._resolve({n: rng.choice(space.domains[n]) for n in KNOB_NAMES}))
    return list(drawn)
