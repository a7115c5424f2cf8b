"""The cost model as the prior of a study (``search.sampler: auto``).

Contract: a :class:`Prior` holds the cost model's estimate of every feasible candidate of the
space (a seeded sample of :data:`PRIOR_LIMIT` where the space is larger) and answers
:meth:`Prior.next`: the candidate to try next, given the measurements so far. It reads no
storage and runs nothing; the proposer (`autotune.search.proposer`) asks it, and tells it every
candidate proposed (:meth:`Prior.mark`), so nothing running or finished is proposed again.
:func:`prior_for` is the prior of a study's spec (None: not ``auto``, or nothing to rank).

- The ranking is by an objective the model estimates: goodput (samples/s of the estimated step
  time, corrected as below) or peak memory (the estimate × the study's memory calibration).
  With several such objectives the proposer takes them in turn (:attr:`Prior.objectives`);
  ``final_loss`` is not estimated (its knobs are the sampler's, below), and a study with no
  estimated objective, or a model without dimensions, has no prior (:func:`usable`).
- Correction: the measured step times refit one factor per part of the estimated step
  (compute, recompute, tp/pp/dp communication, bubble, optimizer, host) by ridge regression
  toward the median measured/estimated ratio (:func:`fit_parts`), so a measured layout moves
  the estimates of its kind: the cost model's constants are what is wrong, part by part.
  Candidates predicted out of memory under the study's memory calibration are skipped.
- Order: first the best candidate of each (dp, tp, pp) layout not measured yet whose best
  estimate is within :data:`OPENER_RATIO` of the best overall (best layout first), then the
  best candidate not tried, re-ranked after every measurement.
- Knobs the cost model does not estimate (`autotune.spec.knobs.Knob.estimable`: loss scale, warmup,
  jit level) are not the prior's: candidates are ranked at the baseline's value of them, and
  the sampler chooses them (:attr:`Prior.left_to_sampler`).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from autotune import costmodel
from autotune.costmodel.workload import workload_for
from autotune.spec.knobs import KNOB_NAMES, KNOBS

PRIOR_LIMIT = 20_000  # candidates estimated at most (≈0.2 ms each)
PARTS = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer", "host")
# A layout whose best estimate is within this of the best is measured early: closer than the
# model's error between layouts can tell apart. Chosen on benchmarks/search_efficiency.py's
# seeds 100-109 (0.8, 0.9, 0.95 and 1.01, i.e. none, all reached 0.97 within 15 runs; the
# closer, the fewer runs there) and kept below 0.95 for truths further from the model than that
# benchmark's; docs/search.md has its table.
OPENER_RATIO = 0.9
RIDGE = 0.5  # how strongly part factors stay at the common ratio (0.02 to 2: same benchmark)
FACTOR_RANGE = (0.25, 4.0)  # a part's correction stays within this × the common ratio


ESTIMATED = ("goodput", "peak_memory")


def usable(spec) -> bool:
    """Whether the cost model can rank this study's candidates (see the module doc)."""
    return (any(o in ESTIMATED for o in spec.search.objectives)
            and workload_for(spec.model) is not None)


def fit_parts(rows, ridge: float = RIDGE) -> np.ndarray:
    """One factor per :data:`PARTS` from ``[(raw parts vector, measured step seconds), ...]``:
    ``measured ≈ Σ factor_k · part_k``, each factor ``g·(1 + δ_k)`` with ``g`` the median
    measured/estimated ratio and the δ fitted by least squares on relative errors plus
    ``ridge·Σδ²``. No rows: all ones."""
    rows = [(p, m) for p, m in rows if m > 0 and p.sum() > 0]
    if not rows:
        return np.ones(len(PARTS))
    parts = np.array([p for p, _ in rows])
    measured = np.array([m for _, m in rows])
    common = float(np.median(measured / parts.sum(axis=1)))
    relative = common * parts / measured[:, None]
    residual = relative.sum(axis=1) - 1.0
    delta = -np.linalg.solve(relative.T @ relative + ridge * np.eye(len(PARTS)),
                             relative.T @ residual)
    return common * np.clip(1.0 + delta, *FACTOR_RANGE)


def raw_parts(estimate) -> np.ndarray:
    """The step-time parts of ``estimate`` before the study's calibration scaled them."""
    scale = estimate.calibration.time_factor if estimate.calibration else 1.0
    return np.array([estimate.breakdown["time_s"][k] / scale for k in PARTS])


