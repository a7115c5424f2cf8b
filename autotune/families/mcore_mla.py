"""Multi-latent attention under MindFormers' mcore names: DeepSeek-V3's ``self_attention`` as
MindFormers 1.9 builds it (``parallel_core/training_graph/transformer/multi_latent_attention.py``;
MindSpore-free), for `autotune.families.mcore`.

Contract: :func:`mla_shapes` gives ``{name: shape}`` of one layer's latent attention in the
network's order, :data:`MLA_RULES` their TP rules, :func:`mla_reasons` why a tp has no faithful
strategy. With h hidden, n heads, ``q_lora_rank`` r_q, ``kv_lora_rank`` r_kv, per head a
``qk_nope_head_dim`` + ``qk_rope_head_dim`` = d_qk query and key, a ``v_head_dim`` d_v value:

- ``mla_qkv_concat: True`` (TransformerConfig's default; ``MLASelfAttentionConcatenated``):
  ``linear_proj`` (h, n·d_v), ``RowParallelLinear``, columns over tp; with r_q its
  ``q_layernorm`` (r_q,) and ``linear_qb`` (n·d_qk, r_q); ``linear_qkv`` (r_q + r_kv + rope, h),
  the query, key-value and rotary-key down-projections fused (without r_q the whole query
  projection n·d_qk in their place); ``k_layernorm`` (r_kv,); ``linear_kvb`` (n·(nope + d_v), r_kv).
- ``mla_qkv_concat: False`` (``MLASelfAttention``, Megatron's names): ``linear_proj``; with r_q
  ``linear_q_down_proj`` (r_q, h) and ``linear_q_up_proj`` (n·d_qk, r_q), else ``linear_q_proj``
  (n·d_qk, h); ``linear_kv_down_proj`` (r_kv + rope, h); ``linear_kv_up_proj``
  (n·(nope + d_v), r_kv); then ``q_layernorm`` (with r_q) and ``kv_layernorm``.
- the norms exist only with ``qk_layernorm`` (the base's; TransformerConfig's default False and
  DeepseekV3Config sets none: without it they are ``IdentityOp``, no parameter).
- splits: the down-projections (``linear_qkv``, ``linear_q_down_proj``,
  ``linear_kv_down_proj``) are ``SequenceParallelLinear``, weights whole on every rank; the
  up-projections ``ColumnParallelLinear``, rows over tp, their output reshaped head by head
  (…, n, d) so a dim-0 split hands rank t its n/tp heads when tp divides n (MindFormers itself
  refuses heads % tp); so is the whole query projection ``linear_q_proj``; but the concatenated
  form's whole query projection sits inside the whole ``linear_qkv``.
"""

from __future__ import annotations

MLA_RULES = {
    "*self_attention.linear_qb.*": "column",
    "*self_attention.linear_kvb.*": "column",
    "*self_attention.linear_q_proj.*": "column",
    "*self_attention.linear_q_up_proj.*": "column",
    "*self_attention.linear_kv_up_proj.*": "column",
}


def mla_shapes(b: str, cfg: dict, flags: dict) -> dict:
    """The latent attention of attention prefix ``b`` (``….self_attention``) under the base's
    settings ``flags`` (`autotune.families.mcore.built`; see the module doc)."""
    h, n = cfg["hidden_size"], cfg["num_heads"]
    q_rank, kv_rank = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    rope, nope, v = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    q_out, kv_out, norms = n * (nope + rope), n * (nope + v), flags["qk_layernorm"]
    out = {f"{b}.linear_proj.weight": (h, n * v)}
    if flags["mla_qkv_concat"]:
        if q_rank:
            if norms:
                out[f"{b}.q_layernorm.weight"] = (q_rank,)
            out[f"{b}.linear_qb.weight"] = (q_out, q_rank)
        out[f"{b}.linear_qkv.weight"] = ((q_rank or q_out) + kv_rank + rope, h)
        if norms:
            out[f"{b}.k_layernorm.weight"] = (kv_rank,)
        out[f"{b}.linear_kvb.weight"] = (kv_out, kv_rank)
        return out
    if q_rank:
        out[f"{b}.linear_q_down_proj.weight"] = (q_rank, h)
        out[f"{b}.linear_q_up_proj.weight"] = (q_out, q_rank)
    else:
        out[f"{b}.linear_q_proj.weight"] = (q_out, h)
    out[f"{b}.linear_kv_down_proj.weight"] = (kv_rank + rope, h)
    out[f"{b}.linear_kv_up_proj.weight"] = (kv_out, kv_rank)
    if norms:
        if q_rank:
            out[f"{b}.q_layernorm.weight"] = (q_rank,)
        out[f"{b}.kv_layernorm.weight"] = (kv_rank,)
    return out


def mla_reasons(cfg: dict, tp: int) -> list[str]:
    """Why ``tp`` splits a head (see the module doc)."""
    heads = cfg["num_heads"]
    if tp > 1 and heads % tp:
        return [f"tp = {tp} does not divide the {heads} heads of the latent up-projections"]
    return []
