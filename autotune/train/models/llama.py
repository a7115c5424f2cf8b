"""The ``llama`` family: MindFormers' legacy LLaMA decoder, for one rank of a layout.

What LLaMA-family models trained with MindFormers run (docs/mindformers.md, "The llama family",
read from ``mindformers/models/llama`` at v1.5.0): token embedding (first stage), pre-norm
decoder layers — RMSNorm, grouped-query self-attention with rotary position embeddings,
RMSNorm, a SwiGLU feed-forward ``w2(silu(w1·x) · w3·x)`` — a final RMSNorm and an untied LM head
(last stage); no biases, no dropout. Parameters are named as MindFormers names them
(``model.layers.3.attention.wq.weight``, ``model.layers.3.feed_forward.w1.weight``,
``model.tok_embeddings.embedding_weight``, ``lm_head.weight``; `autotune.families.llama`) and split as it
splits them under tensor parallelism (`autotune.layout`): Q, K, V, w1 and w3 column-parallel,
wo and w2 row-parallel, embedding and head vocab-parallel, norms whole.

- Grouped-query attention: ``num_kv_heads`` key/value heads, each serving ``num_heads /
  num_kv_heads`` query heads (query head j reads key/value head j // group, as Hugging Face's and
  MindFormers' ``repeat_kv``). Under tensor parallelism a rank holds whole key/value heads with
  their query heads: tp must divide ``num_kv_heads`` (MindFormers refuses otherwise, and so does
  the search space, `autotune.spec.constraints`).
- Rotary embedding as MindFormers' ``FreqsMgr``/``RotaryEmbedding``: θ = 10000, frequencies over
  the head dimension, the "rotate half" form (halves, not interleaved pairs), computed in
  float32.
- RMSNorm ``x · rsqrt(mean(x²) + ε) · w`` with ε = 1e-5 (MindFormers' ``rms_norm_eps`` default),
  in float32 whatever the compute dtype (its ``layernorm_compute_type``).
- Qwen3's options (`autotune.families.llama`): ``head_dim`` heads whatever hidden / heads (``wq``
  is (heads·head_dim, hidden), ``wo`` (hidden, heads·head_dim)), and with ``qk_norm`` an RMSNorm of
  one ``head_dim`` weight over every query and key head before the rotary embedding, as mcore's
  ``SelfAttention`` applies ``q_layernorm``/``k_layernorm``; the norms are whole on every tp rank.

- MindFormers' Qwen3-MoE and DeepSeek-V3 options (`autotune.families.moe`): the MoE layers'
  feed-forward is `autotune.train.models.moe` (routed experts over ep, shared experts, the first
  ``dense_layers`` dense), the attention with ``kv_lora_rank`` `autotune.train.models.mla`;
  what this network does not build (`autotune.families.moe.TRAINER_UNBUILT`) is refused by key.

Recompute (:meth:`Llama.apply_recompute`), layer by layer as `autotune.families.layers.layer_recompute`
gives it from the knob and ``model.recompute_layers``: ``full`` recomputes the layer,
``selective`` is MindFormers' ``select_recompute`` — its default patterns
``feed_forward.mul`` and ``feed_forward.w1.activation.silu`` (``LayerSetting``,
``mindformers/models/utils.py``), which name the same primitives here, and, when attention is not
fused, the attention core, as MindFormers' ``LLamaAttention`` recomputes it without flash
attention (``mindformers/models/llama/llama_transformer.py``, mindspore-lab/mindformers at
15218ea4).
"""

from __future__ import annotations

from collections import OrderedDict

import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import initializer
from mindspore.ops.operations._inner_ops import SiLU  # the primitive MindFormers' LlamaSiLU holds

from autotune.families import moe as moe_options
from autotune.families.layers import layer_recompute, stage_layers
from autotune.families.llama import head_dim, kv_heads
from autotune.train.config import ConfigError
from autotune.train.models.fused import FusedCore
from autotune.train.models.llama_parts import (
    RMS_EPS,
    AttentionCore,
    RMSNorm,
    rotary_tables,
    rotate,
)
from autotune.train.models.mla import LatentAttention
from autotune.train.models.moe import MoEFeedForward
from autotune.train.models.registry import network
from autotune.train.parallel.groups import CopyToGroup, Placement
from autotune.train.parallel.tp_layers import (
    ColumnParallelDense,
    ReduceFromGroup,
    RowParallelDense,
    vocab_lookup,
)


