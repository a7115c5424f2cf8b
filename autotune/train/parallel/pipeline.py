"""Pipeline parallelism: one rank's stage, driven through a 1F1B schedule of micro-batches.

Schedule (Narayanan et al. 2021 §2.2, Megatron-LM's non-interleaved 1F1B): stage s of p runs
W = min(p − s − 1, m) warm-up forwards, then m − W pairs of one forward and one backward, then W
cool-down backwards; a stage keeps at most W + 1 micro-batches in flight. Transfers go over the
two-rank pipeline links (`autotune.train.parallel.groups.Exchange`): in the steady phase "send forward,
receive backward" is one transfer of both, mirrored by the next stage's "send backward, receive
forward", so both ranks of a link issue the same transfers in the same order (for every p ≤ m,
checked by a test on the schedule itself).

Cells (compiled graphs, one set per stage):

- a non-last stage runs :class:`StageForward` for each micro-batch (its output is sent on) and,
  when the gradient of that output comes back, :class:`StageBackward`: forward and backward of the
  micro-batch again, as one graph. MindSpore compiles a backward together with its forward, so a
  non-last stage computes each forward twice; in exchange it keeps only the stage *input* of an
  in-flight micro-batch, not its activations (the cost model prices both).
- the last stage runs `autotune.train.step.train_step.AccumulateStep` (``input_grad``): forward, loss and
  backward of a micro-batch at once, returning the gradient for the previous stage.

Both backward cells add ``grad/m`` into the step's accumulators (and, under float16, each
gradient's count of exact zeros into the state's ``zeros``: `autotune.train.step.train_step.zero_counts`),
and `autotune.train.step.train_step.ApplyStep` updates once all micro-batches are through. The loss scale
multiplies the loss on the last stage, so every stage's gradients carry it and one unscale fixes
them all.
"""

from __future__ import annotations

from collections import deque

import mindspore as ms
from mindspore import nn, ops

from autotune.train.parallel.groups import Exchange, ExchangePair, Placement
from autotune.train.step.train_step import _accumulate, _mul, zero_counts


def schedule(stage: int, stages: int, micro: int) -> list[tuple]:
    """The 1F1B order of one stage: ``("F",)``, ``("B",)`` and link transfers
    ``("prev"|"next", kinds)`` where kinds ⊂ {SF: send forward, RF: receive forward, SB: send
    backward, RB: receive backward}. Pure: the engine follows it, a test checks the pairing."""
    warmup = min(stages - stage - 1, micro)
    steady = micro - warmup
    first, last = stage == 0, stage == stages - 1
    order = []
    for _ in range(warmup):
        order += (
            ([] if first else [("prev", ("RF",))])
            + [("F",)]
            + ([] if last else [("next", ("SF",))])
        )
    if steady and not first:
        order.append(("prev", ("RF",)))
    for i in range(steady):
        order += [("F",)] + ([] if last else [("next", ("SF", "RB"))]) + [("B",)]
        if not first:
            order.append(("prev", ("SB",) if i == steady - 1 else ("SB", "RF")))
    for _ in range(warmup):
        order += (
            ([] if last else [("next", ("RB",))])
            + [("B",)]
            + ([] if first else [("prev", ("SB",))])
        )
    return order


class StageForward(nn.Cell):
    """The stage's network, its output cast to the compute dtype (what crosses the link)."""

    update_free = True  # no part of the update (`autotune.train.runtime.compile_cache`)

    def __init__(self, network, dtype):
        super().__init__(auto_prefix=False)
        self.network, self.dtype = network, dtype

    def construct(self, x):
        return ops.cast(self.network(x), self.dtype)


class StageBackward(nn.Cell):
    """Forward and backward of a non-last stage for one micro-batch given the gradient of its
    output; adds ``grad/m`` into the accumulators and returns the input's gradient (the first
    stage's input is token ids: it returns a zero scalar instead)."""

    update_free = True  # no part of the update (`autotune.train.runtime.compile_cache`)

    def __init__(self, forward: StageForward, weights, state, micro: int, first: bool):
        super().__init__(auto_prefix=False)
        self.forward, self.weights, self.state = forward, weights, state
        self.forward.set_grad()
        self.first = first
        self.grad = ops.GradOperation(get_all=not first, get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.inv_m = ms.Tensor(1.0 / micro, ms.float32)

    def construct(self, x, dy):
        grads = self.grad(self.forward, self.weights)(x, dy)
        if self.first:
            params, dx = grads, ops.zeros((), ms.float32)
        else:
            params, dx = grads[1], grads[0][0]
        scaled = self.hyper_map(ops.partial(_mul, self.inv_m), params)
        accumulated = self.hyper_map(_accumulate, self.state.accum, scaled)
        if self.state.count_zeros:
            accumulated = ops.depend(
                accumulated, ops.assign_add(self.state.zeros, zero_counts(params))
            )
        return ops.depend(dx, accumulated)


class PipelineStage:
    """Runs one optimizer step of this rank's stage: the 1F1B schedule over ``micro`` micro-batches,
    then the update. ``boundary`` is the shape of the hidden state crossing a link for one
    micro-batch, ``dtype`` the compute dtype it crosses in."""

    def __init__(self, placement: Placement, cells: dict, micro: int, boundary: tuple, dtype):
        self.p, self.cells, self.micro = placement, cells, micro
        self.zeros = ops.zeros(boundary, dtype)
        self.links = {
            side: (Exchange(group), ExchangePair(group))
            for side, group in (("prev", placement.prev_link), ("next", placement.next_link))
            if group
        }
        self.order = schedule(placement.stage, placement.pp, micro)

    def _transfer(self, side: str, kinds: tuple, outgoing):
        """One transfer on a link; returns what this rank receives (or None)."""
        single, pair = self.links[side]
        if len(kinds) == 1:
            sending = kinds[0] in ("SF", "SB")
            received = single(outgoing if sending else self.zeros)
            return None if sending else received
        if side == "next":  # (SF, RB): send the activation, receive its gradient
            return pair(outgoing, self.zeros)[1]
        return pair(self.zeros, outgoing)[0]  # (SB, RF): send the gradient, receive an input

    def step(self, inputs: list, labels: list):
        """``inputs``/``labels``: per micro-batch (only the first stage reads inputs, only the
        last labels). Returns the apply cell's ``(loss, overflow, loss_scale)``."""
        forward, backward = self.cells.get("forward"), self.cells.get("backward")
        last_step, last = self.cells.get("last"), self.p.last
        kept, grads = deque(), deque()  # stage inputs awaiting backward; last stage: input grads
        received = y = dx = None
        f = 0
        for op in self.order:
            if op[0] == "F":
                x = inputs[f] if self.p.first else received
                if last:
                    grads.append(last_step(x, labels[f]))
                else:
                    kept.append(x)
                    y = forward(x)
                f += 1
            elif op[0] == "B":
                dx = grads.popleft() if last else backward(kept.popleft(), received)
            else:
                side, kinds = op
                outgoing = y if side == "next" else dx
                got = self._transfer(side, kinds, outgoing)
                if got is not None:
                    received = got
        return self.cells["apply"]()
