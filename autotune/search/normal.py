"""The standard normal's distribution function in the forms the belief needs, elementwise over
numpy arrays (numpy has no erf): :func:`normal_cdf` Φ, :func:`log_cdf` log Φ accurate far in the
left tail, :func:`mills` the inverse Mills ratio φ / Φ."""

from __future__ import annotations

import math

import numpy as np


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
