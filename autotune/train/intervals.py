"""How precisely a trial knows its mean step time: Student-t intervals, in pure Python.

Contract: :func:`mean_step_time` is the estimate of the mean step time from the measured steps'
times (their mean, or the stop rule's weighted mean of the pilot and the steps after it,
`autotune.train.metrics.StepLog`); :func:`step_time_ci` its relative `CONFIDENCE` half-width —
the one definition of the metric ``step_time_ci``, of the stop rule's plan and of the pruner's
interval; :func:`student_t_quantile` Student's t quantile (Python's statistics has no t).
"""

import functools
import math
import statistics

CONFIDENCE = 0.95  # of step_time_ci


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's
    method; Numerical Recipes, 3rd ed., §6.4), on the side of x where it converges fast."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    tiny = 1e-300
    front = (
        math.exp(
            math.lgamma(a + b)
            - math.lgamma(a)
            - math.lgamma(b)
            + a * math.log(x)
            + b * math.log1p(-x)
        )
        / a
    )
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * fraction


def student_t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.cache
def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 ≤ p < 1) of Student's t with ``df`` ≥ 1 degrees of freedom, to
    1e-10 relative (this module stays pure Python, whose statistics has no t). Newton's method
    on :func:`student_t_cdf` from the normal quantile, which is below it: the CDF is concave
    there, so every step stays below the root and the iteration climbs to it."""
    t = statistics.NormalDist().inv_cdf(p)
    log_density = math.lgamma((df + 1) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    for _ in range(200):
        density = math.exp(log_density - (df + 1) / 2.0 * math.log1p(t * t / df))
        step = (p - student_t_cdf(t, df)) / density
        t += step
        if abs(step) <= 1e-12 * t:
            break
    return t


def mean_step_time(times, pilot: int | None = None, weight: float | None = None) -> float:
    """The estimate of the mean step time from ``times``: their mean, or — the stop rule's
    (:class:`StepLog`) — ``weight · mean(times[:pilot]) + (1 − weight) · mean(times[pilot:])``."""
    if pilot is None or pilot >= len(times):
        return statistics.fmean(times)
    return weight * statistics.fmean(times[:pilot]) + (1.0 - weight) * statistics.fmean(
        times[pilot:]
    )


def step_time_ci(times, pilot: int | None = None, weight: float | None = None) -> float | None:
    """The relative `CONFIDENCE` half-width of :func:`mean_step_time` of ``times`` (step times,
    in any one unit; Student-t, n − 1 degrees of freedom): ``t · s / √n / mean``, with ``pilot``
    and ``weight`` ``t · s · √(w²/m + (1 − w)²/(n − m)) / estimate`` (m = ``pilot``, w =
    ``weight``: the variance of that weighted mean of two independent means); None for fewer
    than two values or an estimate ≤ 0. The one definition of the metric ``step_time_ci``, of
    the stop rule's plan and of the pruner's interval."""
    n = len(times)
    if n < 2:
        return None
    mean = mean_step_time(times, pilot, weight)
    if mean <= 0:
        return None
    t = student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1)
    if pilot is None or pilot >= n:
        spread = 1.0 / math.sqrt(n)
    else:
        spread = math.sqrt(weight**2 / pilot + (1.0 - weight) ** 2 / (n - pilot))
    return t * statistics.stdev(times) * spread / mean
