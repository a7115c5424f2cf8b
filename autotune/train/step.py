"""The compiled training step: true gradient accumulation, DP all-reduce, dynamic loss scaling.

One optimizer step over K = ``grad_accum`` micro-batches is K calls: K-1 calls of the
*accumulate* cell (forward + backward, ``grad/K`` added into accumulators, no communication) and
one call of the *apply* cell (forward + backward of the last micro-batch added in the same way,
one all-reduce of the accumulators (mean over DP ranks), unscale, overflow check, optimizer,
accumulators zeroed). With K = 1
only the apply cell exists. The update equals one step over the concatenated micro-batches
(the loss is a mean, so the full-batch gradient is the mean of the micro-batch gradients).

Both cells are ordinary ``nn.Cell`` s, so they compile as graphs in GRAPH_MODE and run op by op
in PYNATIVE_MODE. (``nn.GradAccumulationCell`` sums K losses in one graph on CPU: K× the work
and no memory saving; it is not used.)

Loss scaling (float16 compute): gradients come from ``loss * scale``; after the all-reduce they
are unscaled and checked with ``isfinite``. The stock ``TrainOneStepWithLossScaleCell`` check
uses FloatStatus, which CPU lacks. The check runs on the *reduced* gradients, which are
identical on every rank, so ranks always agree on overflow without another all-reduce. An
overflowed step skips the optimizer; ``nn.DynamicLossScaleUpdateCell`` halves the scale on
overflow and doubles it after ``scale_window`` clean steps. With float32 compute loss scaling is
a no-op: scale 1, no check, never an overflow.

The loss returned by the apply cell is the mean over the whole global batch (it rides along in
the gradient all-reduce, so it costs no extra communication op).
"""

import mindspore as ms
from mindspore import nn, ops
from mindspore.common.parameter import ParameterTuple

_mul = ops.MultitypeFuncGraph("mul")
_accumulate = ops.MultitypeFuncGraph("accumulate")
_add = ops.MultitypeFuncGraph("add")
_zero = ops.MultitypeFuncGraph("zero")
_finite = ops.MultitypeFuncGraph("finite")


@_mul.register("Tensor", "Tensor")
def _mul_tensor(factor, grad):
    return grad * ops.cast(factor, grad.dtype)


@_accumulate.register("Tensor", "Tensor")
def _accumulate_tensor(acc, grad):
    return ops.assign_add(acc, grad)


@_add.register("Tensor", "Tensor")
def _add_tensor(acc, grad):
    return acc + grad


@_zero.register("Tensor")
def _zero_tensor(acc):
    return ops.assign(acc, ops.zeros_like(acc))


@_finite.register("Tensor")
def _finite_tensor(grad):
    return ops.isfinite(grad).all()


