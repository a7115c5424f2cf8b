"""How far a cost model's sum of parts is off, mechanism by mechanism: a posterior that learns
its own scale.

Contract: a :class:`FactorPosterior` of a :class:`Shape` holds, for candidates, the model's
parts (``candidates × Shape.parts``, positive), which conditional mechanisms act on each
(``candidates × Shape.mechanisms``, bool), a layout id and where that layout sits among the
others (its ``position``: a vector, e.g. log2 of tp, pp, micro-batch size — layouts near each
other are alike); :meth:`FactorPosterior.fit` takes
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
δ_m with ``scale × sigma_mechanism``, ε with ``noise``; the layout effects jointly, each with
sd ``scale × sigma_layout``, a share ``layout_correlation`` of it shared with the layouts
near it (a squared-exponential kernel over positions, ``layout_lengths`` per coordinate): a
miss measured on one layout moves the layouts like it, more weakly, and not those unlike it.
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

from autotune.search.normal import log_cdf, mills, normal_cdf

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
    layout_correlation: float = 0.0  # share of a layout's effect its neighbours share
    layout_lengths: tuple = ()  # the kernel's length per coordinate of a layout's position

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
    reach: np.ndarray  # every layout's effect given the fitted ones': its mean is reach @ effect
    unexplained: np.ndarray  # … and the variance the fitted ones leave it


class FactorPosterior:
    """The posterior over a cost model's errors (see the module doc)."""

    def __init__(
        self,
        shape: Shape,
        parts: np.ndarray,
        active: np.ndarray,
        layout: np.ndarray,
        positions: np.ndarray | None = None,
    ):
        self.shape = shape
        self.mask = shape.mask()
        self.conditional = np.array([m in shape.conditional for m in shape.mechanisms])
        self.parts = np.asarray(parts, dtype=float).reshape(-1, len(shape.parts))
        self.active = np.asarray(active, dtype=bool).reshape(-1, len(shape.mechanisms))
        self.layout = np.asarray(layout, dtype=int)
        # row L: layout L's position (layouts are numbered 0, 1, … in the order first seen)
        self.positions = np.zeros((0, len(shape.layout_lengths)))
        if positions is None:  # a shape whose layouts are all unalike: no coordinates
            positions = [()] * len(self.layout)
        for i, at in zip(self.layout, positions):
            self._place(int(i), at)
        self.fits: list[_Fit] = []
        self.weights = np.zeros(0)
        self.fit([], [])

    def _place(self, layout: int, position) -> None:
        """Layout ``layout`` is at ``position`` (its first candidate says so)."""
        if layout >= len(self.positions):
            grown = np.full((layout + 1, self.positions.shape[1]), np.nan)
            grown[: len(self.positions)] = self.positions
            self.positions = grown
        if np.isnan(self.positions[layout]).any():
            self.positions[layout] = np.asarray(position, dtype=float)

    def add(self, parts, active, layout: int, position=()) -> None:
        """One more candidate, the last row; the next :meth:`fit` takes it in."""
        self.parts = np.vstack([self.parts, np.asarray(parts, dtype=float)])
        self.active = np.vstack([self.active, np.asarray(active, dtype=bool)])
        self.layout = np.append(self.layout, layout)
        self._place(int(layout), position)

    def _kernel(self, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
        """The prior covariance of layouts ``a``'s effects with layouts ``b``'s."""
        shape = self.shape
        same = (a[:, None] == b[None, :]).astype(float)
        if not shape.layout_correlation:
            near = same
        else:
            lengths = np.asarray(shape.layout_lengths)
            apart = (self.positions[a][:, None, :] - self.positions[b][None, :, :]) / lengths
            near = np.exp(-0.5 * np.sum(apart * apart, axis=2))
        share = shape.layout_correlation
        return (scale * shape.sigma_layout) ** 2 * ((1 - share) * same + share * near)

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
        ids = np.array(layouts, dtype=int)
        joint = self._kernel(ids, ids, scale)  # the measured layouts' effects, a priori
        prior = np.zeros((n_theta + len(layouts),) * 2)
        prior[:n_theta, :n_theta] = np.diag(
            [1 / shape.sigma_common**2]
            + [1 / (scale * shape.sigma_mechanism) ** 2] * len(shape.mechanisms)
        )
        prior[n_theta:, n_theta:] = np.linalg.inv(joint) if layouts else joint
        column = {layout: n_theta + j for j, layout in enumerate(layouts)}
        params = np.zeros(n_theta + len(layouts))
        evidence = 0.5 * float(np.linalg.slogdet(prior)[1])
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
            precision = prior
        _, logdet_h = np.linalg.slogdet(precision)
        evidence -= 0.5 * logdet_h
        cov = np.linalg.inv(precision)
        for i, bound in above:
            evidence += self._censor(i, bound, column, noise, params, cov)
        every = np.arange(len(self.positions))
        if layouts:  # a layout's effect given the fitted ones: the kernel's conditional
            across = self._kernel(every, ids, scale)
            reach = across @ np.linalg.inv(joint)
            unexplained = self._kernel(every, every, scale).diagonal() - np.einsum(
                "ij,ij->i", reach, across
            )
        else:
            reach = np.zeros((len(every), 0))
            unexplained = np.full(len(every), (scale * shape.sigma_layout) ** 2)
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
            reach,
            np.maximum(unexplained, 0.0),
        )

    def _newton(self, rows, y, indicator, prior, noise, params):
        """Move ``params`` (in place) to the mode of the posterior given the exact observations
        ``y`` of ``rows``; returns (log posterior there, up to constants; its curvature)."""
        n_theta = 1 + len(self.shape.mechanisms)

        def at(p):
            mean, jac = self._mean(rows, p[:n_theta])
            r = (y - mean - indicator @ p[n_theta:]) / noise
            return (
                -0.5 * float(r @ r) - 0.5 * float(p @ prior @ p),
                np.hstack([jac, indicator]),
                r,
            )

        objective, full, r = at(params)
        for _ in range(ITERATIONS):
            precision = full.T @ full / noise**2 + prior
            step = np.linalg.solve(precision, full.T @ r / noise - prior @ params)
            for _ in range(20):  # halve until the posterior does not fall
                found = at(params + step)
                if found[0] >= objective - 1e-12:
                    break
                step = step / 2
            else:
                break
            params += step
            objective, full, r = found
        return objective, full.T @ full / noise**2 + prior

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

    def _one(self, f: _Fit, rows: np.ndarray, common: bool, ref: int | None = None):
        """(mean, variance) of candidates ``rows``' noise-free log totals under fit ``f``, and
        — given a ``ref`` row — each one's covariance with it (else None)."""
        mean, loads, layout, seen = self._loadings(f, rows, common)
        full = np.block([[f.cov, f.cross], [f.cross.T, f.layout_cov]])
        var = np.einsum("ij,jk,ik->i", loads, full, loads)
        # what the fitted layouts leave of each layout's effect (a layout added since the fit:
        # its effect as the prior has it)
        var += np.where(seen, f.unexplained[layout], (f.scale * self.shape.sigma_layout) ** 2)
        if ref is None:
            return mean, np.maximum(var, 1e-12), None
        _, theirs, other, known = self._loadings(f, np.array([ref]), common)
        cov = loads @ full @ theirs[0]
        if known[0]:  # the layouts' effects beyond the fitted ones, alike as the kernel says
            ids = np.array(f.layouts, dtype=int)
            near = self._kernel(layout, other, f.scale)[:, 0]
            if len(ids):
                near -= f.reach[layout] @ self._kernel(ids, other, f.scale)[:, 0]
            cov += np.where(seen, near, 0.0)
        return mean, np.maximum(var, 1e-12), cov

    def _loadings(self, f: _Fit, rows: np.ndarray, common: bool):
        """(the mean of ``rows``' log totals under ``f``, their loadings on its fitted
        parameters (γ, δ…, the fitted layouts' effects), their layout ids, whether each layout
        was known to the fit)."""
        mean, jac = self._mean(rows, f.theta)
        if not common:
            jac[:, 0] = 0.0
        seen = self.layout[rows] < len(f.unexplained)
        layout = np.where(seen, self.layout[rows], 0)
        reach = np.where(seen[:, None], f.reach[layout], 0.0)  # each effect through the fitted
        mean += reach @ f.effect
        return mean, np.hstack([jac, reach]), layout, seen

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
            m, v, _ = self._one(f, rows, common)
            mean += w * m
            second += w * (v + m * m)
        return mean, np.maximum(second - mean * mean, 1e-12)

    def predict_against(self, ref: int, rows: np.ndarray | None = None):
        """(mean, variance) of each candidate of ``rows`` (all when None) less candidate
        ``ref``, in noise-free log totals: what a candidate is believed to differ from it by —
        nothing, and surely, for ``ref`` itself; little, and surely, for a variant whose
        estimate differs from ``ref``'s by little."""
        rows = np.arange(len(self.parts)) if rows is None else np.asarray(rows, dtype=int)
        first = np.zeros(len(rows))
        second = np.zeros(len(rows))
        for w, f in zip(self.weights, self.fits):
            m, v, cov = self._one(f, rows, True, ref)
            m_ref, v_ref, _ = self._one(f, np.array([ref]), True)
            gap = m - m_ref[0]
            first += w * gap
            second += w * (np.maximum(v + v_ref[0] - 2 * cov, 0.0) + gap * gap)
        return first, np.maximum(second - first * first, 1e-12)

    def probability_below(self, bound: float, rows: np.ndarray | None = None) -> np.ndarray:
        """The probability that one observation of each candidate of ``rows`` (all when
        None) — its noise-free value and the observation's own deviation — is under the log
        ``bound``."""
        rows = np.arange(len(self.parts)) if rows is None else np.asarray(rows, dtype=int)
        out = np.zeros(len(rows))
        for w, f in zip(self.weights, self.fits):
            m, v, _ = self._one(f, rows, True)
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
