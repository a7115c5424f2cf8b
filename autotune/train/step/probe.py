"""The underflow probe: which gradient elements float16 flushes to zero that float32 keeps.

A loss scale that is too small lets float16 gradients underflow: elements whose true value is
below float16's smallest subnormal (2^-24 ≈ 6e-8, after scaling) come out exactly zero and the
update loses them. The scaler never notices (nothing overflows), and its growth window (1000
clean steps) is longer than a trial, so a trial cannot see it by running. The probe measures it;
a bound read off the last training step decides whether it needs to run (:func:`measure`).

The rule (:func:`measure`, the metrics it returns are metrics.json's):

- ``underflow_bound`` z: the share of this step's float16 gradient elements that are exactly
  zero, over the last step's own micro-batches (counted inside the step's graph,
  `autotune.train.step.train_step.zero_counts`, before the dp all-reduce; elements and ranks counted as the
  probe counts them), less the *structural* zeros — the rows of a token table (:func:`token_tables`)
  that no id of the micro-batch selects, zero in float32 too, known from the host's ids. An
  element the probe counts (zero in float16, non-zero in float32) is a zero that is not
  structural, so on the same weights u ≤ z exactly (tests/train/test_underflow_bound.py: on dp2, tp2
  and pp2 at scales 2^-12…2^10, and z = u there: no other gradient element of the built-in
  transformer is exactly zero in float32). The probe runs after the last update, on weights one
  update later: on the tiny GPT's trials its u exceeded the last step's z by at most 1.1e-6
  (one element of 933,376) and fell below it by up to 2.3 % of z (docs/mindspore-cpu.md). z = 1
  (no bound) when the last step overflowed or ran at another scale than the final one.
- ``z ≤ SKIP_BELOW``: the probe does not run and ``underflow_share`` is z, the bound: goodput's
  (1 − u) factor is then off by at most z ≤ 0.1 %, on the conservative side — at least ten times
  under the noise floor of confirmed studies (a few percent), so it cannot reorder candidates
  the confirm phase can tell apart; and every share the diagnosis alarms at (1 %,
  `autotune.costmodel.diagnosis.UNDERFLOW_ALARM`) is measured. Else (and always with
  ``trial.underflow_probe: always``) the probe runs and ``underflow_share`` is its u.
  ``underflow_probed`` says which.

Contract: :class:`UnderflowProbe` ``(inputs, labels, scale) → (kept, elements)`` for this rank:
over the micro-batches of the given dp shard (split as a training step splits it), ``kept``
counts the gradient elements that are exactly zero in the float16 backward with the loss scale
``scale`` and non-zero in a float32 backward of the same micro-batch; ``elements`` is the number
of (micro-batch, element) pairs looked at. Summed over the world (one all-reduce, the caller's),
kept / elements is ``underflow_share``. The training state is untouched: no optimizer, scaler or
accumulator is read or written, only the weights are read.

How, on every layout the engine runs:

- float16 side: this rank's own network (the training one: float16 compute, float32 weights)
  under a new gradient cell; the loss is multiplied by ``scale`` as in training. Zero-ness does
  not change when the float32 gradient is unscaled, so the masks are taken before unscaling.
- float32 side: a *twin* of the rank's network built from the same config without float16
  compute, whose parameters are replaced by the training network's own Parameter objects (no
  copy of the weights is made).
- Under pipeline stages a stage's backward needs the gradient of its output from the next stage,
  so each side runs the engine's 1F1B schedule (`autotune.train.parallel.pipeline.PipelineStage`) over
  one micro-batch at a time: float16 first (each rank keeps a boolean zero mask per parameter),
  then float32 (compares with the masks and counts). Tensor-parallel collectives run inside both
  sides, as in training.
- Counted once: parameters a tensor-parallel group replicates are counted on tp index 0 only
  (their gradients are identical on every tp rank). Data-parallel replicas count their own
  micro-batches. So for the same micro-batch size data parallelism and pipeline stages give the
  single process's share exactly, and tensor parallelism — whose ranks sum partial products in
  float16 before their all-reduce, rounding and flushing differently — one of the same order
  (tests/train/test_parallel.py, `test_underflow_share_is_counted_once_under_every_layout`: 26 % fewer
  zeros under tp2 at a loss scale of 1). Smaller micro-batches (accumulation) give noisier,
  sparser gradients and a different share: that is the configuration's own.

Cost: two forward + backward passes of each micro-batch of one shard, two or (non-last pipeline
stages) four more compiled graphs, and one float16 gradient set plus a byte per parameter
element for the masks while it runs — on the tiny GPT's trials 1.4–1.9× their 25 measured
steps (docs/mindspore-cpu.md, "The underflow probe and its bound"), which is why the bound
decides first. The bound costs a zero count per gradient in every float16 step (one HyperMap: under
1 ms of a ~90 ms tiny GPT step, ~0.1 s of its graph's compile) and, after the last one, host
arithmetic and one eager all-reduce: 0.01–0.04 s, under 0.5 % of the measured steps.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.parameter import ParameterTuple

from autotune.train.parallel.pipeline import PipelineStage, StageForward
from autotune.train.step.train_step import NetWithLoss

_is_zero = ops.MultitypeFuncGraph("is_zero")
_kept = ops.MultitypeFuncGraph("kept")


@_is_zero.register("Tensor")
def _is_zero_tensor(grad):
    return ops.equal(grad, 0)


@_kept.register("Tensor", "Tensor")
def _kept_tensor(zero_in_half, grad):
    return ops.cast(ops.logical_and(zero_in_half, ops.not_equal(grad, 0)), ms.int32).sum()


def share_parameters(twin: nn.Cell, network: nn.Cell) -> None:
    """Make ``twin`` (built like ``network``) hold ``network``'s Parameter objects."""
    cells = dict(network.cells_and_names())
    for path, cell in twin.cells_and_names():
        for key in list(cell._params):  # the attribute names a cell's construct reads
            setattr(cell, key, cells[path]._params[key])
    if [id(p) for p in twin.get_parameters()] != [id(p) for p in network.get_parameters()]:
        raise RuntimeError("the float32 twin of the network does not have the network's structure")


