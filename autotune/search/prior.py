"""The cost model as the prior of a study (``search.sampler: auto``), and how sure it is.

Contract: a :class:`Prior` holds the cost model's estimate of every candidate of the space that
breaks no constraint and might fit in memory (a seeded sample of :data:`PRIOR_LIMIT` where the
space is larger) and answers :meth:`Prior.next`: the candidate to try next, given the
measurements so far, and whether every knob of it is fixed (a layout being explored) or the
sampler chooses the knobs the cost model does not estimate. It reads no storage and runs
nothing; the proposer (`autotune.search.proposer`) asks it and tells it every candidate proposed
and how each ended (:meth:`Prior.mark`), so nothing running or finished is proposed again.
:func:`prior_for` is the prior of a study's spec (None: not ``auto``, or nothing to rank).

- Belief: the estimate of each candidate — priced as the program its trials run
  (`autotune.costmodel.estimate.default_engine`) — is corrected by what was measured,
  mechanism by mechanism, with an uncertainty that shrinks where measurements exercised the
  same mechanisms and layout and a scale of the model's error the measurements weigh
  (`autotune.search.belief`); memory likewise, runs out of memory included, as the probability
  that the candidate fits.
- Acquisition: expected improvement of the noise-free log goodput over the best corrected
  goodput of the candidates measured (or running: believed at their expected value), times the
  probability of fitting. Candidates under :data:`FIT_AT_LEAST` likely to fit, estimated as
  large as one that ran out of memory, or — after a run out of memory — under :data:`LIKELY`
  likely to fit, are not proposed; nothing measured yet, the model's best candidate at least
  :data:`LIKELY` to fit goes first.
- Layouts first where a mechanism is mispriced (the belief's error scale at least
  :data:`MISPRICED_SCALE`): a layout is a (dp, tp, pp, micro-batch count) split. While some
  layout that has not run, at least :data:`LIKELY` to fit, has an optimistic value
  (:data:`OPTIMISM` standard deviations above its mean) better than the best measured, the
  next candidate is such a layout's, with the knobs the cost model does not estimate at the
  baseline's value; a layout's third variant only when no layout that has not run could do
  better than it. Where the measurements agree with the model the acquisition alone chooses.
- Trials running now (``pending``): a running layout's next variant waits while another layout
  may run, so k trial slots take k layouts.
- Several objectives the model estimates (goodput, peak memory): the proposer takes them in turn
  (:attr:`Prior.objectives`); by peak memory the prior ranks by the corrected memory estimate.
  ``final_loss`` is not estimated: a study with no estimated objective, or a model without
  dimensions, has no prior (:func:`usable`).
- :meth:`Prior.layouts` says, for every layout, whether it ran and, if not, why not.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from autotune import costmodel
from autotune.costmodel.estimate import default_engine
from autotune.costmodel.workload import workload_for
from autotune.search.belief import PARTS, Belief, Row, memory_parts
from autotune.search.factors import normal_cdf
from autotune.spec.backends import backend_of
from autotune.spec.knobs import KNOB_NAMES, KNOBS, micro_steps

PRIOR_LIMIT = 20_000  # candidates estimated at most (≈0.2 ms each)
ESTIMATED = ("goodput", "peak_memory")
# OPTIMISM, LIKELY and MISPRICED_SCALE were chosen on benchmarks/search_efficiency.py --structures
# tune (other truth structures, seeds 100-109), reported on --structures report (docs/search.md).
OPTIMISM = 0.5  # standard deviations above the mean a layout's optimistic value is taken
MEMORY_REACH = 2.0  # candidates estimated up to this × the limit may still fit
FIT_AT_LEAST = 0.05  # a candidate less likely than this to fit is not proposed
LIKELY = 0.5  # after a run out of memory, only candidates likelier than this to fit run
# The belief's error scale below which the measurements are taken to confirm the model: the
# acquisition alone chooses, no layout is opened for its optimism (docs/search.md).
MISPRICED_SCALE = 0.5
NOT_RUN = ("infeasible",)


def usable(spec) -> bool:
    """Whether the cost model can rank this study's candidates (see the module doc)."""
    return (
        any(o in ESTIMATED for o in spec.search.objectives) and workload_for(spec.model) is not None
    )


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

    # -- the candidates --------------------------------------------------------------------

    def _row(self, candidate) -> Row | None:
        """The belief's row of ``candidate``; None if nothing can be estimated."""
        e = costmodel.estimate(self.spec, candidate)
        if not e.breakdown or not math.isfinite(e.step_time_s):
            return None
        return Row(
            raw_parts(e),
            memory_parts(e.breakdown["memory_gb"]),
            candidate.pp > 1,
            candidate.recompute != "none",
            layout=-1,  # given by :meth:`_add`
        )

    def _add(self, candidate, row: Row) -> Row:
        """Hold ``candidate``: its index, and its layout's id in its ``row``."""
        layout = self.layout_ids.setdefault(layout_of(candidate), len(self.layout_ids))
        self.index[candidate] = len(self.candidates)
        self.candidates.append(candidate)
        return replace(row, layout=layout)

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
        measured, fits, open_ = self._open(measurements, pending)
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
        gain, sd = self._values()
        if self.estimated:  # the estimate is the trial: nothing to learn, nothing to explore
            return self.candidates[int(np.argmax(np.where(open_, gain, -np.inf)))], False
        if not len(measured):  # nothing measured: the model's best of those likely to fit
            likely &= open_
            if likely.any():
                return self.candidates[int(np.argmax(np.where(likely, gain, -np.inf)))], True
        best = float(gain[measured].max()) if len(measured) else -math.inf
        score = np.where(open_, _expected_gain(gain, sd, best) * fits, -np.inf)
        choice = int(np.argmax(score))
        if self.belief.step.scale() < MISPRICED_SCALE:  # the measurements confirm the model
            return self.candidates[choice], not self._ran(choice)
        optimistic = gain + OPTIMISM * sd
        unexplored = open_ & self._unexplored() & (fits >= LIKELY)
        fresh = unexplored & (optimistic > best)
        if not fresh.any():  # else a layout that could beat the best measured runs first
            if self.ran_layouts.get(int(self.belief.layout[choice]), 0) < 2:
                return self.candidates[choice], False
            # a third variant of a layout waits for the layouts that could do better than it
            fresh = unexplored & (optimistic > optimistic[choice])
            if not fresh.any():
                return self.candidates[choice], False
        return self.candidates[int(np.argmax(np.where(fresh, score, -np.inf)))], True

    def _ran(self, row: int) -> bool:
        """Whether row ``row``'s layout ran or is running."""
        layout = int(self.belief.layout[row])
        return layout in self.ran_layouts or layout in self.pending_layouts

    def _open(self, measurements, pending=()):
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

    def _values(self):
        """(mean, sd) of each candidate's noise-free log goodput — once on an estimate backend,
        whose belief nothing measured moves (15,000 candidates: 0.15 s a prediction)."""
        if self._fixed_values is not None:
            return self._fixed_values
        mean, var = self.belief.predict()
        values = math.log(self.spec.train.global_batch_size) - mean, np.sqrt(var)
        if self.estimated:
            self._fixed_values = values
        return values

    def _unexplored(self) -> np.ndarray:
        """Candidates of layouts that never ran and are not running."""
        return ~np.isin(self.belief.layout, [*self.ran_layouts, *self.pending_layouts])

    def promising(self) -> int:
        """How many layouts could beat the best estimate before anything is measured: their
        optimistic value, relative to the best mean (the common factor left out), above it."""
        fits = self.belief.fit_probability() >= FIT_AT_LEAST
        mean, var = self.belief.predict(common=False)
        gain = np.where(fits, -mean, -np.inf)
        if not np.isfinite(gain).any():
            return 0
        ahead = gain + OPTIMISM * np.sqrt(var) >= gain.max()
        return len(set(self.belief.layout[ahead & fits].tolist()))

    def layouts(self, measurements, remaining: int | None = None) -> list[dict]:
        """Every layout: ``{"layout": "dp·tp·pp·m", "ran": runs}``, and for one that did not
        run ``"why"`` not, as the prior sees it now, and ``"reach"``, its optimistic goodput
        (None: nothing of it may fit); ``remaining``: trials left."""
        measured, fits, open_ = self._open(measurements)
        gain, sd = self._values()
        best = float(gain[measured].max()) if len(measured) else -math.inf
        optimistic = gain + OPTIMISM * sd
        out = []
        for key, layout in sorted(self.layout_ids.items()):
            rows = self.belief.layout == layout
            entry = {
                "layout": "dp{}·tp{}·pp{}·m{}".format(*key),
                "ran": self.ran_layouts.get(layout, 0),
            }
            if not entry["ran"]:
                entry["why"] = self._why_not(rows, fits, open_, gain, optimistic, best, remaining)
                entry["reach"] = (
                    float(np.exp(optimistic[rows & open_].max())) if (rows & open_).any() else None
                )
            out.append(entry)
        return out

    def _why_not(self, rows, fits, open_, gain, optimistic, best, remaining) -> str:
        """Why the layout of candidates ``rows`` has not run."""
        if not (rows & open_).any():
            if any(self.belief.layout[i] == self.belief.layout[rows][0] for i in self.ooms):
                return "ran out of memory"
            if (rows & ~self.tried & self.belief.closed()).any():
                return "estimated at least as large as a candidate that ran out of memory"
            smallest = float(self.belief.memory_gb[rows].min())
            return (
                f"predicted out of memory: {smallest:.3g} GB estimated against "
                f"{self.limit_gb:.3g} GB, fits with p = {float(fits[rows].max()):.2g}"
            )
        if self.estimated:
            return (
                f"its best estimate, {math.exp(float(gain[rows & open_].max())):.4g} "
                "samples/s, ranked below the candidates that ran"
            )
        value = float(optimistic[rows & open_].max())
        if value <= best:
            return (
                f"at best {math.exp(value):.4g} samples/s (mean + {OPTIMISM:g} sd), below "
                f"the best measured candidate's {math.exp(best):.4g}"
            )
        reach = (
            f"could reach {math.exp(value):.4g} samples/s (mean "
            f"{math.exp(float(gain[rows & open_].max())):.4g})"
        )
        return reach + (": no trials left" if remaining == 0 else ": not measured yet")


