"""What a study's prior says of the layouts it holds: how many parallel splits are worth
measuring before anything is, and — when the search ends — which layouts ran and why each other
one did not.

Contract: functions of a `autotune.search.prior.Prior` and the study's measurements; they read
its belief and bands and change nothing. A layout is a (dp, tp, pp, micro-batches per step)
split (`autotune.search.prior.layout_of`), its (dp, tp, pp) its parallel split.

- :func:`worth_measuring`: the parallel splits estimated within what an unmeasured mechanism
  may be off by (`autotune.search.acquisition.UNMEASURED`) of the best — the note at a study's start.
- :func:`layouts`: every layout, ``{"layout": "dp·tp·pp·m", "ran": runs}``, and for one that did
  not run ``"why"`` not, as the prior sees it now, and ``"reach"``: its best corrected goodput
  (samples/s; None: nothing of it may fit). `autotune show` prints the reasons.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from autotune.search.acquisition import FIT_AT_LEAST, LIKELY, UNMEASURED

if TYPE_CHECKING:  # study_prior imports this module and the prior; this one only reads a prior
    from autotune.search.prior import Prior


def worth_measuring(prior: Prior) -> int:
    """How many parallel splits are estimated within :data:`UNMEASURED` of the best (the common
    factor left out), among the candidates that may fit."""
    fits = prior.belief.fit_probability() >= FIT_AT_LEAST
    mean, _ = prior.belief.predict(common=False)
    gain = np.where(fits, -mean, -np.inf)
    if not np.isfinite(gain).any():
        return 0
    split, _ = prior.split_arrays()
    return len(set(split[gain >= gain.max() - UNMEASURED].tolist()))


def layouts(prior: Prior, measurements, remaining: int | None = None) -> list[dict]:
    """Every layout and, for one that did not run, why not (see the module doc);
    ``remaining``: trials left."""
    measured, fits, open_ = prior.open_candidates(measurements)
    gain, _ = prior.values()
    best = float(gain[measured].max()) if len(measured) else -math.inf
    band, wide = prior.bands(gain, best, open_ & (fits >= LIKELY))
    _, uses = prior.split_arrays()
    # the wide band runs a candidate of a mechanism no measured candidate uses
    wide &= (uses & ~uses[measured].any(axis=0)).any(axis=1)
    out = []
    for key, layout in sorted(prior.layout_ids.items()):
        rows = prior.belief.layout == layout
        entry = {
            "layout": "dp{}·tp{}·pp{}·m{}".format(*key),
            "ran": prior.ran_layouts.get(layout, 0),
        }
        if not entry["ran"]:
            mine = rows & open_
            entry["why"] = _why_not(prior, rows, fits, open_, gain, best, band, wide, remaining)
            entry["reach"] = float(np.exp(gain[mine].max())) if mine.any() else None
        out.append(entry)
    return out


def _why_not(prior: Prior, rows, fits, open_, gain, best, band, wide, remaining) -> str:
    """Why the layout of candidates ``rows`` has not run."""
    if not (rows & open_).any():
        layout = prior.belief.layout[rows][0]
        if any(prior.belief.layout[i] == layout for i in prior.ooms):
            return "ran out of memory"
        if (rows & ~prior.tried & prior.belief.closed()).any():
            return "estimated at least as large as a candidate that ran out of memory"
        smallest = float(prior.belief.memory_gb[rows].min())
        return (
            f"predicted out of memory: {smallest:.3g} GB estimated against "
            f"{prior.limit_gb:.3g} GB, fits with p = {float(fits[rows].max()):.2g}"
        )
    value = math.exp(float(gain[rows & open_].max()))
    if prior.estimated:
        return f"its best estimate, {value:.4g} samples/s, ranked below the candidates that ran"
    if not math.isfinite(best):
        return f"nothing was measured (its best estimate {value:.4g} samples/s)"
    mine = f"its best corrected estimate, {value:.4g} samples/s,"
    measured = f"the best measured candidate's {math.exp(best):.4g}"
    left = "no trials left" if remaining == 0 else "not measured yet"
    narrow, broad = (-math.expm1(-w) for w in prior.widths())
    if (rows & band).any():
        return (
            f"{mine} is within the model's demonstrated error ({narrow:.0%}) of {measured}: {left}"
        )
    if (rows & wide).any():
        return (
            f"{mine} uses a parallel mechanism nothing measured uses and is within {broad:.0%} "
            f"of {measured}: {left}"
        )
    split, _ = prior.split_arrays()
    if np.isin(split[rows], prior.ran_splits()).all():
        return f"a variant of a parallel split that ran: {mine} against {measured}"
    return f"{mine} is more than the model's demonstrated error ({narrow:.0%}) below {measured}"