class Prior:
    """The cost model's ranking of a space (see the module doc)."""

    def __init__(self, spec, space, seed: int | None = None, limit: int = PRIOR_LIMIT):
        self.spec, self.space = spec, space
        self.objectives = tuple(o for o in spec.search.objectives if o in ESTIMATED)
        self.left_to_sampler = tuple(n for n in space.searched() if not KNOBS[n].estimable)
        base = space.baseline()
        self.projected = replace(space, domains={**space.domains, **{
            n: (getattr(base, n),) for n in self.left_to_sampler}})
        estimates = [(c, costmodel.estimate(spec, c))
                     for c in _candidates(self.projected, limit, seed)]
        kept = [(c, e) for c, e in estimates
                if e.feasible and e.breakdown and math.isfinite(e.step_time_s)]
        self.candidates = [c for c, _ in kept]
        self.index = {c: i for i, c in enumerate(self.candidates)}
        self.parts = np.array([raw_parts(e) for _, e in kept]).reshape(len(kept), len(PARTS))
        self.memory = np.array([e.memory_gb_per_device for _, e in kept])
        layouts = [(c.dp, c.tp, c.pp) for c in self.candidates]
        self.layout_ids = {layout: i for i, layout in enumerate(dict.fromkeys(layouts))}
        self.layout = np.array([self.layout_ids[layout] for layout in layouts], dtype=int)
        self.tried = np.zeros(len(self.candidates), dtype=bool)
        self.limit_gb = costmodel.resolve_profile(spec.cluster).memory_gb * costmodel.SAFETY_MARGIN

    def project(self, candidate):
        """``candidate`` with the knobs left to the sampler at the baseline's value."""
        return replace(candidate, **{n: self.projected.domains[n][0] for n in self.left_to_sampler})

    def mark(self, candidate) -> None:
        """``candidate`` was proposed (or ran before): never propose its projection again."""
        i = self.index.get(self.project(candidate))
        if i is not None:
            self.tried[i] = True

    def params(self, candidate) -> dict:
        """The params to enqueue for ``candidate``: all but the knobs left to the sampler."""
        mine = {p.name for n, p in self.space.params.items() if n in self.left_to_sampler}
        return {k: v for k, v in self.space.params_of(candidate).items() if k not in mine}

    def scores(self, measurements, calibration=None, objective: str = "goodput") -> np.ndarray:
        """The corrected estimate of each candidate by ``objective``, higher is better; -inf
        where predicted out of memory under ``calibration``. ``measurements``: ``[(estimate,
        peak MB, step ms)]`` of the study's measured trials."""
        memory = self.memory * (calibration.memory_factor if calibration else 1.0)
        if objective == "peak_memory":
            score = 1.0 / memory
        else:
            factors = fit_parts([(raw_parts(e), ms / 1000) for e, _, ms in measurements
                                 if e.breakdown and ms is not None])
            score = self.spec.train.global_batch_size / (self.parts @ factors)
        return np.where(memory > self.limit_gb, -np.inf, score)

    def next(self, measurements, calibration=None, objective: str | None = None):
        """The candidate to try next by ``objective`` (default: the first the model estimates;
        see the module doc), or None when every feasible one was tried."""
        score = self.scores(measurements, calibration, objective or self.objectives[0])
        open_ = ~self.tried & np.isfinite(score)
        if not open_.any():
            return None
        measured = np.unique(self.layout[self.tried])
        fresh = open_ & ~np.isin(self.layout, measured)
        best = score[np.isfinite(score)].max()
        if fresh.any() and score[fresh].max() >= OPENER_RATIO * best:
            return self.candidates[int(np.argmax(np.where(fresh, score, -np.inf)))]
        return self.candidates[int(np.argmax(np.where(open_, score, -np.inf)))]


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


def prior_for(spec, space, note) -> Prior | None:
    """The prior of an ``auto`` study, when the cost model can rank its candidates; ``note``
    (a callable taking one line) hears why not, or what it ranked."""
    if spec.search.sampler != "auto":
        return None
    if not usable(spec):
        note(f"auto: the cost model cannot rank by {', '.join(spec.search.objectives)} "
             "for this model: TPE after the baseline and the layout openers")
        return None
    prior = Prior(spec, space, spec.search.seed)
    if not prior.candidates:  # then the baseline and the layout openers say why, recorded
        note("auto: the cost model predicts no candidate fits: the baseline and one "
             "trial per layout run as with any sampler")
        return None
    note(f"auto: the cost model ranks {len(prior.candidates)} feasible candidates; the "
         "baseline runs first, then the best of each promising layout, then the best "
         "under the estimate corrected by every measurement")
    return prior
