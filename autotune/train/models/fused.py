"""Fused attention where the backend runs it: MindSpore's ``flash_attention_score`` in place of
a built-in model's attention core (``model.flash_attention``, MindFormers'
``use_flash_attention``).

MindSpore 2.10 has the fused operator on Ascend only (`autotune.spec.attention`; spec validation
refuses a model the operator cannot take on such a backend). It takes query, key and value as
(batch, heads, seq, head_dim) — ``input_layout="BNSD"`` — with fewer key/value heads than query
heads (grouped-query attention without repeating them), the causal mask as a (seq, seq) uint8
matrix whose ones are discarded (``sparse_mode=0``), and the 1/√d scale as ``scalar_value``.
The call is causal as MindFormers makes it (``LLamaAttention``'s ``FlashAttention``, mindspore-lab/
mindformers at 15218ea4, without ``use_attn_mask_compression``): ``pre_tokens`` 2³¹ − 1 and
``next_tokens`` 0 with that mask and ``sparse_mode`` 0 — the kernel skips the blocks above the
diagonal instead of computing and masking them (the compressed 2048 × 2048 mask with
``sparse_mode`` 2 is MindFormers' other form; not used here).

Contract: :func:`use_fused_attention` replaces the ``core`` of every attention cell of a
built-in network (both families keep their (seq × seq) work in that cell) by a
:class:`FusedCore` and returns how many it replaced; the cores' inputs and output are unchanged,
so selective recompute still targets them.
"""

from __future__ import annotations

import math

import mindspore as ms
from mindspore import nn, ops

CAUSAL_PRE_TOKENS = 2147483647  # every earlier token: MindFormers' pre_tokens


class FusedCore(nn.Cell):
    """Causal attention of ``heads`` query heads by the fused operator (see the module doc)."""

    def __init__(self, heads: int, head_dim: int, seq: int):
        super().__init__()
        self.heads, self.seq = heads, seq
        self.scale = 1.0 / math.sqrt(head_dim)

    def construct(self, q, k, v):
        mask = ops.triu(ops.ones((self.seq, self.seq), ms.uint8), 1)
        return ops.flash_attention_score(
            q,
            k,
            v,
            self.heads,
            attn_mask=mask,
            scalar_value=self.scale,
            pre_tokens=CAUSAL_PRE_TOKENS,
            next_tokens=0,
            input_layout="BNSD",
            sparse_mode=0,
        )


def use_fused_attention(network: nn.Cell, seq: int) -> int:
    """Give every attention cell of ``network`` (a cell with ``core``, ``heads`` and
    ``head_dim``) a :class:`FusedCore`; returns how many."""
    replaced = 0
    for _, cell in list(network.cells_and_names()):
        if hasattr(cell, "core") and hasattr(cell, "heads") and hasattr(cell, "head_dim"):
            cell.core = FusedCore(cell.heads, cell.head_dim, seq)
            replaced += 1
    return replaced
