"""How the cost model prices each knob, registered by knob name.

Contract: :data:`PRICES` is the cost model's `autotune.spec.knobs.KnobHooks`. A knob the cost
model estimates (``Knob.estimable``) is either priced by a registered hook,
``hook(value, spec, candidate, times, memory)``, which adds its effect to the estimate's
breakdown parts (``times``: seconds per step by part, ``memory``: GB per device by part; the
keys of `autotune.costmodel.estimate`'s breakdown) before the calibration applies, or stated
``in_place``: the layout and the knobs that shape it are woven through the physics
(`autotune.costmodel.memory`, `autotune.costmodel.step_time`). A knob the cost model does not
estimate says why in its entry (``Knob.unestimated_because``) and needs neither.
"""

from __future__ import annotations

from autotune.spec.knobs import KnobHooks

PRICES = KnobHooks("cost model")

_LAYOUT = "the layout sets every part of the step: compute, communication, bubble and memory"
for _name, _where, _why in (
    ("dp", "autotune.costmodel.step_time:step_time", _LAYOUT),
    ("tp", "autotune.costmodel.step_time:step_time", _LAYOUT),
    ("pp", "autotune.costmodel.step_time:step_time", _LAYOUT),
    (
        "micro_batches",
        "autotune.costmodel.estimate:estimate",
        "the micro-batch size and count every part of the step is priced at",
    ),
    (
        "grad_accum",
        "autotune.costmodel.estimate:estimate",
        "the micro-batch size and count every part of the step is priced at",
    ),
    (
        "fusion_mb",
        "autotune.costmodel.collectives:dp_exposed",
        "the bucket size sets how much of the data-parallel all-reduce overlaps the backward",
    ),
    (
        "recompute",
        "autotune.costmodel.step_time:step_time",
        "each stage's recompute modes change its compute, traffic and activations",
    ),
    (
        "parallel_optimizer",
        "autotune.costmodel.memory:shards_optimizer",
        "sharded optimizer states and the gathers they need, in memory and in time",
    ),
    (
        "ep",
        "autotune.costmodel.moe_time:moe_parts",
        "the experts' all-to-alls and the busiest rank's wait; their states split in memory",
    ),
    (
        "cp",
        "autotune.costmodel.moe_time:moe_parts",
        "the key/value ring; every token-proportional cost split over the cp ranks",
    ),
    (
        "ulysses",
        "autotune.costmodel.moe_time:ulysses_exchange",
        "the heads' all-to-alls inside the group; the key/value ring over the rest of cp",
    ),
):
    PRICES.in_place(_name, _where, _why)
