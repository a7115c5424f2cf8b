"""The llama family's parts that its attentions share (`autotune.train.models.llama`, and the
latent attention of `autotune.train.models.mla`): RMSNorm, the rotary embedding and the causal
attention core, as the llama module's doc describes them."""

from __future__ import annotations

import math

import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import initializer

RMS_EPS = 1e-5
ROPE_THETA = 10000.0


class RMSNorm(nn.Cell):
    """x · rsqrt(mean(x²) + ε) · weight, computed in float32 (the weight is float32 too)."""

    keep_float32 = True  # `autotune.train.step.train_step.set_compute_dtype` leaves it in float32

    def __init__(self, dim: int):
        super().__init__()
        self.weight = ms.Parameter(initializer("ones", (dim,), ms.float32))

    def construct(self, x):
        x32 = ops.cast(x, ms.float32)
        normed = x32 * ops.rsqrt((x32 * x32).mean(axis=-1, keep_dims=True) + RMS_EPS)
        return normed * self.weight


def rotary_tables(seq: int, head_dim: int):
    """(cos, sin) of the rotary angles, (seq, head_dim) float32: position × θ^(−2i/head_dim),
    the frequencies repeated over both halves. Made in the graph: a tensor attribute would be
    cast to the compute dtype through numpy, which has no bfloat16."""
    inv = ops.exp(ops.arange(0, head_dim, 2, dtype=ms.float32) * (-math.log(ROPE_THETA) / head_dim))
    angles = ops.arange(0, seq, dtype=ms.float32).expand_dims(1) * inv.expand_dims(0)
    angles = ops.concat((angles, angles), axis=-1)
    return ops.cos(angles), ops.sin(angles)


def rotate(x, cos, sin):
    """The rotary embedding of ``x`` (batch, heads, seq, head_dim): x·cos + rotate_half(x)·sin,
    rotate_half(x) = [−x₂, x₁] of x's two halves; in float32, returned in x's dtype."""
    x32 = ops.cast(x, ms.float32)
    half = x.shape[-1] // 2
    rotated = ops.concat((-x32[..., half:], x32[..., :half]), axis=-1)
    return ops.cast(x32 * cos + rotated * sin, x.dtype)


class AttentionCore(nn.Cell):
    """Causal softmax(q·kᵀ/√d)·v, key/value heads repeated over their query heads. A cell of its
    own so that selective recompute targets exactly the (seq × seq) tensors."""

    def __init__(self, seq: int, head_dim: int, group: int):
        super().__init__()
        self.seq, self.group = seq, group
        self.scale = 1.0 / math.sqrt(head_dim)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(axis=-1)

    def _repeat(self, x):
        """(b, kv, s, d) → (b, kv·group, s, d): head j of the result is head j // group."""
        if self.group == 1:
            return x
        b, kv, s, d = x.shape
        return ops.broadcast_to(x.expand_dims(2), (b, kv, self.group, s, d)).reshape(
            b, kv * self.group, s, d
        )

    def construct(self, q, k, v):
        scores = self.qk(q, self._repeat(k)) * self.scale
        # the mask is made here: a tensor attribute would be cast through numpy (no bfloat16)
        mask = ops.triu(ops.full((self.seq, self.seq), -1.0e4, dtype=ms.float32), 1)
        probs = self.softmax(ops.cast(scores, ms.float32) + mask)  # float32: fp16 exp overflows
        return self.pv(ops.cast(probs, q.dtype), self._repeat(v))
