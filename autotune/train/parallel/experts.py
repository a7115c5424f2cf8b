"""Expert parallelism's collectives: Megatron-LM's all-gather token dispatcher on the collectives
this CPU has (docs/parallel.md, "Expert parallelism").

MindSpore 2.10 on CPU has no ``AlltoAll`` or ``ReduceScatter`` kernel, and its ``AllGather``
serves the world group only; ``AllReduce`` works on any group (docs/mindspore-cpu.md). So every
operator here is an all-reduce: a gather is an all-reduce of rows each rank writes into zeros
(its own row), the combine's reduce-scatter an all-reduce of which each rank keeps its own row.
Each has its conjugate as its backward, so gradients are exact:

- :class:`GatherRows`: (T, …) on each of ``n`` ranks → (n, T, …), row i rank i's; backward, the
  gradients of row i from every rank are summed and rank i keeps them.
- :class:`ReduceRows`: (n, T, …) partial results on each rank → the sum over ranks of row i on
  rank i; backward, rank i's gradient goes back to row i of every rank (a gather).
- :class:`SplitTokens` / :class:`JoinTokens`: under tensor parallelism a rank's tokens are its tp
  group's; the MoE layer takes block t of them on tp rank t (sequence parallelism around the
  experts, as MindFormers requires it with tp: `autotune.spec.constraints.expert_reasons`) and
  joins the blocks after it. Split's backward joins the gradient blocks, join's keeps its own.

Contract: ``group`` None is the world group; ``size`` ranks, this one ``index``.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops


def _all_reduce(group: str | None):
    return ops.AllReduce(group=group) if group else ops.AllReduce()


class _Rows(nn.Cell):
    def __init__(self, group: str | None, size: int, index: int):
        super().__init__()
        self.all_reduce = _all_reduce(group)
        self.own_row = ms.Tensor(np.eye(size, dtype=np.float32)[index])
        self.size, self.index = size, index

    def gather(self, x):
        """(…) → (size, …): every rank's ``x``, by the all-reduce of this rank's row."""
        mask = self.own_row.reshape((self.size,) + (1,) * x.ndim).astype(x.dtype)
        return self.all_reduce(mask * x.expand_dims(0))

    def own(self, rows):
        """(size, …) → this rank's row of their sum over the group."""
        return self.all_reduce(rows)[self.index]


class GatherRows(_Rows):
    def construct(self, x):
        return self.gather(x)

    def bprop(self, x, out, dout):
        return (self.own(dout),)


class ReduceRows(_Rows):
    def construct(self, rows):
        return self.own(rows)

    def bprop(self, rows, out, dout):
        return (self.gather(dout),)


class SplitTokens(_Rows):
    """(T, h) → rows [i·T/n, (i+1)·T/n) (T must divide by n)."""

    def construct(self, x):
        block = x.shape[0] // self.size
        return x[self.index * block : (self.index + 1) * block]

    def bprop(self, x, out, dout):
        return (self.gather(dout).reshape(x.shape),)


class JoinTokens(_Rows):
    """(T/n, h) on each rank → (T, h), the blocks in rank order."""

    def construct(self, x):
        return self.gather(x).reshape((-1,) + x.shape[1:])

    def bprop(self, x, out, dout):
        block = x.shape[0]
        return (dout[self.index * block : (self.index + 1) * block],)
