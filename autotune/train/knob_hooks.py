"""How the trial program applies each knob, registered by knob name.

Contract: :data:`APPLIES` is the trial program's `autotune.spec.knobs.KnobHooks`. A hook is
``hook(value, network, cfg)``: it shapes the rank's network for the knob's value (``cfg``: the
trial config), and `autotune.train.step.engine` calls the hooks of every knob of ``cfg["knobs"]`` on
the network it trains and on the float32 twin of the underflow probe alike, so both run the same
candidate; a network a knob cannot act on is a ``ConfigError`` naming ``knobs.<name>``. The knobs
that set the layout, the parallel context or the step's own arguments are stated ``in_place``
with the function that applies them. A hook registered outside autotune runs in a real trial
only when a module the trial imports registers it (a model.entry module, for one); on the
simulate and replay backends no trial program runs.

Importing this module does not import MindSpore.
"""

from __future__ import annotations

from autotune.spec.knobs import KnobHooks

APPLIES = KnobHooks("trial program")

for _name, _where, _why in (
    (
        "dp",
        "autotune.train.runtime.session:Session.place",
        "the layout: the rank's groups and parallel context",
    ),
    (
        "tp",
        "autotune.train.runtime.session:Session.place",
        "the layout: the rank's groups and its shard of every split layer",
    ),
    (
        "pp",
        "autotune.train.runtime.session:Session.place",
        "the layout: the rank's groups and its stage's layers",
    ),
    (
        "fusion_mb",
        "autotune.train.runtime.session:Session.place",
        "an argument of the parallel context the layout sets",
    ),
    (
        "micro_batches",
        "autotune.train.config:micro_steps",
        "the step's micro-batch count (with pipeline stages)",
    ),
    (
        "grad_accum",
        "autotune.train.config:micro_steps",
        "the step's micro-batch count (without pipeline stages)",
    ),
    (
        "loss_scale",
        "autotune.train.step.engine:build_engine",
        "the initial value of the step's loss scaler",
    ),
    (
        "warmup_steps",
        "autotune.train.step.engine:build_engine",
        "the optimizer's learning-rate schedule",
    ),
    (
        "jit_level",
        "autotune.train.step.engine:build_engine",
        "the execution mode and each step cell's jit config",
    ),
    (
        "parallel_optimizer",
        "autotune.train.step.engine:build_engine",
        "the optimizer's shards and the step's gathers",
    ),
    (
        "ep",
        "autotune.train.runtime.session:Session.place",
        "the layout: the rank's ep groups and its block of every MoE layer's experts",
    ),
    (
        "cp",
        "autotune.train.config_check:check_config",
        "refused above 1: the trainer splits no sequences (context parallelism is simulated)",
    ),
    (
        "ulysses",
        "autotune.train.config_check:check_config",
        "acts only with cp above 1, which the trainer refuses",
    ),
):
    APPLIES.in_place(_name, _where, _why)
