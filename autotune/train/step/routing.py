"""The router's load statistics of a trial: `autotune.train.metrics.router_imbalance` over every
rank's counts (`autotune.train.step.engine.Engine.take_router_load`), and :func:`routed_slots`,
the total a rank counted (its ``metrics.rank<r>.json``). Summed over the ranks, a layout
counts each token's top-k slots once, as one process does (under tp each rank counts its block
of the tokens split over the tp group, `autotune.train.models.moe`) — but a pipeline stage
before the last counts its layers twice: its backward runs their forward again. Each layer's
counts are doubled alike, so ``router_imbalance``, a ratio per layer, is the same.

Contract: :func:`router_imbalance` is called by every rank after the last step (one all-reduce
when there is more than one rank and anything to count); importing this module does not import
MindSpore.
"""

from __future__ import annotations

import numpy as np

from autotune.train import metrics as metrics_mod


def router_imbalance(model: dict, placement, loads: list, first: int) -> float | None:
    """`autotune.train.metrics.router_imbalance` of the measured steps (``loads[first:]``), each
    layer's counts summed over every rank (one all-reduce: every rank calls this); None for a
    model without experts."""
    experts = model.get("num_experts") or 0
    if experts < 2:
        return None
    counts = np.zeros((len(loads) - first, model["num_layers"], experts), np.float32)
    for step, taken in enumerate(loads[first:]):
        for layer, load in taken.items():
            counts[step, layer] = load
    if placement.world > 1:
        from autotune.train.parallel.groups import world_sum

        counts = world_sum(counts)
    return metrics_mod.router_imbalance(counts.tolist())


def routed_slots(loads: list, first: int) -> float:
    """How many top-k slots this rank's MoE layers counted over the measured steps
    (``loads[first:]``): tokens × k × MoE layers for one process."""
    return float(sum(sum(map(sum, taken.values())) for taken in loads[first:]))
