"""One rank's trainer for its place in the layout: the network part, optimizer and step function.

Contract: :func:`build_engine` returns an :class:`Engine` whose ``step(inputs, labels)`` runs one
optimizer step on this rank's shard of a global batch (``inputs``/``labels``: the dp shard as numpy
arrays, split here into the step's micro-batches) and returns ``(loss, overflow, loss_scale)`` as
numpy values: the global-batch mean loss (the same on every rank), whether the update was skipped,
and the scale the step used. Without pipeline stages a step is `autotune.train.step.train_step`'s
accumulate/apply cells; with them, `autotune.train.parallel.pipeline`'s 1F1B schedule and apply cell.

Under float16 compute every step also counts its gradients' exact zeros, and
``underflow(inputs, labels, scale, world_sum)`` applies `autotune.train.step.probe`'s rule on the
last step's dp shard: the bound from those counts, and the probe only when the bound does not
settle it (built on first use, so a run that never needs it pays nothing); without float16
``scaled`` is False and there is nothing to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import initializer
from mindspore.common.parameter import ParameterTuple

from autotune import layout
from autotune.families import takes_tokens
from autotune.spec.backends import BACKENDS, DEFAULT_BACKEND
from autotune.train import models
from autotune.train.config import ConfigError, micro_steps
from autotune.train.knob_hooks import APPLIES
from autotune.train.models import entry, fused
from autotune.train.parallel import pipeline
from autotune.train.parallel import sharding as sharding_mod
from autotune.train.parallel.groups import Placement
from autotune.train.step import probe as probe_mod
from autotune.train.step import schedule
from autotune.train.step import train_step as step

COMPUTE = {"float16": ms.float16, "bfloat16": ms.bfloat16, "float32": ms.float32}


@dataclass
class Engine:
    network: object
    optimizer: object
    state: object  # autotune.train.step.train_step.TrainState: loss scale, accumulators
    dataset: object
    # (list of micro inputs, list of micro labels) → (loss, overflow, scale) tensors, and the
    # step's zero counts under float16
    run_micro: object
    micro: int
    make_probe: object = None  # () → autotune.train.step.probe.UnderflowProbe (float16 only)
    sharding: object = (
        None  # autotune.train.parallel.sharding.Sharding under the parallel optimizer
    )
    bound: object = None  # autotune.train.step.probe.UnderflowBound (float16 only)
    probe_always: bool = False  # trial.underflow_probe "always": the probe runs whatever the bound
    fused_attention: bool = (
        False  # a fused flash-attention kernel: the bound stands (probe.measure)
    )
    # the MoE layers' load counters, {layer index: float32 (E,) Parameter}
    # (`autotune.train.models.moe`)
    routers: dict = None
    _probe: object = None
    _last: tuple = None  # the last step's (zero counts tensor, scale, overflow)

    def take_router_load(self) -> dict:
        """``{layer index: [tokens routed to each expert]}`` of this rank's MoE layers since the
        last call (top-k slots of its tokens; a forward a stage runs twice counts twice), and
        clears the counters."""
        taken = {}
        for layer, load in (self.routers or {}).items():
            taken[layer] = load.asnumpy().tolist()
            # in place: set_data would give the parameter new storage, which the compiled step
            # graphs (holding the counter as a free variable) do not see
            ops.assign(load, ms.Tensor(np.zeros(load.shape, np.float32)))
        return taken

    @property
    def scaled(self) -> bool:
        """Whether the run computes in float16 (loss-scaled: there is an underflow to measure)."""
        return self.bound is not None

    def step(self, inputs, labels):
        n = len(inputs) // self.micro
        xs = [ms.Tensor(inputs[j * n : (j + 1) * n]) for j in range(self.micro)]
        ys = [ms.Tensor(labels[j * n : (j + 1) * n]) for j in range(self.micro)]
        out = self.run_micro(xs, ys)
        loss, overflow, scale = (o.asnumpy() for o in out[:3])
        if self.scaled:  # the counts stay a tensor: read once, after the last step
            self._last = (out[3], float(scale), bool(overflow))
        return loss, overflow, scale

    def underflow(self, inputs, labels, scale: float, world_sum, **rule) -> dict:
        """`autotune.train.step.probe.measure` on the last step, whose dp shard ``inputs``/``labels``
        are, at the final loss scale ``scale``: the underflow metrics of metrics.json.
        ``rule``: `measure`'s ``out_of_memory`` and ``before_probe``."""
        bound = None
        if self._last is not None:
            counts, used, overflow = self._last
            if not overflow and used == scale:  # else the last step says nothing about this scale
                bound = self.bound(counts.asnumpy(), inputs)

        def probe():
            if self._probe is None:
                self._probe = self.make_probe()
            return self._probe(inputs, labels, scale)

        return probe_mod.measure(
            bound,
            probe,
            world_sum,
            always=self.probe_always,
            fused_attention=self.fused_attention,
            **rule,
        )


