"""How far the cost model may be off, mechanism by mechanism, given what was measured.

Contract: a :class:`Belief` is built from the cost model's step-time parts of a set of candidates
(:data:`PARTS`, raw: before any calibration), whether each is pipelined, its layout id and its
estimated peak memory (one more: :meth:`Belief.add`). :meth:`Belief.fit` takes the study's
measurements — ``[(candidate index, measured step seconds)]`` and ``[(candidate index,
measured peak GiB)]`` — and
:meth:`Belief.predict` returns, for every candidate, the mean and standard deviation of its log
step time, and :meth:`Belief.fit_probability` the probability that it fits the memory limit.
It reads no storage and chooses nothing: the prior (`autotune.search.prior`) does.

The model (docs/search.md, "How sure the prior is"):

- ``log step = γ + log Σ_k part_k · exp(Σ δ_m over the mechanisms m that price part k) + ε_L``:
  γ a factor common to every candidate (the pool is faster or slower than the profile says),
  δ_m one factor per mechanism of :data:`MECHANISMS` (tp communication, the pipeline — its
  bubble, transfers and stage compute, on pipelined candidates only — the dp all-reduce,
  recompute, the optimizer update, compute, host), ε_L one per (dp, tp, pp, micro-batch)
  layout (what no mechanism explains), and each measurement off by ε ~ N(0, σ²) of its own.
- Priors, all normal in log space: γ with :data:`SIGMA_COMMON`, each δ_m with
  :data:`SIGMA_MECHANISM`, each ε_L with :data:`SIGMA_LAYOUT`, ε with :data:`SIGMA_CANDIDATE`.
  The fit is the posterior's mode (Gauss-Newton on the log step times) and its curvature, so a
  mechanism's uncertainty shrinks only as far as measured candidates spend time in it: one no
  measurement exercised keeps :data:`SIGMA_MECHANISM`.
- Memory: ``log peak = log estimate + μ`` with μ ~ N(0, :data:`SIGMA_MEMORY`²), each measured peak
  off by :data:`SIGMA_MEMORY_RUN`; a candidate fits with the probability that its peak is under
  the limit. A candidate that ran out of memory bounds μ from below (:meth:`Belief.fit` takes
  ``ooms``): every candidate estimated at least as large is taken not to fit.
"""

from __future__ import annotations

import math

import numpy as np

PARTS = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer", "host")
# mechanism → the parts it prices (``pipeline`` only on pipelined candidates)
MECHANISMS = {
    "compute": ("compute",),
    "recompute": ("recompute",),
    "tp": ("tp_comm",),
    "pipeline": ("compute", "recompute", "bubble", "pp_comm"),
    "dp": ("dp_comm",),
    "optimizer": ("optimizer",),
    "host": ("host",),
}
PIPELINE = tuple(MECHANISMS).index("pipeline")
# Standard deviations in log space. SIGMA_LAYOUT and SIGMA_MEMORY were chosen on
# benchmarks/search_efficiency.py's seeds 100-109 (docs/search.md, "How sure the prior is", has
# the sweep); the others are the benchmark's own sizes, which it reports on seeds 0-9.
SIGMA_COMMON = 1.0  # the pool against the profile: a factor e either way is plausible
SIGMA_MECHANISM = 0.35  # one mechanism mispriced: 0.6× or 1.6× is 1.4 σ
SIGMA_LAYOUT = 0.02  # what a layout does that no mechanism explains
SIGMA_CANDIDATE = 0.10  # one measurement against its candidate's estimate, all else known
SIGMA_MEMORY = 0.15  # the memory model's factor
SIGMA_MEMORY_RUN = 0.05  # one measured peak against its estimate × that factor
ITERATIONS = 6


def _mask() -> np.ndarray:
    """parts × mechanisms: which mechanism prices which part."""
    mask = np.zeros((len(PARTS), len(MECHANISMS)))
    for m, parts in enumerate(MECHANISMS.values()):
        for part in parts:
            mask[PARTS.index(part), m] = 1.0
    return mask


MASK = _mask()


