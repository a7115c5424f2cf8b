"""The router's load statistics of a trial: `autotune.train.metrics.router_imbalance` over every
rank's counts (`autotune.train.step.engine.Engine.take_router_load`).

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
    model without experts, and under tensor parallelism, where the layers count nothing
    (`autotune.train.models.moe`)."""
    experts = model.get("num_experts") or 0
    if experts < 2 or placement.tp > 1:
        return None
    counts = np.zeros((len(loads) - first, model["num_layers"], experts), np.float32)
    for step, taken in enumerate(loads[first:]):
        for layer, load in taken.items():
            counts[step, layer] = load
    if placement.world > 1:
        from autotune.train.parallel.groups import world_sum

        counts = world_sum(counts)
    return metrics_mod.router_imbalance(counts.tolist())