def _decays(param) -> bool:
    return len(param.shape) > 1


def optimizer_order(params, first=frozenset()) -> list:
    """``params`` in the order the optimizer holds them (decayed matrices first, and of them the
    names in ``first`` — the routed experts `autotune.train.step.train_step.Parallelism` reduces
    apart), which is the order its gradients must come in."""
    params = list(params)
    decayed = [p for p in params if _decays(p)]
    return (
        [p for p in decayed if p.name in first]
        + [p for p in decayed if p.name not in first]
        + [p for p in params if not _decays(p)]
    )


def _routed_experts(model: dict, placement: Placement) -> frozenset:
    """Names of the rank's routed experts whose tokens come from other ranks too (under ep, or
    tp's token split: `autotune.train.models.moe`), reduced apart; none otherwise."""
    p = placement
    if model.get("entry") or (p.ep == 1 and p.tp == 1):
        return frozenset()
    plan, _ = layout.builtin_layout(model, p.tp, p.pp, p.ep)
    return frozenset(name for name, lay in plan.items() if lay.ep_split and lay.stage == p.stage)


def make_optimizer(params, learning_rate, state_dtype=ms.float32):
    """AdamW (β 0.9/0.95, GPT-style) over ``params`` (the network's trainable parameters, or
    their shards under the parallel optimizer), weight decay 0.1 on matrices only (not norms,
    biases), its moments in ``state_dtype`` (``model.optimizer_dtype``). Moments of another dtype
    than their parameter — float32 moments of float16 parameters, MindFormers'
    FP32StateAdamWeightDecay — take MindSpore's unfused update, which computes in float32 and
    stores each buffer in its own dtype (the fused kernel wants one dtype). The optimizer's
    parameters come in :func:`optimizer_order`."""
    groups = [
        {"params": [p for p in params if _decays(p)], "weight_decay": 0.1},
        {"params": [p for p in params if not _decays(p)], "weight_decay": 0.0},
    ]
    optimizer = nn.AdamWeightDecay(
        [g for g in groups if g["params"]],
        learning_rate=learning_rate,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
    )
    if any(p.dtype != state_dtype for p in optimizer.parameters):

        def moments(prefix):
            return ParameterTuple(
                ms.Parameter(initializer("zeros", p.shape, state_dtype), name=f"{prefix}.{p.name}")
                for p in optimizer.parameters
            )

        optimizer.moments1, optimizer.moments2 = moments("adam_m"), moments("adam_v")
        optimizer.use_fused_opt = False
    return optimizer


def _boundary(model: dict, micro_batch: int) -> tuple:
    """Shape of the hidden state one micro-batch sends between pipeline stages."""
    if takes_tokens(model.get("family")):
        return (micro_batch, model["seq_length"], model["hidden_size"])
    return (micro_batch, model["hidden_size"])


def _owned(cfg: dict, placement: Placement, network) -> set:
    """Names of the parameters whose gradient elements this rank counts for the underflow share:
    those a tp group replicates on tp index 0 only (their gradients are the same on every tp rank)."""
    model = cfg["model"]
    if model.get("entry"):
        return {p.name for p in network.trainable_params()}
    plan, _ = layout.builtin_layout(model, placement.tp, placement.pp, placement.ep)
    return {
        name for name, lay in plan.items() if lay.split_dim is not None or placement.tp_index == 0
    }


def _probe_factory(cfg: dict, placement: Placement, network, loss_fn, micro: int, jit_level, owned):
    """What builds the rank's underflow probe: its float32 twin (the same network without float16
    compute, with the candidate's recompute) counting the ``owned`` parameters."""
    model = cfg["model"]

    def make():
        twin = (
            entry.build(cfg, placement)[0]
            if model.get("entry")
            else models.build_network(model, placement)
        )
        APPLIES.call(cfg["knobs"], twin, cfg)  # as the candidate trains: its memory, not more
        micro_batch = cfg["train"]["global_batch_size"] // (placement.dp * micro)
        return probe_mod.UnderflowProbe(
            network,
            twin,
            loss_fn,
            placement,
            micro=micro,
            owned=owned,
            boundary=_boundary(model, micro_batch),
            jit_level=jit_level,
        )

    return make


def _routers(network) -> dict:
    """The load counters of ``network``'s MoE layers by layer index (none for other models)."""
    return {
        cell.index: cell.counter.load
        for _, cell in network.cells_and_names()
        if hasattr(cell, "counter") and hasattr(cell, "index")
    }


@APPLIES.register("recompute")
def _apply_recompute(mode: str, network, cfg: dict) -> None:
    if mode == "none":
        return
    if not hasattr(network, "apply_recompute"):
        raise ConfigError("knobs.recompute: the network has no apply_recompute(mode) method")
    network.apply_recompute(mode)