class _Pass(nn.Cell):
    """Forward and backward of one micro-batch of this rank's stage with respect to ``weights``.

    ``target``: the labels on the last stage, else the gradient of the stage's output; ``sens``:
    the loss scale on the last stage (unused elsewhere). Returns the gradient of the stage's input
    (a zero scalar on the first stage, whose inputs are ids) and the parameters' gradients.
    """

    update_free = True  # no part of the update (`autotune.train.runtime.compile_cache`)

    def __init__(self, network, loss_fn, weights, *, first: bool, last: bool, dtype):
        super().__init__(auto_prefix=False)
        self.forward = NetWithLoss(network, loss_fn) if last else StageForward(network, dtype)
        self.forward.set_grad()
        self.weights = weights
        self.first, self.last = first, last
        self.grad = ops.GradOperation(get_all=not first, get_by_list=True, sens_param=True)

    def gradients(self, x, target, sens):
        if self.last:
            grads = self.grad(self.forward, self.weights)(x, target, sens)
        else:
            grads = self.grad(self.forward, self.weights)(x, target)
        if self.first:
            return ops.zeros((), ms.float32), grads
        return grads[0][0], grads[1]


class ZeroMasks(_Pass):
    """The float16 side: ``(dx, masks)``, ``masks[i]`` = gradient i is exactly zero."""

    def construct(self, x, target, sens):
        dx, grads = self.gradients(x, target, sens)
        return dx, ops.HyperMap()(_is_zero, grads)


class KeptCounts(_Pass):
    """The float32 side: ``(dx, counts)``, ``counts[i]`` = elements of gradient i that are zero
    in ``masks[i]`` (float16) and non-zero here."""

    def construct(self, x, target, sens, masks):
        dx, grads = self.gradients(x, target, sens)
        return dx, ops.stack(ops.HyperMap()(_kept, masks, grads))


