"""The compiled training step: true gradient accumulation, the DP all-reduce, dynamic loss scaling.

One optimizer step over K micro-batches (K = ``grad_accum``, or ``micro_batches`` under pipeline
stages) adds each micro-batch's ``grad/K`` into float32 accumulators and then *updates*: the
gradients all-reduced over dp (mean), unscaled, checked, applied, accumulators zeroed. The update equals one step over the concatenated micro-batches (the loss is a
mean, so the full-batch gradient is the mean of the micro-batch gradients).

Without pipeline stages and with K > 1 a step is K calls of :class:`AccumulateStep` (forward +
backward, added into the accumulators, no communication) and one of :class:`ApplyStep` (the
update alone); with K = 1 it is one call of :class:`TrainStep` (forward, backward and update in
one graph) and nothing is accumulated. Under pipeline stages the stage's forward/backward cells
(`autotune.train.parallel.pipeline`) accumulate, and :class:`ApplyStep` updates. So each step graph that
holds a forward and backward is compiled once per trial: the update of K > 1 is a graph of its
own, not a second copy of the forward and backward with the update on top (docs/mindspore-cpu.md,
"What a new graph costs": that copy was ~2 s of every accumulating trial's compile).

The DP all-reduce is MindSpore's ``nn.DistributedGradReducer``: over the world group under pure
data parallelism, over the rank's dp group otherwise; either way its all-reduces are bucketed by
the ``comm_fusion`` threshold of the parallel context (``fusion_mb``). Routed experts whose
tokens came from other ranks are reduced over the ranks that hold the same experts instead
(:class:`Parallelism`).

Loss scaling (float16 compute): gradients come from ``loss * scale``; after the all-reduce they
are unscaled and checked with ``isfinite`` (the stock FloatStatus check has no CPU kernel). Under
pure data parallelism the reduced gradients are identical on every rank, so ranks agree without
more communication. With tensor or pipeline parallelism each rank checks its own gradients, and
one all-reduce over the world sums the non-finite counts — together with the loss, which only the
last stage knows — so every rank skips the same steps. ``nn.DynamicLossScaleUpdateCell`` halves
the scale on overflow and doubles it after ``scale_window`` clean steps. Float32 and bfloat16
compute need no loss scaling: scale 1, no check, never an overflow.
"""

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.parameter import ParameterTuple

from autotune.spec.knobs import SCALE_WINDOW

_mul = ops.MultitypeFuncGraph("mul")
_accumulate = ops.MultitypeFuncGraph("accumulate")
_zero = ops.MultitypeFuncGraph("zero")
_finite = ops.MultitypeFuncGraph("finite")
_zeros = ops.MultitypeFuncGraph("zeros")
_hyper_map = ops.HyperMap()


@_mul.register("Tensor", "Tensor")
def _mul_tensor(factor, grad):
    # in float32: 1 / loss scale underflows a float16 factor (2⁻³² is below its smallest)
    return ops.cast(ops.cast(grad, ms.float32) * ops.cast(factor, ms.float32), grad.dtype)


@_accumulate.register("Tensor", "Tensor")
def _accumulate_tensor(acc, grad):
    return ops.assign_add(acc, ops.cast(grad, acc.dtype))


@_zero.register("Tensor")
def _zero_tensor(acc):
    return ops.assign(acc, ops.zeros_like(acc))


@_finite.register("Tensor")
def _finite_tensor(grad):
    return ops.isfinite(grad).all()


@_zeros.register("Tensor")
def _zeros_tensor(grad):
    return ops.reduce_sum(ops.cast(ops.equal(grad, 0.0), ms.int64))


def zero_counts(grads):
    """int64 vector: how many elements of each gradient are exactly zero (``-0.0`` too). The
    numerator of the underflow bound (`autotune.train.step.probe`); read-only, so the step's numerics
    are untouched. One HyperMap of equal + cast + sum: at run time 0.2–0.8 ms a step on the
    tiny GPT's 1.8 MB of gradients, and at compile time ~0.1 s where a list of
    ``ops.count_nonzero`` calls took ~1 s of every step graph's compile (docs/mindspore-cpu.md,
    "The underflow probe and its bound", "What a new graph costs")."""
    return ops.stack(_hyper_map(_zeros, grads))


def _keeps_float32(cell) -> bool:
    return isinstance(
        cell, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    ) or getattr(cell, "keep_float32", False)