def set_compute_dtype(network: nn.Cell, dtype) -> nn.Cell:
    """Compute ``network`` in ``dtype`` (float16) with float32 parameters; norms stay float32.

    ``to_float`` rather than ``amp.auto_mixed_precision(net, "O2")``: O2 wraps cells and renames
    every parameter (``_backbone.…``), which would break checkpoints and the export's names.
    """
    network.to_float(dtype)
    for _, cell in network.cells_and_names():
        if isinstance(cell, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
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
    """State shared by the accumulate and apply cells: accumulators, loss sum, loss scale."""

    def __init__(self, weights, accum_steps, loss_scale, scale_window):
        super().__init__(auto_prefix=False)
        self.accum = weights.clone(prefix="accum", init="zeros") if accum_steps > 1 else ParameterTuple(())
        self.loss_sum = ms.Parameter(ms.Tensor(0.0, ms.float32), name="accum.loss", requires_grad=False)
        self.scale = ms.Parameter(ms.Tensor(float(loss_scale), ms.float32), name="loss_scale", requires_grad=False)
        self.updater = nn.DynamicLossScaleUpdateCell(float(loss_scale), scale_factor=2, scale_window=scale_window)


class TrainStep(nn.Cell):
    """One micro-step; ``apply`` selects the accumulate-only or the apply variant (see module doc).

    Accumulate returns the micro-batch loss; apply returns ``(loss, overflow, loss_scale)``: the
    global-batch mean loss, whether the update was skipped, and the scale this step used.
    """

    def __init__(self, net_with_loss, optimizer, state, *, accum_steps, apply, dp, scaling):
        super().__init__(auto_prefix=False)
        self.network = net_with_loss
        self.network.set_grad()
        self.weights = optimizer.parameters
        self.optimizer = optimizer
        self.state = state
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.accum_steps, self.apply, self.scaling = accum_steps, apply, scaling
        self.inv_k = ms.Tensor(1.0 / accum_steps, ms.float32)
        self.reducer = None
        if apply and dp > 1:
            # the loss sum rides along as one more "gradient" of the fused all-reduce
            self.reducer = nn.DistributedGradReducer(
                ParameterTuple(tuple(self.weights) + (state.loss_sum,)), mean=True, degree=dp)

    def construct(self, inputs, labels):
        scale = self.state.scale + 0.0  # a copy: the value this step uses, before any update
        loss = self.network(inputs, labels)
        grads = self.grad(self.network, self.weights)(inputs, labels, ops.ones_like(loss) * scale)
        if self.accum_steps > 1:
            grads = self.hyper_map(ops.partial(_mul, self.inv_k), grads)
            loss = loss * self.inv_k
            if not self.apply:
                grads = self.hyper_map(_accumulate, self.state.accum, grads)
                return ops.depend(ops.assign_add(self.state.loss_sum, loss), grads)
            # fresh sums, not assign_add: its result aliases the accumulator zeroed below
            grads = self.hyper_map(_add, self.state.accum, grads)
            loss = loss + self.state.loss_sum
        if self.reducer is not None:
            reduced = self.reducer(grads + (loss,))
            grads, loss = reduced[:-1], reduced[-1]
        if self.scaling:
            grads = self.hyper_map(ops.partial(_mul, ops.reciprocal(scale)), grads)
            finite = ops.stack(self.hyper_map(_finite, grads)).all()
            overflow = self.state.updater(self.state.scale, ops.logical_not(finite))
            if finite:
                loss = ops.depend(loss, self.optimizer(grads))
        else:
            overflow = ops.zeros((), ms.bool_)
            loss = ops.depend(loss, self.optimizer(grads))
        if self.accum_steps > 1:
            # zero the accumulators for the next step, after the update has consumed them
            zeroed = self.hyper_map(_zero, self.state.accum)
            loss = ops.depend(loss, ops.assign(self.state.loss_sum, ops.zeros_like(loss)))
            loss = ops.depend(loss, zeroed)
        return loss, overflow, scale


def build_steps(network, loss_fn, optimizer, *, accum_steps, dp, scaling, loss_scale, scale_window=1000,
                jit_level=None):
    """``(accumulate_cell or None, apply_cell)`` for ``network`` trained by ``optimizer``.

    ``scaling`` turns dynamic loss scaling on (float16 compute), starting at ``loss_scale``.
    ``jit_level`` (O0/O1/O2) is set on both cells when given (GRAPH_MODE only).
    """
    net_with_loss = NetWithLoss(network, loss_fn)
    state = TrainState(optimizer.parameters, accum_steps, loss_scale if scaling else 1.0, scale_window)
    cells = [TrainStep(net_with_loss, optimizer, state, accum_steps=accum_steps, apply=apply, dp=dp,
                       scaling=scaling) for apply in ((False, True) if accum_steps > 1 else (True,))]
    for cell in cells:
        cell.set_train()
        if jit_level:
            cell.set_jit_config(ms.JitConfig(jit_level=jit_level))
    return (cells[0] if accum_steps > 1 else None), cells[-1]