def _expected_gain(mean, sd, best: float) -> np.ndarray:
    """Expected improvement of a normal (mean, sd) over ``best`` (the mean when -inf)."""
    if not math.isfinite(best):  # nothing measured: the expected goodput, relative
        return np.exp(mean - mean.max())
    z = (mean - best) / sd
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return sd * (z * normal_cdf(z) + pdf) + 1e-12


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


def prior_for(spec, space, note, n_trials: int | None = None) -> Prior | None:
    """The prior of an ``auto`` study, when the cost model can rank its candidates; ``note``
    (a callable taking one line) hears why not, or what it ranked, and — given ``n_trials`` —
    when the study is too short to measure every layout that could be the best."""
    if spec.search.sampler != "auto":
        return None
    if not usable(spec):
        note(
            f"auto: the cost model cannot rank by {', '.join(spec.search.objectives)} "
            "for this model: TPE after the baseline and the layout openers"
        )
        return None
    prior = Prior(spec, space, spec.search.seed)
    if not prior.candidates:  # then the baseline and the layout openers say why, recorded
        note(
            "auto: the cost model predicts no candidate fits: the baseline and one "
            "trial per layout run as with any sampler"
        )
        return None
    promising = prior.promising()
    note(
        f"auto: the cost model ranks {len(prior.candidates)} candidates in "
        f"{len(prior.layout_ids)} layouts ({default_engine(spec)}'s steps); the baseline "
        "runs first, then the candidates likeliest to improve on the best measured one, by "
        "the estimate corrected by every measurement — first each layout that could beat it, "
        "where the measurements say a mechanism is mispriced"
    )
    if n_trials is not None and promising > n_trials - 1:
        note(
            f"auto: {promising} layouts could be the best before anything is measured, and "
            f"{n_trials - 1} trials follow the baseline: the rest are judged by what the "
            "measured ones teach about their mechanisms (autotune show lists them)"
        )
    return prior