def set_param_dtype(network: nn.Cell, dtype) -> nn.Cell:
    """Keep ``network``'s parameters in ``dtype`` (``model.param_dtype``, MindFormers'
    ``param_init_type``), their gradients and accumulators with them; a norm's stay float32,
    as MindFormers keeps them in ``layernorm_compute_type``."""
    kept = {
        id(p)
        for _, cell in network.cells_and_names()
        if _keeps_float32(cell)
        for p in cell.get_parameters(expand=False)
    }
    for param in network.get_parameters():
        if id(param) not in kept and param.dtype != dtype:
            param.set_dtype(dtype)
    return network


def set_compute_dtype(network: nn.Cell, dtype) -> nn.Cell:
    """Compute ``network`` in ``dtype`` (float16) with float32 parameters; norms stay float32
    (MindSpore's, and any cell with ``keep_float32 = True``, as the llama family's RMSNorm).

    ``to_float`` rather than ``amp.auto_mixed_precision(net, "O2")``: O2 wraps cells and renames
    every parameter (``_backbone.…``), which would break checkpoints and the export's names.
    """
    network.to_float(dtype)
    for _, cell in network.cells_and_names():
        if _keeps_float32(cell):
            cell.to_float(ms.float32)
    return network


class NetWithLoss(nn.Cell):
    """loss_fn(float32(network(inputs)), labels): the loss is always computed in float32."""

    def __init__(self, network, loss_fn):
        super().__init__(auto_prefix=False)  # keep the network's parameter names
        self.network = network
        self.loss_fn = loss_fn

    def construct(self, inputs, labels):
        return self.loss_fn(ops.cast(self.network(inputs), ms.float32), labels)


class TrainState(nn.Cell):
    """State shared by a step's cells: accumulators, loss sum, loss scale and its updater.

    ``count_zeros`` (float16 compute): the step also counts each gradient's exactly-zero elements
    over its micro-batches (:func:`zero_counts`), summed in ``zeros`` when there are several.
    """

    def __init__(self, weights, accum_steps, loss_scale, scale_window, count_zeros=False):
        super().__init__(auto_prefix=False)
        self.accum = (
            weights.clone(prefix="accum", init="zeros") if accum_steps > 1 else ParameterTuple(())
        )
        self.loss_sum = ms.Parameter(
            ms.Tensor(0.0, ms.float32), name="accum.loss", requires_grad=False
        )
        self.count_zeros = count_zeros
        if count_zeros and accum_steps > 1:
            self.zeros = ms.Parameter(
                ms.Tensor(np.zeros(len(weights), np.int64)), name="accum.zeros", requires_grad=False
            )
        self.scale = ms.Parameter(
            ms.Tensor(float(loss_scale), ms.float32), name="loss_scale", requires_grad=False
        )
        self.updater = nn.DynamicLossScaleUpdateCell(
            float(loss_scale), scale_factor=2, scale_window=scale_window
        )


@dataclass(frozen=True)
class Parallelism:
    """How a step's update communicates: ``dp`` replicas (``dp_group`` None: the world group),
    and whether ranks must agree over the world (tensor, pipeline or expert parallelism), in
    which case ``loss_weight`` is this rank's share of the reported loss (1/(dp·tp) on the last
    stage, 0 elsewhere).

    ``experts``: how many of the weights, first in their order, are routed experts whose tokens
    came from other ranks too (`autotune.train.models.moe`: under ep or tp). Their gradients sum
    the contributions of the distinct tokens of an ep group, so they are summed over the
    ``expert_replicas`` ranks that hold the same experts (``expert_group``; None: the world)
    and divided by ``dp`` — the mean over the dp replicas of the whole model's gradient.
    """

    dp: int = 1
    dp_group: str | None = None
    agree: bool = False
    loss_weight: float = 1.0
    experts: int = 0
    expert_group: str | None = None
    expert_replicas: int = 1


