"""What the prior runs next, given its belief about every candidate: the acquisition.

Contract: functions of arrays over the prior's candidates — the belief's mean and standard
deviation of each one's noise-free log goodput, its probability to fit, which may be proposed —
that read no storage, hold no state and know nothing of Optuna or the cost model. The prior
(`autotune.search.prior`) gives them the arrays and proposes what they choose.

- The constants the prior proposes by: how likely to fit a candidate must be
  (:data:`FIT_AT_LEAST`, :data:`LIKELY`), the bands' widths (:data:`BAND`, :data:`WIDE`,
  :data:`UNMEASURED`) and what is one run's noise at most (:data:`NOISE_AT_MOST`).
- :func:`expected_gain`: the expected improvement of a normal belief over the best value.
- :data:`MECHANISMS` and :func:`mechanisms_of`: the parallel mechanisms a candidate uses
  (tp > 1, pp > 1, data parallel alone, its recompute mode): a study measures each at least once
  where one of its candidates is within the model's demonstrated error of the best measured.
- :func:`before_the_choice`: when the acquisition's own choice merely polishes a measured split
  (a variant estimated within one run's noise of one of its measured candidates), the candidate
  that runs instead: of
  the caller's *bands* (candidates of parallel splits that have not run, within what the model
  may be off by of the best), one of a mechanism no measured candidate uses, else the band's
  best — or None.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.search.normal import normal_cdf

# LIKELY, BAND, WIDE, UNMEASURED and NOISE_AT_MOST were chosen on
# benchmarks/search_efficiency.py --structures tune (other truth structures, seeds 100-109),
# reported on --structures report (docs/search.md).
FIT_AT_LEAST = 0.05  # a candidate less likely than this to fit is not proposed
LIKELY = 0.5  # after a run out of memory, only candidates likelier than this to fit run
# The bands, in log goodput below the best measured: the band, BAND × the model's demonstrated
# error (`autotune.search.belief.Belief.miss`); the wide band, WIDE × that error and at least
# UNMEASURED — what a mechanism no measured candidate uses may be off by although every
# measurement agrees (0.6× and 1.6×, one mechanism mispriced at 1.4 σ of the belief's prior,
# are ±0.5).
BAND = 0.75
WIDE = 1.5
UNMEASURED = 0.5
# One run's noise as the belief learns it, at most this: before repeats tell the belief its noise
# (its hypotheses' mean is 0.11), an estimated gain of 5 % is not noise (docs/search.md).
NOISE_AT_MOST = 0.05
# name → whether a candidate uses it; and "recompute MODE" for each recompute mode
MECHANISMS = {
    "data parallel alone": lambda c: c.tp == 1 and c.pp == 1,
    "tp > 1 without pipeline stages": lambda c: c.tp > 1 and c.pp == 1,
    "pp > 1 without tp": lambda c: c.tp == 1 and c.pp > 1,
    "tp > 1 and pp > 1": lambda c: c.tp > 1 and c.pp > 1,
}


def mechanisms_of(candidate) -> set:
    """The parallel mechanisms ``candidate`` uses (see the module doc)."""
    used = {name for name, uses in MECHANISMS.items() if uses(candidate)}
    return used | {f"recompute {candidate.recompute}"}


def expected_gain(mean, sd, best: float) -> np.ndarray:
    """Expected improvement of a normal (mean, sd) over ``best`` (the mean when -inf)."""
    if not math.isfinite(best):  # nothing measured: the expected goodput, relative
        return np.exp(mean - mean.max())
    z = (mean - best) / sd
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return sd * (z * normal_cdf(z) + pdf) + 1e-12


def before_the_choice(
    score: np.ndarray,
    band: np.ndarray,
    wide: np.ndarray,
    uses: np.ndarray,
    measured: np.ndarray,
    polishing: bool,
) -> int | None:
    """The candidate to run instead of the acquisition's choice, or None (see the module doc).
    ``score``: each candidate's acquisition value; ``band``: the candidates within the model's
    demonstrated error, ``wide``: within what an unmeasured mechanism may be off by;
    ``uses``: candidates × mechanisms, which each uses; ``measured``: the candidates measured or
    running; ``polishing``: whether the choice is a variant of a measured split estimated
    within one run's noise of one of that split's measured candidates."""
    if not polishing:
        return None
    unmeasured = ~uses[measured].any(axis=0)  # mechanisms no measured candidate uses
    first = wide & (uses & unmeasured).any(axis=1)
    if first.any():
        return int(np.argmax(np.where(first, score, -np.inf)))
    if band.any():
        return int(np.argmax(np.where(band, score, -np.inf)))
    return None
