"""How far the cost model may be off for a study's candidates — step time and peak memory —
given what was measured.

Contract: a :class:`Belief` is built from :class:`Row`\\ s — the cost model's raw (uncalibrated)
step-time parts (:data:`PARTS`) and memory parts (:data:`MEMORY_PARTS`) of each candidate,
whether it is pipelined and recomputes, its layout id and the layout's position (log2 of its
tp, pp and samples per micro-batch: :func:`position`) — and the memory limit. :meth:`Belief.fit`
takes the study's measurements: ``[(row, measured step seconds)]``, ``[(row, measured peak
GiB)]``, the rows that ran out of memory, and the rows running now (``pending``: believed to
measure what the belief expects, so the next proposal looks elsewhere). Then
:meth:`Belief.predict` gives every candidate's noise-free log step time (mean, variance),
:meth:`Belief.fit_probability` the probability that it
fits the limit, and :meth:`Belief.closed` which candidates are estimated at least as large as
one that ran out. It reads no storage and chooses nothing: the prior
(`autotune.search.prior`) does.

The two models are `autotune.search.factors` posteriors (docs/search.md, "How sure the prior
is"): each part of the estimate is priced by mechanisms whose factors the measurements correct,
one effect per layout shared by its variants, and a scale of the model's error that the
measurements themselves weigh. An out-of-memory run is a censored observation of its peak (above
the limit), exactly as an ok run's peak is an observation: the factors, and every candidate's
probability to fit, move with it; measurements that disagree widen the belief instead of
closing every candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autotune.costmodel.moe_time import MOE_PARTS
from autotune.search.factors import FactorPosterior, Shape

# every part of the estimate's step time: the dense model's, then those experts, latent
# attention, MTP modules and expert and context parallelism add (`autotune.costmodel.moe_time`;
# zero for a model or layout without them, so they leave a dense study's belief as it was)
PARTS = (
    "compute",
    "recompute",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "bubble",
    "optimizer",
    "host",
    *MOE_PARTS,
)
MEMORY_PARTS = ("states", "activations", "overhead")
# where each of the estimate's memory parts goes
MEMORY_OF = {
    "params": "states",
    "grads": "states",
    "accumulators": "states",
    "optimizer_states": "states",
    "activations": "activations",
    "overhead": "overhead",
}
# Sizes in log space. The scales multiply the mechanism and layout sizes and are weighed by the
# measurements (a hyperprior): chosen on benchmarks/search_efficiency.py's tuning structures,
# reported on others (docs/search.md, "How sure the prior is").
LAYOUT_SD = 0.3  # a layout's whole step off by what no mechanism explains: 35 % at scale 1
LAYOUT_SHARED = 0.5  # the share of it that the layouts near it share
# how far apart two layouts are alike: per doubling of tp, of pp, of the samples a micro-batch holds
LAYOUT_LENGTHS = (1.5, 1.5, 2.0)
STEP = Shape(
    parts=PARTS,
    mechanisms={
        "compute": ("compute",),
        "recompute": ("recompute",),
        "tp": ("tp_comm",),
        # on pipelined candidates only: their stage compute, bubble and transfers
        "pipeline": ("compute", "recompute", "bubble", "pp_comm", "experts", "mla", "mtp"),
        "dp": ("dp_comm",),
        "optimizer": ("optimizer",),
        "host": ("host",),
        # a mixture of experts' and latent attention's own mechanisms, each mispriced alone
        "experts": ("experts",),
        "imbalance": ("imbalance",),  # a stated factor, unmeasured: its own doubt
        "mla": ("mla",),
        "mtp": ("mtp",),
        "ep": ("ep_comm",),
        "ep across nodes": ("ep_comm_inter",),
        "cp": ("cp_comm",),
    },
    conditional=("pipeline",),
    # the pool against its device profile, which is fitted (the 910B's the A100's, unmeasured on
    # Ascend): ±35 % is 1 σ. A miss on one layout is then more its own and its mechanisms' than
    # every candidate's (docs/search.md, "How sure the prior is").
    sigma_common=0.3,
    sigma_mechanism=0.35,  # one mechanism mispriced: 0.6× or 1.6× is 1.4 σ at scale 1
    sigma_layout=LAYOUT_SD,  # what a layout does that no mechanism explains
    scales=(0.125, 0.25, 0.5, 1.0, 2.0),
    noises=(0.02, 0.05, 0.1, 0.2),  # one measurement against its candidate's value
    layout_correlation=LAYOUT_SHARED,
    layout_lengths=LAYOUT_LENGTHS,
)
MEMORY = Shape(
    parts=MEMORY_PARTS,
    mechanisms={
        "states": ("states",),  # parameters, gradients, accumulators, optimizer states
        "activations": ("activations",),
        "pipeline": ("activations",),  # what stages retain, on pipelined candidates
        "recompute": ("activations",),  # what recompute keeps, on candidates that recompute
        "overhead": ("overhead",),
    },
    conditional=("pipeline", "recompute"),
    sigma_common=0.15,
    sigma_mechanism=0.2,
    sigma_layout=0.05,
    scales=(0.125, 0.25, 0.5, 1.0, 2.0),
    noises=(0.005, 0.02, 0.05),  # one measured peak against its candidate's
)
STEP_CONDITIONAL = [m in STEP.conditional for m in STEP.mechanisms]


@dataclass(frozen=True)
class Row:
    """One candidate as the belief sees it."""

    time_parts: np.ndarray  # PARTS, seconds
    memory_parts: np.ndarray  # MEMORY_PARTS, GiB
    pipelined: bool
    recomputes: bool
    layout: int
    position: tuple = (0.0, 0.0, 0.0)  # its layout's: :func:`position`

    @property
    def memory_gb(self) -> float:
        return float(self.memory_parts.sum())


def position(tp: int, pp: int, micro_batch_samples: float) -> tuple:
    """Where a layout sits among the others, for how alike two layouts are: log2 of its tp, its
    pp and the samples one micro-batch holds."""
    return math.log2(tp), math.log2(pp), math.log2(micro_batch_samples)


def memory_parts(breakdown: dict) -> np.ndarray:
    """:data:`MEMORY_PARTS` of an estimate's ``breakdown["memory_gb"]``."""
    out = dict.fromkeys(MEMORY_PARTS, 0.0)
    for name, gb in breakdown.items():
        out[MEMORY_OF[name]] += gb
    return np.array([max(out[p], 0.0) for p in MEMORY_PARTS])