class Belief:
    """The posterior over the cost model's errors (see the module doc)."""

    def __init__(
        self,
        parts: np.ndarray,
        pipelined: np.ndarray,
        layout: np.ndarray,
        memory_gb: np.ndarray,
        limit_gb: float,
    ):
        self.parts = parts  # candidates × PARTS, seconds
        self.pipelined = pipelined.astype(bool)
        self.layout = layout  # candidates → layout id
        self.memory_gb, self.limit_gb = memory_gb, limit_gb
        self.theta = np.zeros(1 + len(MECHANISMS))  # γ, δ...
        self.cov = np.diag([SIGMA_COMMON**2] + [SIGMA_MECHANISM**2] * len(MECHANISMS))
        self.layouts: list[int] = []  # layout ids with an effect fitted, in column order
        self.layout_effect = np.zeros(0)
        self.cross = np.zeros((1 + len(MECHANISMS), 0))  # cov(θ, ε_L)
        self.layout_cov = np.zeros((0, 0))
        self.memory_mean, self.memory_sd = 0.0, SIGMA_MEMORY
        self.oom_from = math.inf  # estimated GiB from which nothing fits

    def add(self, parts: np.ndarray, pipelined: bool, layout: int, memory_gb: float) -> None:
        """One more candidate, the last row (as the constructor's rows). What was fitted
        stays: the next :meth:`fit` takes it in."""
        self.parts = np.vstack([self.parts, parts])
        self.pipelined = np.append(self.pipelined, pipelined)
        self.layout = np.append(self.layout, layout)
        self.memory_gb = np.append(self.memory_gb, memory_gb)

    # -- the step time ---------------------------------------------------------------------

    def _shares(self, rows: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log step time without ε_L, ∂/∂(γ, δ)) of candidates ``rows`` at ``theta``."""
        delta = theta[1:]
        scale_flat = np.exp(
            MASK[:, [m for m in range(len(MECHANISMS)) if m != PIPELINE]]
            @ np.delete(delta, PIPELINE)
        )
        scale_pipe = scale_flat * np.exp(MASK[:, PIPELINE] * delta[PIPELINE])
        piped = self.pipelined[rows][:, None]
        scaled = self.parts[rows] * np.where(piped, scale_pipe, scale_flat)
        total = scaled.sum(axis=1)
        shares = (scaled @ MASK) / total[:, None]
        shares[:, PIPELINE] *= piped[:, 0]
        jac = np.hstack([np.ones((len(rows), 1)), shares])
        return theta[0] + np.log(total), jac

    def fit(self, times: list, peaks: list, ooms: list = ()) -> None:
        """The posterior given ``times`` ``[(index, seconds)]``, ``peaks`` ``[(index, GiB)]``
        and ``ooms`` ``[index]`` of candidates that ran out of memory."""
        times = sorted((i, s) for i, s in times if s and s > 0)  # order-free: resume-proof
        self.layouts = sorted({int(self.layout[i]) for i, _ in times})
        n_theta, n_layouts = 1 + len(MECHANISMS), len(self.layouts)
        prior_precision = np.diag(
            [1 / SIGMA_COMMON**2]
            + [1 / SIGMA_MECHANISM**2] * len(MECHANISMS)
            + [1 / SIGMA_LAYOUT**2] * n_layouts
        )
        column = {layout: n_theta + j for j, layout in enumerate(self.layouts)}
        rows = np.array([i for i, _ in times], dtype=int)
        y = np.log([s for _, s in times])
        params = np.zeros(n_theta + n_layouts)
        if len(rows):
            base, _ = self._shares(rows, params[:n_theta])
            params[0] = float(np.median(y - base))  # start at the common ratio
        indicator = np.zeros((len(rows), n_layouts))
        for r, i in enumerate(rows):
            indicator[r, column[int(self.layout[i])] - n_theta] = 1.0
        precision = prior_precision
        for _ in range(ITERATIONS if len(rows) else 0):
            mean, jac = self._shares(rows, params[:n_theta])
            full = np.hstack([jac, indicator])
            residual = y - mean - indicator @ params[n_theta:]
            precision = full.T @ full / SIGMA_CANDIDATE**2 + prior_precision
            gradient = full.T @ residual / SIGMA_CANDIDATE**2 - prior_precision @ params
            params = params + np.linalg.solve(precision, gradient)
        cov = np.linalg.inv(precision)
        self.theta, self.layout_effect = params[:n_theta], params[n_theta:]
        self.cov, self.cross = cov[:n_theta, :n_theta], cov[:n_theta, n_theta:]
        self.layout_cov = cov[n_theta:, n_theta:]
        self._fit_memory(peaks, ooms)

    def predict(
        self, rows: np.ndarray | None = None, common: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of the log step time of candidates ``rows`` (all when None), as
        sure as the belief is of what their layout and mechanisms cost (:meth:`run_sd`: of one
        run of a candidate). Without ``common`` the variance
        leaves out the common factor γ's (what every candidate shares: comparisons before any
        measurement)."""
        rows = np.arange(len(self.parts)) if rows is None else rows
        mean, jac = self._shares(rows, self.theta)
        if not common:
            jac[:, 0] = 0.0
        var = np.einsum("ij,jk,ik->i", jac, self.cov, jac)
        column = np.full(int(self.layout.max(initial=0)) + 1, -1)
        column[self.layouts] = np.arange(len(self.layouts))
        cols = column[self.layout[rows]]
        known = cols >= 0
        if known.any():
            k = cols[known]
            mean[known] += self.layout_effect[k]
            var[known] += (
                2 * np.einsum("ij,ji->i", jac[known], self.cross[:, k]) + self.layout_cov[k, k]
            )
        var[~known] += SIGMA_LAYOUT**2
        return mean, np.maximum(var, 1e-12)

    @staticmethod
    def run_sd(var: np.ndarray) -> np.ndarray:
        """The standard deviation of one run of a candidate whose :meth:`predict` variance is
        ``var``: its own :data:`SIGMA_CANDIDATE` added."""
        return np.sqrt(var + SIGMA_CANDIDATE**2)

    def mechanism_sd(self) -> dict:
        """Each mechanism's posterior standard deviation of its log factor δ_m."""
        return {name: float(math.sqrt(self.cov[1 + m, 1 + m])) for m, name in enumerate(MECHANISMS)}

    # -- memory ----------------------------------------------------------------------------

    def _fit_memory(self, peaks: list, ooms) -> None:
        ratios = [
            math.log(gb / self.memory_gb[i])
            for i, gb in peaks
            if gb and gb > 0 and self.memory_gb[i] > 0
        ]
        precision = 1 / SIGMA_MEMORY**2 + len(ratios) / SIGMA_MEMORY_RUN**2
        self.memory_mean = sum(ratios) / SIGMA_MEMORY_RUN**2 / precision
        self.memory_sd = math.sqrt(1 / precision)
        self.oom_from = min((float(self.memory_gb[i]) for i in ooms), default=math.inf)

    def fit_probability(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The probability that each candidate of ``rows`` (all when None) fits the limit:
        that its peak — the estimate × the memory factor, and a run's own deviation — stays
        under it, given the peaks measured and, where a candidate ran out of memory, that the
        factor is at least what made that one not fit."""
        rows = np.arange(len(self.parts)) if rows is None else rows
        sd = math.sqrt(self.memory_sd**2 + SIGMA_MEMORY_RUN**2)
        room = math.log(self.limit_gb) - np.log(self.memory_gb[rows])  # the factor that fits
        below = normal_cdf((room - self.memory_mean) / sd)
        if not math.isfinite(self.oom_from):
            return below
        bound = normal_cdf((math.log(self.limit_gb / self.oom_from) - self.memory_mean) / sd)
        return np.clip((below - bound) / max(1.0 - bound, 1e-12), 0.0, 1.0)


def normal_cdf(z) -> np.ndarray:
    """Φ(z), elementwise, to 1.2e-7 (Numerical Recipes' erfc: numpy has no erf)."""
    x = -np.asarray(z, dtype=float) / math.sqrt(2)
    t = 1.0 / (1.0 + 0.5 * np.abs(x))
    poly = -1.26551223 + t * (
        1.00002368
        + t
        * (
            0.37409196
            + t
            * (
                0.09678418
                + t
                * (
                    -0.18628806
                    + t
                    * (
                        0.27886807
                        + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                    )
                )
            )
        )
    )
    erfc = t * np.exp(-x * x + poly)
    return 0.5 * np.where(x >= 0, erfc, 2.0 - erfc)
