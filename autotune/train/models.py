"""Built-in model families a trial trains: ``transformer`` (GPT-style decoder) and ``mlp``.

Both map a batch of inputs to logits and implement ``apply_recompute(mode)`` for the
``recompute`` knob. Parameter names are fixed by the attribute names below and must match
`autotune.train.shapes.parameter_shapes` (the export module relies on them; a test checks).

- transformer: inputs int32 token ids (batch, seq) → logits (batch, seq, vocab).
  Token + position embedding, ``num_layers`` pre-LayerNorm blocks (causal multi-head attention
  with a fused QKV Dense, MLP h→ffn→h with GELU), final LayerNorm, untied LM head.
- mlp: inputs float32 (batch, hidden) → logits (batch, vocab_size classes).
  Input Dense h→h, ``num_layers`` residual blocks (LayerNorm, Dense h→ffn, GELU, Dense ffn→h),
  head Dense h→classes.

Recompute modes: ``full`` recomputes every block; ``selective`` recomputes only the
activation-heavy part: the attention core (scores, mask, softmax, ·V — the (seq × seq) tensors,
as Megatron-LM's selective recompute) for the transformer, the GELU for the mlp.
"""

import numpy as np

import mindspore as ms
from mindspore import nn, ops

from autotune.train.shapes import FAMILIES, parameter_shapes  # noqa: F401  (parameter_shapes re-exported here)

LN_EPS = 1e-5
MASK_VALUE = -1.0e4  # large enough to zero a softmax term, small enough to stay finite in float16


class TokenCrossEntropy(nn.Cell):
    """Mean cross-entropy of logits (..., classes) against integer labels (...)."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, labels):
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class Embedding(nn.Cell):
    """Token embedding plus learned position embedding (inputs must be ``seq_length`` long)."""

    def __init__(self, vocab, seq, hidden):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
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
        self.mask = ms.Tensor(np.triu(np.full((seq, seq), MASK_VALUE, np.float32), k=1)[None, None])
        self.scale = 1.0 / float(np.sqrt(head_dim))
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, q, k, v):
        scores = self.qk(q, k) * self.scale
        # softmax in float32 whatever the compute dtype: float16 exp() overflows easily
        scores = ops.cast(scores, ms.float32) + self.mask
        probs = ops.cast(self.softmax(scores), q.dtype)
        return self.pv(probs, v)


class Attention(nn.Cell):
    """Causal multi-head self-attention with one fused QKV projection."""

    def __init__(self, hidden, heads, seq):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Dense(hidden, 3 * hidden)
        self.proj = nn.Dense(hidden, hidden)
        self.core = CausalAttentionCore(seq, self.head_dim)

    def construct(self, x):
        b, s, h = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        ctx = self.core(qkv[0], qkv[1], qkv[2])
        return self.proj(ctx.transpose(0, 2, 1, 3).reshape(b, s, h))


class FeedForward(nn.Cell):
    """Dense h→ffn, GELU, Dense ffn→h."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc_in = nn.Dense(hidden, ffn)
        self.fc_out = nn.Dense(ffn, hidden)
        self.gelu = ops.GeLU()

    def construct(self, x):
        return self.fc_out(self.gelu(self.fc_in(x)))


class DecoderBlock(nn.Cell):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, hidden, heads, ffn, seq):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.attn = Attention(hidden, heads, seq)
        self.ln2 = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.mlp = FeedForward(hidden, ffn)

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Cell):
    """The ``transformer`` family: token ids (batch, seq) → logits (batch, seq, vocab)."""

    def __init__(self, num_layers, hidden_size, num_heads, ffn_hidden_size, seq_length, vocab_size):
        super().__init__()
        self.embed = Embedding(vocab_size, seq_length, hidden_size)
        self.blocks = nn.CellList(
            [DecoderBlock(hidden_size, num_heads, ffn_hidden_size, seq_length) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm((hidden_size,), epsilon=LN_EPS)
        self.head = nn.Dense(hidden_size, vocab_size)

    def construct(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def apply_recompute(self, mode):
        """none | full (each block) | selective (each attention core)."""
        for block in self.blocks:
            if mode == "full":
                block.recompute()
            elif mode == "selective":
                block.attn.core.recompute()


class ResidualBlock(nn.Cell):
    """x + fc_out(gelu(fc_in(norm(x))))."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.norm = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.fc_in = nn.Dense(hidden, ffn)
        self.fc_out = nn.Dense(ffn, hidden)
        self.gelu = ops.GeLU()

    def construct(self, x):
        return x + self.fc_out(self.gelu(self.fc_in(self.norm(x))))


class ResidualMLP(nn.Cell):
    """The ``mlp`` family: features (batch, hidden) → logits (batch, classes)."""

    def __init__(self, num_layers, hidden_size, ffn_hidden_size, vocab_size):
        super().__init__()
        self.inp = nn.Dense(hidden_size, hidden_size)
        self.blocks = nn.CellList([ResidualBlock(hidden_size, ffn_hidden_size) for _ in range(num_layers)])
        self.head = nn.Dense(hidden_size, vocab_size)

    def construct(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def apply_recompute(self, mode):
        """none | full (each block) | selective (each GELU: a primitive, so its own output is recomputed)."""
        for block in self.blocks:
            if mode == "full":
                block.recompute()
            elif mode == "selective":
                block.gelu.recompute()


def build_network(model_cfg: dict) -> nn.Cell:
    """The network of a built-in family from the config's ``model`` section (float32 parameters)."""
    family = model_cfg["family"]
    if family == "transformer":
        if model_cfg["hidden_size"] % model_cfg["num_heads"]:
            raise ValueError("model.hidden_size: must be a multiple of model.num_heads")
        return GPT(model_cfg["num_layers"], model_cfg["hidden_size"], model_cfg["num_heads"],
                   model_cfg["ffn_hidden_size"], model_cfg["seq_length"], model_cfg["vocab_size"])
    if family == "mlp":
        return ResidualMLP(model_cfg["num_layers"], model_cfg["hidden_size"], model_cfg["ffn_hidden_size"],
                           model_cfg["vocab_size"])
    raise ValueError(f"model.family: unknown built-in family {family!r} (expected one of {', '.join(FAMILIES)})")
