"""The ``transformer`` family: a GPT-style decoder, for one rank of a layout (the package doc).

Token ids (batch, seq) → logits (batch, seq, vocab / tp). Token + position embedding (first
stage), pre-LayerNorm blocks (causal multi-head attention with a fused QKV projection, MLP
h→ffn→h with GELU), final LayerNorm and untied LM head (last stage). A middle or last stage maps
the hidden state (batch, seq, h) instead of ids, a non-last stage returns it. The fused QKV
weight is head-major: its rows are (heads, [q, k, v], head_dim), so tp rank t's contiguous block
is heads [t·heads/tp, (t+1)·heads/tp) with their own Q, K and V. Recompute: ``full`` every block,
``selective`` each attention core (scores, mask, softmax, ·V — the (seq × seq) tensors, as
Megatron-LM's selective recompute).
"""

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from autotune.train.models.registry import LN_EPS, SINGLE, network, stage_blocks
from autotune.train.parallel.groups import Placement
from autotune.train.parallel.tp_layers import (
    ColumnParallelDense,
    RowParallelDense,
    VocabParallelEmbedding,
)

MASK_VALUE = -1.0e4  # large enough to zero a softmax term, small enough to stay finite in float16


class Embedding(nn.Cell):
    """Vocab-parallel token embedding plus a learned position embedding (inputs ``seq`` long)."""

    def __init__(self, vocab, seq, hidden, p: Placement):
        super().__init__()
        # read only by the input ids (the head is untied): a token table for the underflow bound
        self.tok = VocabParallelEmbedding(
            vocab, hidden, p.tp, p.tp_index, p.tp_group, ids_only=True
        )
        self.pos = nn.Embedding(seq, hidden)
        self.positions = ms.Tensor(np.arange(seq, dtype=np.int32)[None, :])

    def construct(self, ids):
        return self.tok(ids) + self.pos(self.positions)


class CausalAttentionCore(nn.Cell):
    """softmax(q·kᵀ/√d + causal mask)·v on (batch, heads, seq, head_dim); no parameters.

    A cell of its own so that selective recompute can target exactly the (seq × seq) tensors.
    """

    def __init__(self, seq, head_dim):
        super().__init__()
        self.seq = seq
        self.scale = 1.0 / float(np.sqrt(head_dim))
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, q, k, v):
        scores = self.qk(q, k) * self.scale
        # softmax in float32 whatever the compute dtype: float16 exp() overflows easily
        # The mask is made here, not kept as a tensor attribute: mixed precision casts a cell's
        # tensor attributes to its compute dtype by constant folding through numpy, which has no
        # bfloat16 under numpy 2 (MindSpore was built against numpy 1).
        mask = ops.triu(ops.full((self.seq, self.seq), MASK_VALUE, dtype=ms.float32), 1)
        scores = ops.cast(scores, ms.float32) + mask
        probs = ops.cast(self.softmax(scores), q.dtype)
        return self.pv(probs, v)


class Attention(nn.Cell):
    """Causal self-attention over this rank's heads: QKV column-parallel, output row-parallel."""

    def __init__(self, hidden, heads, seq, p: Placement):
        super().__init__()
        self.heads, self.head_dim = heads // p.tp, hidden // heads
        self.qkv = ColumnParallelDense(hidden, 3 * hidden, p.tp, p.tp_group)
        self.proj = RowParallelDense(hidden, hidden, p.tp, p.tp_group)
        self.core = CausalAttentionCore(seq, self.head_dim)

    def construct(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).reshape(b, s, self.heads, 3, self.head_dim).transpose(3, 0, 2, 1, 4)
        ctx = self.core(qkv[0], qkv[1], qkv[2])
        return self.proj(ctx.transpose(0, 2, 1, 3).reshape(b, s, self.heads * self.head_dim))


class FeedForward(nn.Cell):
    """Dense h→ffn (column-parallel), GELU, Dense ffn→h (row-parallel)."""

    def __init__(self, hidden, ffn, p: Placement):
        super().__init__()
        self.fc_in = ColumnParallelDense(hidden, ffn, p.tp, p.tp_group)
        self.fc_out = RowParallelDense(ffn, hidden, p.tp, p.tp_group)
        self.gelu = ops.GeLU()

    def construct(self, x):
        return self.fc_out(self.gelu(self.fc_in(x)))


class DecoderBlock(nn.Cell):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, hidden, heads, ffn, seq, p: Placement):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.attn = Attention(hidden, heads, seq, p)
        self.ln2 = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.mlp = FeedForward(hidden, ffn, p)

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Cell):
    """The ``transformer`` family (see the module doc)."""

    def __init__(
        self,
        num_layers,
        hidden_size,
        num_heads,
        ffn_hidden_size,
        seq_length,
        vocab_size,
        p: Placement = SINGLE,
    ):
        super().__init__()
        self.first, self.last = p.first, p.last
        if p.first:
            self.embed = Embedding(vocab_size, seq_length, hidden_size, p)
        self.blocks = stage_blocks(
            num_layers,
            p,
            lambda: DecoderBlock(hidden_size, num_heads, ffn_hidden_size, seq_length, p),
        )
        if p.last:
            self.ln_f = nn.LayerNorm((hidden_size,), epsilon=LN_EPS)
            self.head = ColumnParallelDense(hidden_size, vocab_size, p.tp, p.tp_group)

    def construct(self, x):
        if self.first:
            x = self.embed(x)
        x = self.blocks(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x

    def apply_recompute(self, mode):
        """none | full (each block) | selective (each attention core)."""
        for block in self.blocks.cells():
            if mode == "full":
                block.recompute()
            elif mode == "selective":
                block.attn.core.recompute()


@network("transformer")
def _gpt(model_cfg: dict, placement: Placement) -> nn.Cell:
    if model_cfg["hidden_size"] % model_cfg["num_heads"]:
        raise ValueError("model.hidden_size: must be a multiple of model.num_heads")
    return GPT(
        model_cfg["num_layers"],
        model_cfg["hidden_size"],
        model_cfg["num_heads"],
        model_cfg["ffn_hidden_size"],
        model_cfg["seq_length"],
        model_cfg["vocab_size"],
        placement,
    )