class Belief:
    """The posterior over the cost model's errors for a study's candidates (see the module
    doc)."""

    def __init__(self, rows: list[Row], limit_gb: float):
        self.limit_gb = limit_gb
        self.log_limit = math.log(limit_gb)
        self.layout = np.array([r.layout for r in rows], dtype=int)
        self.memory_gb = np.array([r.memory_gb for r in rows])
        self.step = FactorPosterior(
            STEP,
            np.array([r.time_parts for r in rows]).reshape(len(rows), len(PARTS)),
            np.array([self._step_flags(r) for r in rows]).reshape(len(rows), len(STEP.mechanisms)),
            self.layout,
            [r.position for r in rows],
        )
        self.memory = FactorPosterior(
            MEMORY,
            np.array([r.memory_parts for r in rows]).reshape(len(rows), len(MEMORY_PARTS)),
            np.array([self._memory_flags(r) for r in rows]).reshape(
                len(rows), len(MEMORY.mechanisms)
            ),
            self.layout,
        )
        self.ooms: list[int] = []
        self.misses: dict = {}

    @staticmethod
    def _step_flags(row: Row) -> list[bool]:
        return [row.pipelined if c else True for c in STEP_CONDITIONAL]

    @staticmethod
    def _memory_flags(row: Row) -> list[bool]:
        flag = {"pipeline": row.pipelined, "recompute": row.recomputes}
        return [flag.get(m, True) for m in MEMORY.mechanisms]

    def add(self, row: Row) -> None:
        """One more candidate, the last row; the next :meth:`fit` takes it in."""
        self.layout = np.append(self.layout, row.layout)
        self.memory_gb = np.append(self.memory_gb, row.memory_gb)
        self.step.add(row.time_parts, self._step_flags(row), row.layout, row.position)
        self.memory.add(row.memory_parts, self._memory_flags(row), row.layout)

    def fit(self, times: list, peaks: list, ooms=(), pending=()) -> None:
        """The posterior given ``times`` ``[(row, seconds)]``, ``peaks`` ``[(row, GiB)]``,
        ``ooms`` (rows that ran out of memory) and ``pending`` (rows running now: taken to
        measure what the belief expects of them)."""
        exact = [(i, math.log(s)) for i, s in times if s and s > 0]
        self.misses = {}  # layout → the log ratios of its measured steps to their estimates
        for i, y in exact:
            layout = int(self.layout[i])
            self.misses.setdefault(layout, []).append(y - math.log(self.step.parts[i].sum()))
        self.step.fit(exact)
        measured = {i for i, _ in exact}
        waiting = sorted({int(i) for i in pending} - measured)
        if waiting:  # the believer: the running ones measure their expected value
            expected, _ = self.step.predict(np.array(waiting))
            self.step.fit(exact + list(zip(waiting, expected.tolist())))
        self.ooms = sorted({int(i) for i in ooms})
        self.memory.fit(
            [(i, math.log(gb)) for i, gb in peaks if gb and gb > 0],
            [(i, self.log_limit) for i in self.ooms],
        )

    def miss(self) -> float:
        """How wrong the measurements show the cost model to be, in log step time: how far apart
        the measured layouts' misses (each its runs' mean log ratio to the estimate) are — what
        no factor every candidate shares can explain — and at least one run's noise."""
        means = [sum(m) / len(m) for m in self.misses.values()]
        spread = max(means) - min(means) if means else 0.0
        return max(spread, self.step.noise_sd())

    def predict(self, rows=None, common: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of the noise-free log step time of candidates ``rows`` (all when
        None); without ``common``, leaving out the factor every candidate shares."""
        return self.step.predict(rows, common)

    def predict_against(self, ref: int) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of every candidate's noise-free log step time less candidate
        ``ref``'s: how much faster or slower than it each one is believed to be."""
        return self.step.predict_against(ref)

    def mechanism_sd(self) -> dict:
        """Each step-time mechanism's posterior standard deviation of its log factor."""
        return self.step.mechanism_sd()

    def memory_mean(self) -> np.ndarray:
        """Every candidate's corrected log peak (the mean of its posterior)."""
        return self.memory.predict()[0]

    def fit_probability(self, rows=None) -> np.ndarray:
        """The probability that a run of each candidate of ``rows`` (all when None) peaks
        under the limit."""
        return self.memory.probability_below(self.log_limit, rows)

    def closed(self) -> np.ndarray:
        """Candidates estimated at least as large as one that ran out of memory — by the
        corrected estimate, or within that one's layout by the cost model's own — never run."""
        out = np.zeros(len(self.layout), dtype=bool)
        if not self.ooms:
            return out
        corrected = self.memory_mean()
        for i in self.ooms:
            out |= corrected >= corrected[i] - 1e-9
            out |= (self.layout == self.layout[i]) & (
                self.memory_gb >= self.memory_gb[i] * (1 - 1e-9)
            )
        return out
