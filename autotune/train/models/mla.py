"""Multi-latent attention (DeepSeek-V2/V3) for one rank of a layout: the llama family's
attention when ``kv_lora_rank`` is given.

Parameters are those `autotune.families.moe.mla_shapes` names. Queries: ``wq_a`` (q_lora_rank, h)
→ ``q_a_norm`` → ``wq_b`` (heads·(nope + rope), q_lora_rank), or one ``wq`` without a
``q_lora_rank``; each head's query is its unrotated ``qk_nope_head_dim`` part and its
``qk_rope_head_dim`` rotary part. Keys and values: ``wkv_a`` (kv_lora_rank + rope, h) gives the
compressed latent and one rotary key shared by every head; the latent through ``kv_a_norm`` and
``wkv_b`` (heads·(nope + v), kv_lora_rank) gives each head's unrotated key and its
``v_head_dim`` value. Scores over the (nope + rope)-wide keys, scaled by 1/√(nope + rope), causal;
``wo`` (h, heads·v) maps the heads back. Rows of ``wq_b``, ``wq`` and ``wkv_b`` are head-major,
so a contiguous block is whole heads.

Tensor parallelism as MindFormers' mcore MLA splits it (`autotune.families.moe.MOE_RULES`): the
up-projections ``wq_b``/``wq`` and ``wkv_b`` column-parallel (a rank's heads), ``wo``
row-parallel, the down-projections and latent norms whole on every rank. The shared rotary key
feeds this rank's heads only, so its gradient is summed over the tp group (Megatron's *f* on it);
the latents reach ``wq_b``/``wkv_b`` through their own *f*.
"""

from __future__ import annotations

from mindspore import nn, ops

from autotune.train.models.llama_parts import AttentionCore, RMSNorm, rotary_tables, rotate
from autotune.train.parallel.groups import CopyToGroup, Placement
from autotune.train.parallel.tp_layers import ColumnParallelDense, RowParallelDense


class LatentAttention(nn.Cell):
    """MLA over this rank's heads (see the module doc)."""

    def __init__(self, cfg: dict, p: Placement):
        super().__init__()
        h, heads = cfg["hidden_size"], cfg["num_heads"]
        q_rank, kv_rank = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
        self.nope, self.rope, self.v = (
            cfg["qk_nope_head_dim"],
            cfg["qk_rope_head_dim"],
            cfg["v_head_dim"],
        )
        self.local_heads, self.kv_rank = heads // p.tp, kv_rank
        qk = self.nope + self.rope
        self.q_rank = q_rank
        if q_rank:
            self.wq_a = ColumnParallelDense(h, q_rank, bias=False)
            self.q_a_norm = RMSNorm(q_rank)
            self.wq_b = ColumnParallelDense(q_rank, heads * qk, p.tp, p.tp_group, bias=False)
        else:
            self.wq = ColumnParallelDense(h, heads * qk, p.tp, p.tp_group, bias=False)
        self.wkv_a = ColumnParallelDense(h, kv_rank + self.rope, bias=False)
        self.kv_a_norm = RMSNorm(kv_rank)
        self.wkv_b = ColumnParallelDense(
            kv_rank, heads * (self.nope + self.v), p.tp, p.tp_group, bias=False
        )
        self.wo = RowParallelDense(heads * self.v, h, p.tp, p.tp_group, bias=False)
        self.copy_rope = CopyToGroup(p.tp_group) if p.tp > 1 else None
        # one key/value head per query head: the core's scale is 1/√(nope + rope)
        self.core = AttentionCore(cfg["seq_length"], qk, 1)

    def _heads(self, x, width):
        b, s, _ = x.shape
        return x.reshape(b, s, self.local_heads, width).transpose(0, 2, 1, 3)

    def construct(self, x):
        b, s, _ = x.shape
        if self.q_rank:
            latent_q = ops.cast(self.q_a_norm(self.wq_a(x)), x.dtype)
            q = self._heads(self.wq_b(latent_q), self.nope + self.rope)
        else:
            q = self._heads(self.wq(x), self.nope + self.rope)
        compressed = self.wkv_a(x)
        latent = ops.cast(self.kv_a_norm(compressed[..., : self.kv_rank]), x.dtype)
        k_rope = compressed[..., self.kv_rank :]
        if self.copy_rope is not None:
            k_rope = self.copy_rope(k_rope)
        kv = self._heads(self.wkv_b(latent), self.nope + self.v)
        cos, sin = rotary_tables(s, self.rope)
        q_rope = rotate(q[..., self.nope :], cos, sin)
        k_rope = rotate(k_rope.expand_dims(1), cos, sin)  # (b, 1, s, rope): every head's
        k_rope = ops.broadcast_to(k_rope, (b, self.local_heads, s, self.rope))
        q = ops.concat((q[..., : self.nope], q_rope), axis=-1)
        k = ops.concat((kv[..., : self.nope], k_rope), axis=-1)
        ctx = self.core(q, k, kv[..., self.nope :])
        return self.wo(ctx.transpose(0, 2, 1, 3).reshape(b, s, self.local_heads * self.v))