class HeadNorm(nn.Cell):
    """The q/k norm: an RMSNorm over each head's last dimension, returned in its input's dtype.
    Its weight is whole on every tp rank but each rank normalises its own heads, so its gradient
    is summed over the tp group (Megatron's *f* on the weight), where the layer's other norms,
    whose inputs every rank holds whole, get the whole gradient on each rank already."""

    keep_float32 = True  # as RMSNorm

    def __init__(self, dim: int, p: Placement):
        super().__init__()
        self.weight = ms.Parameter(initializer("ones", (dim,), ms.float32))
        self.copy = CopyToGroup(p.tp_group) if p.tp > 1 else None

    def construct(self, x):
        weight = self.weight if self.copy is None else self.copy(self.weight)
        x32 = ops.cast(x, ms.float32)
        normed = x32 * ops.rsqrt((x32 * x32).mean(axis=-1, keep_dims=True) + RMS_EPS)
        return ops.cast(normed * weight, x.dtype)


class Embedding(nn.Cell):
    """The vocab-parallel token table, under MindFormers' name ``embedding_weight``."""

    def __init__(self, vocab: int, hidden: int, p: Placement):
        super().__init__()
        self.start = p.tp_index * (vocab // p.tp)
        self.embedding_weight = ms.Parameter(
            initializer("zeros", (vocab // p.tp, hidden), ms.float32)
        )
        self.reduce = ReduceFromGroup(p.tp_group) if p.tp > 1 else None

    @property
    def token_table(self):
        """``(table, start)``: see `autotune.train.step.probe.token_tables` (read only by the input
        ids: ``lm_head`` is a table of its own)."""
        return self.embedding_weight, self.start

    def construct(self, ids):
        return vocab_lookup(self.embedding_weight, ids, self.start, self.reduce)


class Attention(nn.Cell):
    """Grouped-query self-attention over this rank's heads: wq, wk, wv column-parallel, wo
    row-parallel, the q/k norms (``qk_norm``) and rotary embeddings on q and k."""

    def __init__(self, cfg: dict, p: Placement):
        super().__init__()
        hidden, heads, kv = cfg["hidden_size"], cfg["num_heads"], kv_heads(cfg)
        self.head_dim = head_dim(cfg)
        self.heads, self.kv = heads // p.tp, kv // p.tp
        q_dim, kv_dim = heads * self.head_dim, kv * self.head_dim
        self.wq = ColumnParallelDense(hidden, q_dim, p.tp, p.tp_group, bias=False)
        self.wk = ColumnParallelDense(hidden, kv_dim, p.tp, p.tp_group, bias=False)
        self.wv = ColumnParallelDense(hidden, kv_dim, p.tp, p.tp_group, bias=False)
        self.qk_norm = bool(cfg.get("qk_norm"))
        if self.qk_norm:
            self.q_layernorm = HeadNorm(self.head_dim, p)
            self.k_layernorm = HeadNorm(self.head_dim, p)
        self.wo = RowParallelDense(q_dim, hidden, p.tp, p.tp_group, bias=False)
        self.core = AttentionCore(cfg["seq_length"], self.head_dim, heads // kv)

    def _heads(self, x, n):
        b, s, _ = x.shape
        return x.reshape(b, s, n, self.head_dim).transpose(0, 2, 1, 3)

    def construct(self, x):
        b, s, _ = x.shape
        cos, sin = rotary_tables(s, self.head_dim)
        q = self._heads(self.wq(x), self.heads)
        k = self._heads(self.wk(x), self.kv)
        if self.qk_norm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        ctx = self.core(q, k, self._heads(self.wv(x), self.kv))
        return self.wo(ctx.transpose(0, 2, 1, 3).reshape(b, s, self.heads * self.head_dim))


class Activation(nn.Cell):
    """SiLU as MindFormers' ``Linear(activation="silu")`` holds it: a cell whose primitive is
    named ``silu``, so that its pattern ``w1.activation.silu`` names the same operator here."""

    def __init__(self):
        super().__init__()
        self.silu = SiLU()

    def construct(self, x):
        return self.silu(x)


class GateDense(ColumnParallelDense):
    """w1: the column-parallel gate with its activation, as MindFormers' ``w1``."""

    def __init__(self, hidden: int, ffn: int, p: Placement):
        super().__init__(hidden, ffn, p.tp, p.tp_group, bias=False)
        self.activation = Activation()

    def construct(self, x):
        return self.activation(super().construct(x))


class FeedForward(nn.Cell):
    """SwiGLU: w2(silu(w1·x) · w3·x); w1 (gate) and w3 (up) column-, w2 (down) row-parallel;
    the product is the primitive ``mul``, as MindFormers' ``LlamaFeedForward`` names it."""

    def __init__(self, hidden: int, ffn: int, p: Placement):
        super().__init__()
        self.w1 = GateDense(hidden, ffn, p)
        self.w2 = RowParallelDense(ffn, hidden, p.tp, p.tp_group, bias=False)
        self.w3 = ColumnParallelDense(hidden, ffn, p.tp, p.tp_group, bias=False)
        self.mul = ops.Mul()

    def construct(self, x):
        return self.w2(self.mul(self.w1(x), self.w3(x)))


class DecoderLayer(nn.Cell):
    """h = x + attention(attention_norm(x)); h + feed_forward(ffn_norm(h)). Layer ``index``'s
    attention is latent (`autotune.train.models.mla`) with ``kv_lora_rank``, its feed-forward a
    mixture of experts (`autotune.train.models.moe`) where `autotune.families.moe.moe_layer`
    says so."""

    def __init__(self, cfg: dict, p: Placement, index: int):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.attention_norm = RMSNorm(hidden)
        mla = moe_options.has_mla(cfg)
        self.attention = LatentAttention(cfg, p) if mla else Attention(cfg, p)
        self.ffn_norm = RMSNorm(hidden)
        if moe_options.moe_layer(cfg, index):
            self.feed_forward = MoEFeedForward(cfg, p, FeedForward, index)
        else:
            self.feed_forward = FeedForward(hidden, cfg["ffn_hidden_size"], p)

    def construct(self, x):
        h = x + ops.cast(self.attention(self.attention_norm(x)), x.dtype)
        return h + ops.cast(self.feed_forward(self.ffn_norm(h)), h.dtype)

    def select_recompute(self):
        """MindFormers' selective recompute of this layer (see the module doc)."""
        if isinstance(self.feed_forward, MoEFeedForward):
            self.feed_forward.select_recompute()
        else:
            self.feed_forward.mul.recompute()
            self.feed_forward.w1.activation.silu.recompute()
        if not isinstance(self.attention.core, FusedCore):
            self.attention.core.recompute()


class Backbone(nn.Cell):
    """MindFormers' ``LlamaModel`` part of this stage: embedding, layers, final norm."""

    def __init__(self, cfg: dict, p: Placement):
        super().__init__()
        self.first, self.last = p.first, p.last
        hidden = cfg["hidden_size"]
        if p.first:
            self.tok_embeddings = Embedding(cfg["vocab_size"], hidden, p)
        self.layers = nn.SequentialCell(
            OrderedDict(
                (str(i), DecoderLayer(cfg, p, i))
                for i in stage_layers(cfg["num_layers"], p.pp, p.stage)
            )
        )
        if p.last:
            self.norm_out = RMSNorm(hidden)

    def construct(self, x):
        if self.first:
            x = self.tok_embeddings(x)
        x = self.layers(x)
        if self.last:
            x = self.norm_out(x)
        return x


@network("llama")
class Llama(nn.Cell):
    """MindFormers' ``LlamaForCausalLM`` for one rank (see the module doc): token ids (batch,
    seq) → logits (batch, seq, vocab / tp); a middle or last stage maps the hidden state
    (batch, seq, hidden) instead, a non-last stage returns it."""

    def __init__(self, cfg: dict, p: Placement):
        super().__init__()
        for key, value, why in moe_options.trainer_unbuilt(cfg.get):
            raise ConfigError(
                f"model.{key}: {value}: {why}; study this model on cluster.backend "
                "simulate, or leave the key out"
            )
        self.last = p.last
        self.recompute_marks = cfg.get("recompute_layers") or {}
        self.model = Backbone(cfg, p)
        if p.last:
            self.lm_head = ColumnParallelDense(
                cfg["hidden_size"], cfg["vocab_size"], p.tp, p.tp_group, bias=False
            )

    def construct(self, x):
        x = self.model(x)
        if self.last:
            x = self.lm_head(x)
        return x

    def apply_recompute(self, mode):
        """The recompute knob ``mode`` on this stage's layers (see the module doc)."""
        for name, layer in self.model.layers.name_cells().items():
            layer_mode, _ = layer_recompute(mode, int(name), self.recompute_marks)
            if layer_mode == "full":
                layer.recompute()
            elif layer_mode == "selective":
                layer.select_recompute()