def build_engine(cfg: dict, placement: Placement, scale_window: int) -> Engine:
    knobs, model, train, trial = cfg["knobs"], cfg["model"], cfg["train"], cfg["trial"]
    ms.set_seed(cfg.get("seed", 0))  # an entry model draws its own weights: identical on every rank
    network, loss_fn, dataset = entry.build(cfg, placement)
    fused_attention = bool(
        model.get("flash_attention")
        and not model.get("entry")
        and BACKENDS[cfg.get("backend", DEFAULT_BACKEND)].fused_attention
    )
    if fused_attention:
        fused.use_fused_attention(network, model["seq_length"])
    dtype = model.get("dtype", "float32")
    if dtype != "float32":
        step.set_compute_dtype(network, COMPUTE[dtype])
    if model.get("param_dtype", "float32") != "float32":
        step.set_param_dtype(network, COMPUTE[model["param_dtype"]])
    APPLIES.call(knobs, network, cfg)
    if trial.get("schedule", "compressed") == "full":
        warmup, total = knobs["warmup_steps"], train["total_steps"]
    else:
        warmup, total = schedule.trial_schedule(
            knobs["warmup_steps"], train["total_steps"], trial["steps"]
        )
    p, micro = placement, micro_steps(knobs)
    experts = _routed_experts(model, p)
    weights = ParameterTuple(optimizer_order(network.trainable_params(), experts))
    sharding = None
    if knobs.get("parallel_optimizer"):
        sharding = sharding_mod.plan(
            weights, model, p, layout.DTYPE_BYTES[model.get("param_dtype", "float32")]
        )
    optimizer = make_optimizer(
        list(weights) if sharding is None else sharding.update_params,
        schedule.WarmupCosineLR(train["learning_rate"], warmup, total),
        COMPUTE[model.get("optimizer_dtype", "float32")],
    )
    scaling = dtype == "float16"
    parallel = step.Parallelism(
        p.dp,
        p.dp_group,
        agree=p.tp > 1 or p.pp > 1 or p.ep > 1,
        loss_weight=1.0 / (p.dp * p.tp) if p.last else 0.0,
        experts=len(experts),
        expert_group=p.expert_group,
        expert_replicas=p.expert_replicas,
    )
    jit_level = None if knobs["jit_level"] == "pynative" else knobs["jit_level"]
    loss_scale = knobs["loss_scale"] if scaling else 1.0
    make_probe = bound = None
    if scaling:
        owned = _owned(cfg, p, network)
        make_probe = _probe_factory(cfg, p, network, loss_fn, micro, jit_level, owned)
        bound = probe_mod.UnderflowBound(network, weights, owned, micro)
    probe_rule = trial.get("underflow_probe", "auto")
    if probe_rule not in ("auto", "always"):
        raise ConfigError(f"trial.underflow_probe: {probe_rule!r} is not auto or always")
    measures = dict(
        routers=_routers(network),
        make_probe=make_probe,
        bound=bound,
        probe_always=probe_rule == "always",
        fused_attention=fused_attention,
    )
    if p.pp == 1:
        accumulate, apply = step.build_steps(
            network,
            loss_fn,
            optimizer,
            accum_steps=micro,
            scaling=scaling,
            loss_scale=loss_scale,
            scale_window=scale_window,
            jit_level=jit_level,
            parallel=parallel,
            weights=weights,
            sharding=sharding,
        )

        def run_micro(xs, ys):
            if accumulate is None:
                return apply(xs[0], ys[0])
            for x, y in zip(xs, ys):
                accumulate(x, y)
            return apply()

        return Engine(
            network,
            optimizer,
            apply.state,
            dataset,
            run_micro,
            micro,
            sharding=sharding,
            **measures,
        )

    state = step.TrainState(weights, micro, loss_scale, scale_window, count_zeros=scaling)
    cells = {
        "apply": step.ApplyStep(
            optimizer,
            state,
            accum_steps=micro,
            scaling=scaling,
            parallel=parallel,
            weights=weights,
            sharding=sharding,
        )
    }
    if p.last:
        cells["last"] = step.AccumulateStep(
            step.NetWithLoss(network, loss_fn), weights, state, micro, input_grad=True
        )
    else:
        cells["forward"] = pipeline.StageForward(network, COMPUTE[dtype])
        cells["backward"] = pipeline.StageBackward(
            pipeline.StageForward(network, COMPUTE[dtype]), weights, state, micro, p.first
        )
    for cell in cells.values():
        cell.set_train()
        if jit_level:
            cell.set_jit_config(ms.JitConfig(jit_level=jit_level))
    micro_batch = train["global_batch_size"] // (p.dp * micro)
    stage = pipeline.PipelineStage(p, cells, micro, _boundary(model, micro_batch), COMPUTE[dtype])
    return Engine(
        network, optimizer, state, dataset, stage.step, micro, sharding=sharding, **measures
    )
