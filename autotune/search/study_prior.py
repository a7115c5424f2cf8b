"""Whether a study gets the cost model as its prior, and what the study is told about it.

Contract: :func:`usable` is whether the cost model can rank a study's candidates: it estimates
one of the study's objectives (`autotune.search.prior.ESTIMATED`; ``final_loss`` is not) and the
model has dimensions it can price. :func:`prior_for` is the `autotune.search.prior.Prior` of a
study's spec, or None — its sampler is not ``auto``, the cost model cannot rank its candidates,
or it predicts none fits — and tells the study's ``note`` which, or what it ranked and, given
the study's trial count, when the study is too short to measure every parallel split that could
be the best (`autotune.search.layouts.worth_measuring`).
"""

from __future__ import annotations

import math

from autotune.costmodel.estimate import default_engine
from autotune.costmodel.workload import workload_for
from autotune.search.acquisition import UNMEASURED
from autotune.search.layouts import worth_measuring
from autotune.search.prior import ESTIMATED, Prior


def usable(spec) -> bool:
    """Whether the cost model can rank this study's candidates (see the module doc)."""
    return (
        any(o in ESTIMATED for o in spec.search.objectives) and workload_for(spec.model) is not None
    )


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
    worth = worth_measuring(prior)
    note(
        f"auto: the cost model ranks {len(prior.candidates)} candidates in "
        f"{len(prior.layout_ids)} layouts ({default_engine(spec)}'s steps); the baseline "
        "runs first, then the candidates likeliest to improve on the best measured one, by "
        "the estimate corrected by every measurement — and first each parallel split within "
        "what the model may be off by of the best measured"
    )
    if n_trials is not None and worth > n_trials - 1:
        note(
            f"auto: {worth} parallel splits are estimated within {math.expm1(UNMEASURED):.0%} "
            f"of the best, and {n_trials - 1} trials follow the baseline: the rest are judged by "
            "what the measured ones teach (autotune show lists them)"
        )
    return prior