class _Update(nn.Cell):
    """Reduce over dp, unscale, agree on overflow, update, zero the accumulators."""

    def __init__(
        self,
        optimizer,
        state,
        *,
        accum_steps,
        scaling,
        parallel: Parallelism,
        weights=None,
        sharding=None,
    ):
        super().__init__(auto_prefix=False)
        # the network's weights: the optimizer's own parameters unless it updates shards of them
        self.weights = optimizer.parameters if weights is None else weights
        self.optimizer = optimizer
        self.sharding = sharding  # autotune.train.parallel.sharding.Sharding, or None
        self.state = state
        self.hyper_map = ops.HyperMap()
        self.accum_steps, self.scaling = accum_steps, scaling
        self.reducer = self.expert_reducer = self.expert_scale = None
        self.loss_rides = not parallel.agree
        self.experts = parallel.experts
        weights = tuple(self.weights)
        if parallel.dp > 1:
            group = {"group": parallel.dp_group} if parallel.dp_group else {}
            # Pure DP: the loss sum rides along as one more "gradient" of the fused all-reduce.
            reduced = weights[self.experts :] + ((state.loss_sum,) if self.loss_rides else ())
            self.reducer = nn.DistributedGradReducer(
                ParameterTuple(reduced), mean=True, degree=parallel.dp, **group
            )
        if self.experts and parallel.expert_replicas > 1:
            group = {"group": parallel.expert_group} if parallel.expert_group else {}
            self.expert_reducer = nn.DistributedGradReducer(
                ParameterTuple(weights[: self.experts]), mean=True, degree=parallel.dp, **group
            )
        elif self.experts and parallel.dp > 1:  # one rank holds these experts: / dp only
            self.expert_scale = ms.Tensor(1.0 / parallel.dp, ms.float32)
        self.agree = ops.AllReduce() if parallel.agree else None
        self.loss_weight = ms.Tensor(parallel.loss_weight, ms.float32)

    def update(self, grads, loss, scale):
        """Returns ``(loss, overflow)`` once the update (or the skip) is done."""
        experts, grads = grads[: self.experts], grads[self.experts :]  # () and all: no experts
        if self.expert_reducer is not None:
            experts = self.expert_reducer(experts)
        if self.expert_scale is not None:
            experts = self.hyper_map(ops.partial(_mul, self.expert_scale), experts)
        if self.reducer is not None:
            if self.loss_rides:
                reduced = self.reducer(grads + (loss,))
                grads, loss = reduced[:-1], reduced[-1]
            else:
                grads = self.reducer(grads)
        grads = experts + grads
        finite = ops.ones((), ms.bool_)
        if self.scaling:
            grads = self.hyper_map(ops.partial(_mul, ops.reciprocal(scale)), grads)
            finite = ops.stack(self.hyper_map(_finite, grads)).all()
        if self.agree is not None:
            verdict = self.agree(
                ops.stack((1.0 - ops.cast(finite, ms.float32), loss * self.loss_weight))
            )
            finite, loss = verdict[0] < 0.5, verdict[1]
        if self.scaling:
            overflow = self.state.updater(self.state.scale, ops.logical_not(finite))
        else:
            overflow = ops.zeros((), ms.bool_)
        if finite:
            if self.sharding is None:
                loss = ops.depend(loss, self.optimizer(grads))
            else:
                updated = ops.depend(
                    ops.zeros((), ms.float32), self.optimizer(self.sharding.cut(grads))
                )
                loss = ops.depend(loss, self.sharding.gather(updated))
        if self.accum_steps > 1:
            # zero the accumulators for the next step, after the update has consumed them
            zeroed = self.hyper_map(_zero, self.state.accum)
            loss = ops.depend(loss, ops.assign(self.state.loss_sum, ops.zeros_like(loss)))
            if self.state.count_zeros:
                loss = ops.depend(
                    loss, ops.assign(self.state.zeros, ops.zeros_like(self.state.zeros))
                )
            loss = ops.depend(loss, zeroed)
        return loss, overflow


class TrainStep(_Update):
    """One optimizer step on one batch, without pipeline stages or accumulation: returns
    ``(loss, overflow, loss_scale)``: the batch's mean loss, whether the update was skipped, and
    the scale this step used — and, when the state counts zeros, the step's :func:`zero_counts`.
    """

    def __init__(
        self, net_with_loss, optimizer, state, *, scaling, parallel, weights=None, sharding=None
    ):
        super().__init__(
            optimizer,
            state,
            accum_steps=1,
            scaling=scaling,
            parallel=parallel,
            weights=weights,
            sharding=sharding,
        )
        self.network = net_with_loss
        self.network.set_grad()
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, inputs, labels):
        scale = self.state.scale + 0.0  # a copy: the value this step uses, before any update
        loss = self.network(inputs, labels)
        grads = self.grad(self.network, self.weights)(inputs, labels, ops.ones_like(loss) * scale)
        zeros = zero_counts(grads) if self.state.count_zeros else None
        loss, overflow = self.update(grads, loss, scale)
        return (loss, overflow, scale, zeros) if self.state.count_zeros else (loss, overflow, scale)