class _Collect:
    """A probe cell in the place of a pipeline backward cell: returns ``dx``, keeps the rest."""

    def __init__(self, cell):
        self.cell, self.extra, self.result = cell, (), None

    def __call__(self, x, target):
        dx, self.result = self.cell(x, target, *self.extra)
        return dx


class UnderflowProbe:
    """See the module doc. ``network``: the rank's training network (float16 compute); ``twin``:
    the same network built without float16 compute; ``owned``: names of the parameters this rank
    counts; ``boundary``: the shape a micro-batch's hidden state has between pipeline stages."""

    def __init__(
        self, network, twin, loss_fn, placement, *, micro: int, owned, boundary, jit_level=None
    ):
        share_parameters(twin, network)
        params = [p for p in network.trainable_params() if p.name in owned]
        self.elements = sum(int(np.prod(p.shape)) for p in params)
        weights = ParameterTuple(params)
        self.placement, self.micro = placement, micro
        where = dict(first=placement.first, last=placement.last)
        self.half = ZeroMasks(network, loss_fn, weights, dtype=ms.float16, **where)
        self.full = KeptCounts(twin, loss_fn, weights, dtype=ms.float32, **where)
        cells = [self.half, self.full]
        if placement.pp > 1:
            self.stages = {}
            for name, cell, net, dtype in (
                ("half", self.half, network, ms.float16),
                ("full", self.full, twin, ms.float32),
            ):
                collect = _Collect(cell)
                stage_cells = {"apply": lambda collect=collect: collect.result}
                if placement.last:
                    stage_cells["last"] = collect
                else:
                    stage_cells["backward"] = collect
                    stage_cells["forward"] = StageForward(net, dtype)
                    cells.append(stage_cells["forward"])
                self.stages[name] = (
                    collect,
                    PipelineStage(placement, stage_cells, 1, boundary, dtype),
                )
        for cell in cells:
            cell.set_train()
            if jit_level:
                cell.set_jit_config(ms.JitConfig(jit_level=jit_level))

    def _pipeline(self, name, x, y, *extra):
        """One micro-batch through the stages' 1F1B schedule; returns this rank's cell result."""
        collect, stage = self.stages[name]
        collect.extra = extra
        return stage.step([x], [y])

    def __call__(self, inputs, labels, scale: float):
        n = len(inputs) // self.micro
        sens, one = ms.Tensor(float(scale), ms.float32), ms.Tensor(1.0, ms.float32)
        kept = 0
        for j in range(self.micro):
            x, y = ms.Tensor(inputs[j * n : (j + 1) * n]), ms.Tensor(labels[j * n : (j + 1) * n])
            if self.placement.pp == 1:
                masks = self.half(x, y, sens)[1]
            else:
                masks = self._pipeline("half", x, y, sens)
            masks = ms.mutable(
                tuple(masks)
            )  # a variable input: a constant tuple recompiles per call
            if self.placement.pp == 1:
                counts = self.full(x, y, one, masks)[1]
            else:
                counts = self._pipeline("full", x, y, one, masks)
            kept += int(counts.asnumpy().astype(np.int64).sum())
        return kept, self.elements * self.micro


SKIP_BELOW = 1e-3  # the bound under which the probe is skipped (see the module doc)


def token_tables(network) -> list:
    """``[(parameter, start)]``: the token tables of ``network`` — every cell whose
    ``token_table`` attribute is ``(table, start)`` (not None), by which its builder declares a
    table whose row i is the embedding of id start + i and is read *only* by looking up the
    model's input ids: its gradient is a sum over the micro-batch's ids that select it, so a row
    no id selects is exactly zero, in float16 and float32 alike. A table tied to the head, or
    looked up by positions, is not one (its rows get gradients no input id explains): the
    built-in families declare theirs (`autotune.train.parallel.tp_layers.VocabParallelEmbedding`
    ``ids_only``), a user's network none unless it says so, and then the bound subtracts
    nothing for it — a larger bound, the probe run where it must."""
    return [
        cell.token_table
        for _, cell in network.cells_and_names()
        if getattr(cell, "token_table", None) is not None
    ]


