"""How far a cost model's sum of parts is off, mechanism by mechanism: a posterior that learns
its own scale.

Contract: a :class:`FactorPosterior` of a :class:`Shape` holds, for candidates, the model's
parts (``candidates × Shape.parts``, positive), which conditional mechanisms act on each
(``candidates × Shape.mechanisms``, bool) and a layout id; :meth:`FactorPosterior.fit` takes
observations of the log total — exact ones ``[(row, log value)]`` and censored ones ``[(row,
log bound)]`` (the value was above the bound: a run out of memory) — and
:meth:`FactorPosterior.predict` returns the mean and variance of every candidate's noise-free
log total and :meth:`FactorPosterior.probability_below` the probability that one observation
of it is under a bound. It reads no storage and chooses nothing.

The model (docs/search.md, "How sure the prior is"):

    log value = γ + log Σ_k part_k · exp(Σ δ_m over the mechanisms m acting on part k) + ε_L + ε

γ a factor every candidate shares, δ_m one per mechanism (a conditional one only on the
candidates it acts on), ε_L one per layout (what no mechanism explains; shared by the layout's
variants), ε one per observation. Priors are normal in log space: γ with ``sigma_common``,
δ_m with ``scale × sigma_mechanism``, ε_L with ``scale × sigma_layout``, ε with ``noise``.
Exact observations fit by Newton steps to the posterior's mode and its curvature; a censored
one then moves that Gaussian to the mean and covariance of the posterior truncated at its
bound (assumed-density filtering), so a run out of memory says "at least this large" with the
spread the belief had, not pinned to the bound.

The **scale** of the model's error and the **noise** are not fixed: each has a few values
(:attr:`Shape.scales`, :attr:`Shape.noises`), equally likely before anything is observed, and
the observations weigh them by their evidence (the Laplace approximation of the marginal
likelihood; a censored observation adds the ``log Φ`` its truncation took). So when
measurements agree with the model, the small scales win and every mechanism nobody measured is
believed about as right as those measured; when one mechanism is far off, the large scales win
and the others are held in doubt too. Predictions are the weighted mixture's mean and
variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ITERATIONS = 8
NEGLIGIBLE = 1e-3  # hypotheses weighing less than this are left out of predictions


@dataclass(frozen=True)
class Shape:
    """What is modelled: parts, mechanisms (each pricing some parts; those in ``conditional``
    only where a candidate's flag says), and the prior's sizes."""

    parts: tuple
    mechanisms: dict  # name → the parts it prices
    conditional: tuple  # mechanisms that act only on the candidates flagged for them
    sigma_common: float
    sigma_mechanism: float
    sigma_layout: float
    scales: tuple  # multipliers of sigma_mechanism and sigma_layout, equally likely a priori
    noises: tuple  # sds of one observation, equally likely a priori

    def mask(self) -> np.ndarray:
        """parts × mechanisms: which mechanism prices which part."""
        out = np.zeros((len(self.parts), len(self.mechanisms)))
        for m, parts in enumerate(self.mechanisms.values()):
            for part in parts:
                out[self.parts.index(part), m] = 1.0
        return out


@dataclass
class _Fit:
    """The posterior under one (scale, noise): its mode, covariance and evidence."""

    scale: float
    noise: float
    theta: np.ndarray  # γ, δ…
    cov: np.ndarray
    layouts: list  # layout ids with an effect fitted, in column order
    effect: np.ndarray
    cross: np.ndarray  # cov(θ, ε_L)
    layout_cov: np.ndarray
    evidence: float


class FactorPosterior:
    """The posterior over a cost model's errors (see the module doc)."""

    def __init__(self, shape: Shape, parts: np.ndarray, active: np.ndarray, layout: np.ndarray):
        self.shape = shape
        self.mask = shape.mask()
        self.conditional = np.array([m in shape.conditional for m in shape.mechanisms])
        self.parts = np.asarray(parts, dtype=float).reshape(-1, len(shape.parts))
        self.active = np.asarray(active, dtype=bool).reshape(-1, len(shape.mechanisms))
        self.layout = np.asarray(layout, dtype=int)
        self.fits: list[_Fit] = []
        self.weights = np.zeros(0)
        self.fit([], [])

    def add(self, parts, active, layout: int) -> None:
        """One more candidate, the last row; the next :meth:`fit` takes it in."""
        self.parts = np.vstack([self.parts, np.asarray(parts, dtype=float)])
        self.active = np.vstack([self.active, np.asarray(active, dtype=bool)])
        self.layout = np.append(self.layout, layout)

    # -- the model -------------------------------------------------------------------------

    def _mean(self, rows: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log total without ε_L, ∂/∂(γ, δ)) of candidates ``rows`` at ``theta``."""
        acting = np.where(self.conditional, self.active[rows], True)  # rows × mechanisms
        exponent = (acting * theta[1:]) @ self.mask.T  # rows × parts
        # a Newton step may overshoot far: e^±30 is well past any factor a model is off by
        scaled = self.parts[rows] * np.exp(np.clip(exponent, -30.0, 30.0))
        total = np.maximum(scaled.sum(axis=1), 1e-300)
        shares = (scaled @ self.mask) / total[:, None] * acting
        return theta[0] + np.log(total), np.hstack([np.ones((len(rows), 1)), shares])

    def fit(self, exact: list, above: list = ()) -> None:
        """The posterior given ``exact`` ``[(row, log value)]`` and ``above`` ``[(row, log
        bound)]`` (each value was above its bound)."""
        exact = sorted(exact)  # order-free: resume-proof
        above = sorted(above)
        fits = [
            self._fit_one(exact, above, scale, noise)
            for scale in self.shape.scales
            for noise in self.shape.noises
        ]
        evidence = np.array([f.evidence for f in fits])
        weights = np.exp(evidence - evidence.max())
        weights /= weights.sum()
        keep = weights >= NEGLIGIBLE
        self.fits = [f for f, k in zip(fits, keep) if k]
        self.weights = weights[keep] / weights[keep].sum()

    def _fit_one(self, exact, above, scale: float, noise: float) -> _Fit:
        shape = self.shape
        rows = np.array([i for i, _ in exact] + [i for i, _ in above], dtype=int)
        layouts = sorted({int(self.layout[i]) for i in rows})
        n_theta = 1 + len(shape.mechanisms)
        prior = np.array(
            [1 / shape.sigma_common**2]
            + [1 / (scale * shape.sigma_mechanism) ** 2] * len(shape.mechanisms)
            + [1 / (scale * shape.sigma_layout) ** 2] * len(layouts)
        )
        column = {layout: n_theta + j for j, layout in enumerate(layouts)}
        params = np.zeros(n_theta + len(layouts))
        evidence = 0.5 * float(np.sum(np.log(prior)))
        if exact:
            measured = np.array([i for i, _ in exact], dtype=int)
            y = np.array([v for _, v in exact])
            indicator = np.zeros((len(exact), len(layouts)))
            for r, i in enumerate(measured):
                indicator[r, column[int(self.layout[i])] - n_theta] = 1.0
            base, _ = self._mean(measured, params[:n_theta])
            params[0] = float(np.median(y - base))  # start at the common ratio
            objective, precision = self._newton(measured, y, indicator, prior, noise, params)
            evidence += objective - len(exact) * math.log(noise)
        else:
            precision = np.diag(prior)
        _, logdet_h = np.linalg.slogdet(precision)
        evidence -= 0.5 * logdet_h
        cov = np.linalg.inv(precision)
        for i, bound in above:
            evidence += self._censor(i, bound, column, noise, params, cov)
        return _Fit(
            scale,
            noise,
            params[:n_theta].copy(),
            cov[:n_theta, :n_theta],
            layouts,
            params[n_theta:].copy(),
            cov[:n_theta, n_theta:],
            cov[n_theta:, n_theta:],
            evidence,
        )

    def _newton(self, rows, y, indicator, prior, noise, params):
        """Move ``params`` (in place) to the mode of the posterior given the exact observations
        ``y`` of ``rows``; returns (log posterior there, up to constants; its curvature)."""
        n_theta = 1 + len(self.shape.mechanisms)

        def at(p):
            mean, jac = self._mean(rows, p[:n_theta])
            r = (y - mean - indicator @ p[n_theta:]) / noise
            return (
                -0.5 * float(r @ r) - 0.5 * float(p @ (prior * p)),
                np.hstack([jac, indicator]),
                r,
            )

        objective, full, r = at(params)
        for _ in range(ITERATIONS):
            precision = full.T @ full / noise**2 + np.diag(prior)
            step = np.linalg.solve(precision, full.T @ r / noise - prior * params)
            for _ in range(20):  # halve until the posterior does not fall
                found = at(params + step)
                if found[0] >= objective - 1e-12:
                    break
                step = step / 2
            else:
                break
            params += step
            objective, full, r = found
        return objective, full.T @ full / noise**2 + np.diag(prior)

    def _censor(self, row: int, bound: float, column: dict, noise, params, cov) -> float:
        """Take in (in place: ``params``, ``cov``) that one observation of ``row`` was above
        the log ``bound``: the Gaussian posterior's mean and covariance moved to those of the
        posterior truncated there (assumed-density filtering, linear at the mean: the mode of
        a step-shaped likelihood would sit on the bound, far surer than the truncation says).
        Returns the log probability the belief gave it, log Φ(z)."""
        n_theta = 1 + len(self.shape.mechanisms)
        mean, jac = self._mean(np.array([row]), params[:n_theta])
        j = np.zeros(len(params))
        j[:n_theta] = jac[0]
        j[column[int(self.layout[row])]] = 1.0
        value = float(mean[0] + params[column[int(self.layout[row])]])
        spread = float(j @ cov @ j) + noise**2
        z = (value - bound) / math.sqrt(spread)
        lam = float(mills(np.array([z]))[0])
        gain = cov @ j
        params += gain * lam / math.sqrt(spread)
        cov -= np.outer(gain, gain) * lam * (z + lam) / spread
        return float(log_cdf(np.array([z]))[0])

    # -- what it says ----------------------------------------------------------------------

    def _one(self, f: _Fit, rows: np.ndarray, common: bool) -> tuple[np.ndarray, np.ndarray]:
        mean, jac = self._mean(rows, f.theta)
        if not common:
            jac[:, 0] = 0.0
        var = np.einsum("ij,jk,ik->i", jac, f.cov, jac)
        column = np.full(int(self.layout.max(initial=0)) + 1, -1)
        column[f.layouts] = np.arange(len(f.layouts))
        cols = column[self.layout[rows]]
        known = cols >= 0
        if known.any():
            k = cols[known]
            mean[known] += f.effect[k]
            var[known] += 2 * np.einsum("ij,ji->i", jac[known], f.cross[:, k]) + f.layout_cov[k, k]
        var[~known] += (f.scale * self.shape.sigma_layout) ** 2
        return mean, np.maximum(var, 1e-12)

    def predict(
        self, rows: np.ndarray | None = None, common: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of the noise-free log total of candidates ``rows`` (all when
        None). Without ``common`` the variance leaves out the common factor γ's (what every
        candidate shares: comparisons before any measurement)."""
        rows = np.arange(len(self.parts)) if rows is None else np.asarray(rows, dtype=int)
        mean = np.zeros(len(rows))
        second = np.zeros(len(rows))
        for w, f in zip(self.weights, self.fits):
            m, v = self._one(f, rows, common)
            mean += w * m
            second += w * (v + m * m)
        return mean, np.maximum(second - mean * mean, 1e-12)

    def probability_below(self, bound: float, rows: np.ndarray | None = None) -> np.ndarray:
        """The probability that one observation of each candidate of ``rows`` (all when
        None) — its noise-free value and the observation's own deviation — is under the log
        ``bound``."""
        rows = np.arange(len(self.parts)) if rows is None else np.asarray(rows, dtype=int)
        out = np.zeros(len(rows))
        for w, f in zip(self.weights, self.fits):
            m, v = self._one(f, rows, True)
            out += w * normal_cdf((bound - m) / np.sqrt(v + f.noise**2))
        return out

    def noise_sd(self) -> float:
        """The sd of one observation, as the observations weigh the hypotheses."""
        return math.sqrt(float(sum(w * f.noise**2 for w, f in zip(self.weights, self.fits))))

    def scale(self) -> float:
        """The model error's scale, as the observations weigh the hypotheses (geometric mean)."""
        return math.exp(sum(w * math.log(f.scale) for w, f in zip(self.weights, self.fits)))

    def mechanism_sd(self) -> dict:
        """Each mechanism's posterior standard deviation of its log factor δ_m."""
        out = {}
        for m, name in enumerate(self.shape.mechanisms):
            first = sum(w * f.theta[1 + m] for w, f in zip(self.weights, self.fits))
            second = sum(
                w * (f.cov[1 + m, 1 + m] + f.theta[1 + m] ** 2)
                for w, f in zip(self.weights, self.fits)
            )
            out[name] = math.sqrt(max(second - first * first, 0.0))
        return out


def log_cdf(z: np.ndarray) -> np.ndarray:
    """log Φ(z), elementwise, accurate in the far left tail (math.erfc is relative-exact)."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    for i, v in enumerate(z):
        out[i] = (
            math.log(0.5 * math.erfc(-v / math.sqrt(2)))
            if v > -30
            else -0.5 * v * v - math.log(-v * math.sqrt(2 * math.pi))
        )
    return out


def mills(z: np.ndarray) -> np.ndarray:
    """φ(z) / Φ(z) (the inverse Mills ratio), elementwise, stable in the left tail."""
    z = np.asarray(z, dtype=float)
    return np.exp(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - log_cdf(z))


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
