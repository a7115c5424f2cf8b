"""Megatron-style tensor-parallel layers (Shoeybi et al. 2019), on explicit collectives.

Each layer holds this tp rank's block of its weights, with the parameter names and full-tensor
meaning of `autotune.families` (Dense weights are (out, in), as MindSpore stores them), so the
contiguous split `autotune.layout` describes is exactly what a rank holds. With ``tp = 1`` they are
the plain layers, with no collective in the graph.

- :class:`ColumnParallelDense`: weight (out/tp, in), bias (out/tp): this rank's share of the
  outputs. The input enters through :class:`~autotune.train.parallel.groups.CopyToGroup`.
- :class:`RowParallelDense`: weight (out, in/tp) applied to this rank's share of the inputs; the
  partial products are summed by :class:`~autotune.train.parallel.groups.ReduceFromGroup`, and the
  whole bias is added once, after the sum.
- Both take ``bias=False`` for a layer without one (MindFormers' llama has none).
- :class:`VocabParallelEmbedding`: rows [t·V/tp, (t+1)·V/tp) of the token table; ids outside them
  look up zeros, and the sum over the group completes every row (:func:`vocab_lookup`, which a
  table of another name uses too). It is a token table for the underflow bound only when its
  builder declares it read by the input ids alone (``ids_only``).
- :class:`VocabParallelCrossEntropy`: the mean cross-entropy of logits split over the vocabulary,
  without gathering them: a common shift (the global max), the sum of exponentials and the target
  logit are each summed over the group.

Weights are created as zeros of the local shape; `autotune.train.models.weights` fills them.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import initializer

from autotune.train.parallel.groups import CopyToGroup, GatherMax, ReduceFromGroup


def _zeros(*shape):
    return ms.Parameter(initializer("zeros", shape, ms.float32))


_matmul_nt = ops.MatMul(transpose_b=True)  # x·Wᵀ without materialising Wᵀ


def _linear(x, weight, bias):
    """x·Wᵀ + b over the last axis, computed in x's dtype (parameters stay float32)."""
    shape = x.shape
    y = _matmul_nt(x.reshape(-1, shape[-1]), ops.cast(weight, x.dtype))
    if bias is not None:
        y = y + ops.cast(bias, x.dtype)
    return y.reshape(shape[:-1] + (weight.shape[0],))


class ColumnParallelDense(nn.Cell):
    def __init__(
        self, in_dim: int, out_dim: int, tp: int = 1, group: str | None = None, bias: bool = True
    ):
        super().__init__()
        self.weight = _zeros(out_dim // tp, in_dim)
        self.bias = _zeros(out_dim // tp) if bias else None
        self.copy = CopyToGroup(group) if tp > 1 else None

    def construct(self, x):
        if self.copy is not None:
            x = self.copy(x)
        return _linear(x, self.weight, self.bias)


class RowParallelDense(nn.Cell):
    def __init__(
        self, in_dim: int, out_dim: int, tp: int = 1, group: str | None = None, bias: bool = True
    ):
        super().__init__()
        self.weight = _zeros(out_dim, in_dim // tp)
        self.bias = _zeros(out_dim) if bias else None
        self.reduce = ReduceFromGroup(group) if tp > 1 else None

    def construct(self, x):
        y = _linear(x, self.weight, None)
        if self.reduce is not None:
            y = self.reduce(y)
        if self.bias is None:
            return y
        return y + ops.cast(self.bias, y.dtype)


def vocab_lookup(table, ids, start: int, reduce):
    """Rows ``ids`` of a token table of which this rank holds rows [start, start + len(table));
    ``reduce`` (the group's sum, or None for a whole table) completes them."""
    if reduce is None:
        return ops.gather(table, ids, 0)
    local = ids - start
    mine = ops.logical_and(local >= 0, local < table.shape[0])
    rows = ops.gather(table, ops.select(mine, local, ops.zeros_like(local)), 0)
    return reduce(rows * ops.cast(mine, rows.dtype).expand_dims(-1))


class VocabParallelEmbedding(nn.Cell):
    """``ids_only``: its builder declares that the table is read only by looking up the model's
    input ids — not tied to a head, not looked up by positions — so a row no input id selects
    gets no gradient (`autotune.train.step.probe.token_tables`). The built-in families declare it;
    a table of a user's network is none unless its builder says so."""

    def __init__(
        self,
        vocab: int,
        hidden: int,
        tp: int = 1,
        tp_index: int = 0,
        group: str | None = None,
        ids_only: bool = False,
    ):
        super().__init__()
        self.start = tp_index * (vocab // tp)
        self.embedding_table = _zeros(vocab // tp, hidden)
        self.reduce = ReduceFromGroup(group) if tp > 1 else None
        self.ids_only = ids_only

    @property
    def token_table(self):
        """``(table, start)`` when declared ``ids_only``, else None: see
        `autotune.train.step.probe.token_tables`."""
        return (self.embedding_table, self.start) if self.ids_only else None

    def construct(self, ids):
        return vocab_lookup(self.embedding_table, ids, self.start, self.reduce)


class VocabParallelCrossEntropy(nn.Cell):
    """Mean cross-entropy of logits (..., V/tp) — this rank's vocabulary block — against integer
    labels (...), equal to the cross-entropy of the gathered logits.

    Backward, each rank's logits get softmax − one-hot of its own block: the sums' gradients pass
    unchanged (`ReduceFromGroup`) and the shift carries none (`GatherMax`)."""

    def __init__(self, vocab: int, tp: int, tp_index: int, group: str):
        super().__init__()
        self.rows = vocab // tp
        self.start = tp_index * self.rows
        self.global_max = GatherMax(group, tp, tp_index)
        self.sum = ReduceFromGroup(group)

    def construct(self, logits, labels):
        logits = logits.reshape(-1, self.rows)
        labels = labels.reshape(-1)
        shifted = logits - self.global_max(ops.stop_gradient(logits.max(axis=-1))).expand_dims(-1)
        sum_exp = self.sum(ops.exp(shifted).sum(axis=-1))
        local = labels - self.start
        mine = ops.logical_and(local >= 0, local < self.rows)
        index = ops.select(mine, local, ops.zeros_like(local)).expand_dims(-1)
        target = self.sum(
            ops.gather_elements(shifted, 1, index).squeeze(-1) * ops.cast(mine, shifted.dtype)
        )
        return (ops.log(sum_exp) - target).mean()


class TokenCrossEntropy(nn.Cell):
    """Mean cross-entropy of whole logits (..., classes) against integer labels (...)."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, labels):
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def cross_entropy(vocab: int, tp: int, tp_index: int, group: str | None) -> nn.Cell:
    """The loss of a head that is split over ``tp`` ranks (whole when tp = 1)."""
    if tp == 1:
        return TokenCrossEntropy()
    return VocabParallelCrossEntropy(vocab, tp, tp_index, group)