class UnderflowBound:
    """This rank's part of the bound: ``(zero_counts, inputs) → (zeros, elements)`` where
    ``zero_counts`` is the step's count of exact zeros per gradient of ``weights`` (summed over
    its ``micro`` micro-batches), ``inputs`` the step's dp shard; ``zeros`` counts the ``owned``
    parameters' zeros less the structural ones, ``elements`` the (micro-batch, element) pairs."""

    def __init__(self, network, weights, owned, micro: int):
        self.counted = np.array([p.name in owned for p in weights], bool)
        self.elements = sum(int(np.prod(p.shape)) for p in weights if p.name in owned) * micro
        self.tables = [
            (start, int(table.shape[0]), int(np.prod(table.shape[1:])))
            for table, start in token_tables(network)
            if table.name in owned
        ]
        self.micro = micro

    def structural(self, ids) -> int:
        """Elements of the token tables that the micro-batch ``ids`` leaves exactly zero."""
        zeros = 0
        for start, rows, width in self.tables:
            selected = np.unique(ids[(ids >= start) & (ids < start + rows)]).size
            zeros += (rows - selected) * width
        return zeros

    def __call__(self, zero_counts, inputs):
        n = len(inputs) // self.micro
        structural = sum(self.structural(inputs[j * n : (j + 1) * n]) for j in range(self.micro))
        return int(np.asarray(zero_counts)[self.counted].sum()) - structural, self.elements


def measure(
    bound,
    probe,
    world_sum,
    *,
    always: bool = False,
    fused_attention: bool = False,
    out_of_memory=lambda exc: isinstance(exc, MemoryError),
    before_probe=None,
) -> dict:
    """The rule of the module doc: ``bound`` is this rank's ``(zeros, elements)`` or None (no
    bound: the same on every rank, which agree on overflows and scale), ``probe`` a callable
    returning this rank's ``(kept, elements)`` (`UnderflowProbe`), ``world_sum(values)`` the
    values summed over all ranks. Every rank takes the same branch (the probe's collectives need
    them all). Returns ``underflow_share``, ``underflow_bound``, ``underflow_probed`` and
    ``underflow_note`` (None, or why the share the rule asked for was not measured):

    - ``fused_attention`` (the candidate runs a fused flash-attention kernel, which a float32
      twin cannot: it would hold the s² scores the candidate never holds): the probe does not
      run, the bound stands (u := z, conservative).
    - The probe out of memory on any rank (``out_of_memory(exc)``: the backend's words):
      ``underflow_share`` None and the note; goodput then takes the bound
      (`autotune.train.metrics.StepLog.summary`). It never fails the trial.
    - ``before_probe(z)``: called just before the probe runs (the program writes the training's
      metrics then, so a trial stopped while it probes keeps them).
    """
    z = 1.0 if bound is None else _ratio(world_sum([float(bound[0]), float(bound[1])]))
    if z <= SKIP_BELOW and not always:
        return {
            "underflow_share": z,
            "underflow_bound": z,
            "underflow_probed": False,
            "underflow_note": None,
        }
    if fused_attention:
        return {
            "underflow_share": z,
            "underflow_bound": z,
            "underflow_probed": False,
            "underflow_note": "flash attention: the float32 probe cannot run the fused "
            "kernel, so the bound stands for the share",
        }
    if before_probe is not None:
        before_probe(z)
    note = None
    try:
        kept, elements = probe()
    except Exception as exc:  # noqa: BLE001  (out of memory is the probe's, not the trial's)
        if not out_of_memory(exc):
            raise
        kept = elements = 0
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        note = f"out of memory in the underflow probe: {type(exc).__name__}: {first}"[:500]
    kept, elements, failed = world_sum([float(kept), float(elements), float(note is not None)])
    if failed:
        return {
            "underflow_share": None,
            "underflow_bound": z,
            "underflow_probed": False,
            "underflow_note": note or "out of memory in the underflow probe on another rank",
        }
    return {
        "underflow_share": _ratio([kept, elements]),
        "underflow_bound": z,
        "underflow_probed": True,
        "underflow_note": None,
    }


def _ratio(pair) -> float:
    part, whole = pair
    return float(part) / float(whole)