class AccumulateStep(nn.Cell):
    """Forward and backward of one of a step's K micro-batches: adds ``grad/K`` into the
    accumulators and ``loss/K`` into the loss sum (and the zero counts into the state's); no
    communication, no update. Returns the loss sum so far — or, with ``input_grad`` (a pipeline's
    last stage, `autotune.train.parallel.pipeline`), the gradient of the input, for the previous stage."""

    update_free = True  # no part of the update (`autotune.train.runtime.compile_cache`)

    def __init__(self, net_with_loss, weights, state, accum_steps, input_grad=False):
        super().__init__(auto_prefix=False)
        self.network, self.weights, self.state = net_with_loss, weights, state
        self.network.set_grad()
        self.input_grad = input_grad
        self.grad = ops.GradOperation(get_all=input_grad, get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.inv_k = ms.Tensor(1.0 / accum_steps, ms.float32)

    def construct(self, inputs, labels):
        loss = self.network(inputs, labels)
        grads = self.grad(self.network, self.weights)(
            inputs, labels, ops.ones_like(loss) * self.state.scale
        )
        params = grads[1] if self.input_grad else grads
        counted = (
            ops.assign_add(self.state.zeros, zero_counts(params))
            if self.state.count_zeros
            else loss
        )
        scaled = self.hyper_map(ops.partial(_mul, self.inv_k), params)
        params = self.hyper_map(_accumulate, self.state.accum, scaled)
        done = ops.depend(
            ops.depend(ops.assign_add(self.state.loss_sum, loss * self.inv_k), params), counted
        )
        return ops.depend(grads[0][0], done) if self.input_grad else done


class ApplyStep(_Update):
    """The update once a step's micro-batches were accumulated (:class:`AccumulateStep`, or a
    pipeline stage's backward cells): returns ``(loss, overflow, loss_scale)`` (and the zero
    counts) as :class:`TrainStep` does."""

    def construct(self):
        scale = self.state.scale + 0.0
        ones = ops.ones((), ms.float32)
        # copies: the accumulators themselves are zeroed once the update has consumed them
        grads = self.hyper_map(ops.partial(_mul, ones), self.state.accum)
        zeros = self.state.zeros + 0 if self.state.count_zeros else None
        loss, overflow = self.update(grads, self.state.loss_sum + 0.0, scale)
        return (loss, overflow, scale, zeros) if self.state.count_zeros else (loss, overflow, scale)


def build_steps(
    network,
    loss_fn,
    optimizer,
    *,
    accum_steps,
    scaling,
    loss_scale,
    scale_window=SCALE_WINDOW,
    jit_level=None,
    parallel: Parallelism | None = None,
    weights=None,
    sharding=None,
):
    """``(accumulate_cell or None, apply_cell)`` for ``network`` trained by ``optimizer`` without
    pipeline stages: with K = ``accum_steps`` > 1 a step is K calls of the :class:`AccumulateStep`
    (one per micro-batch) and one of the :class:`ApplyStep` (no inputs); with K = 1 one call of
    the :class:`TrainStep` (``accumulate_cell`` None).

    ``scaling`` turns dynamic loss scaling on (float16 compute), starting at ``loss_scale``, and
    the zero counts of the underflow bound with it.
    ``jit_level`` (O0/O1/O2) is set on the cells when given (GRAPH_MODE only). ``sharding``
    (`autotune.train.parallel.sharding`): the optimizer updates shards of ``weights`` (the network's
    trainable parameters in the optimizer's order; default: the optimizer's own parameters).
    """
    parallel = parallel or Parallelism()
    net_with_loss = NetWithLoss(network, loss_fn)
    weights = optimizer.parameters if weights is None else weights
    state = TrainState(
        weights, accum_steps, loss_scale if scaling else 1.0, scale_window, count_zeros=scaling
    )
    update = dict(scaling=scaling, parallel=parallel, weights=weights, sharding=sharding)
    if accum_steps > 1:
        cells = [
            AccumulateStep(net_with_loss, weights, state, accum_steps),
            ApplyStep(optimizer, state, accum_steps=accum_steps, **update),
        ]
    else:
        cells = [TrainStep(net_with_loss, optimizer, state, **update)]
    for cell in cells:
        cell.set_train()
        if jit_level:
            cell.set_jit_config(ms.JitConfig(jit_level=jit_level))
    return (cells[0] if accum_steps > 1 else None), cells[-1]
