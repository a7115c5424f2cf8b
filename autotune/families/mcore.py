"""The llama family under MindFormers' mcore names: the parameters of an mcore Qwen3 or Qwen3-MoE
(``use_legacy: False``) as MindFormers 1.9 builds them, and how its layers split them
(MindSpore-free).

Contract: :func:`mcore_shapes` maps a llama ``model`` section to ``{name: shape}`` in the
network's parameter order, under the names MindSpore saves (``Parameter.name``: no ``model.``
prefix, the training model is built with ``auto_prefix=False``); :data:`MCORE_RULES` are the
TP rules (`autotune.layout`) of those names; :func:`mcore_reasons` lists why a model or a layout
has no faithful mcore strategy here (empty: it has one). Read from mindformers 1.9.0
(``parallel_core/training_graph``) and checked against the network it builds on CPU
(``tests/export/test_mcore_names.py``):

- ``GPTModel``: ``embedding.word_embeddings.weight`` (vocab, h), ``VocabParallelEmbedding``,
  rows over tp; ``decoder.final_layernorm.weight`` (h,); ``output_layer.weight`` (vocab, h),
  ``ColumnParallelLinear``, rows over tp (weights are (out, in): ``transpose_b``).
- each layer ``decoder.layers.N.``: ``input_layernorm``, ``pre_mlp_layernorm`` (h,);
  ``self_attention.linear_proj`` (h, heads·d), ``RowParallelLinear``, columns over tp;
  ``self_attention.linear_qkv`` (heads·d + 2·groups·d, h), ``ColumnParallelLinear``, rows over
  tp; ``q_layernorm``/``k_layernorm`` (d,), Qwen3's, whole.
- the fused QKV (``SelfAttention``, ``use_contiguous_weight_layout_attention: False``, the
  default) is stored group by group — per key/value group its queries, its key, its value
  (``get_query_key_value_tensors`` reshapes the output to (…, groups, (n_rep + 2)·d)) — so a
  plain dim-0 split over tp hands rank t whole groups, its heads, when tp divides the groups.
  The contiguous layout ([Q; K; V], ``SelfAttentionContiguous``) does not: refused at tp > 1.
- the dense MLP's ``linear_fc1`` (2·ffn, h) fuses gate and up row by row (``MLPInterleaved``,
  ``use_interleaved_weight_layout_mlp: True``, the default: reshape to (…, ffn, 2)), so a dim-0
  split hands rank t its ffn/tp gate–up pairs when tp divides ffn; ``linear_fc2`` (h, ffn)
  columns over tp. The contiguous [gate; up] (``MLP``) does not: refused at tp > 1.
- an MoE layer (``MoELayer``, ``moe_grouped_gemm`` — MindFormers refuses False):
  ``mlp.router.weight`` (E, h) whole; ``mlp.router.fi_accu`` (E,), the router's aux-loss
  accumulator, not trained (no Adam moments) and ``parallel_optimizer=False``;
  ``mlp.experts.weight1`` (E·h, 2·F) and ``mlp.experts.weight2`` (E·F, h) (``FFNGroupedGEMM``,
  Megatron's GroupedMLP shapes), dim 0 over ep (``layout_moe``: ``("ep", None)``), never over tp.
- the parallel optimizer: every trained weight joins it (none is ``parallel_optimizer=False``,
  the norms and the token table included) — :data:`MCORE_WHOLE` lists the one that does not.

Not established here, so refused: multi-latent attention (DeepSeek-V3), MTP modules, shared
experts, dense first layers of an MoE model, experts split over tp, tied embeddings.
"""

from __future__ import annotations

from autotune.families import moe
from autotune.families.llama import head_dim, kv_heads

MCORE_RULES = {
    "*self_attention.linear_qkv.*": "column",
    "*self_attention.linear_proj.*": "row",
    "*mlp.linear_fc1.*": "column",
    "*mlp.linear_fc2.*": "row",
    "*mlp.experts.weight*": "expert",
    "embedding.word_embeddings.*": "column",
    "output_layer.*": "column",
}
# not trained: no Adam moments (MindFormers' optimizer takes trainable_params())
MCORE_FROZEN = ("*.router.fi_accu",)
# created with parallel_optimizer=False: the parallel optimizer leaves them whole
MCORE_WHOLE = MCORE_FROZEN
# the base config's keys that change the fused weights' row order (TransformerConfig defaults)
LAYOUT_KEYS = {
    "use_contiguous_weight_layout_attention": False,
    "use_interleaved_weight_layout_mlp": True,
}


def mcore_shapes(cfg: dict) -> dict:
    """``{name: shape}`` of the mcore network for llama ``model`` section ``cfg`` (module doc)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {"embedding.word_embeddings.weight": (vocab, h)}
    for i in range(cfg["num_layers"]):
        out.update(_layer(f"decoder.layers.{i}", cfg))
    out["decoder.final_layernorm.weight"] = (h,)
    out["output_layer.weight"] = (vocab, h)
    return out


def _layer(b: str, cfg: dict) -> dict:
    h, d = cfg["hidden_size"], head_dim(cfg)
    q_dim, kv_dim = cfg["num_heads"] * d, kv_heads(cfg) * d
    # the order MindFormers creates them in (Attention builds linear_proj before linear_qkv)
    out = {
        f"{b}.input_layernorm.weight": (h,),
        f"{b}.self_attention.linear_proj.weight": (h, q_dim),
        f"{b}.self_attention.linear_qkv.weight": (q_dim + 2 * kv_dim, h),
    }
    if cfg.get("qk_norm"):
        out[f"{b}.self_attention.q_layernorm.weight"] = (d,)
        out[f"{b}.self_attention.k_layernorm.weight"] = (d,)
    out[f"{b}.pre_mlp_layernorm.weight"] = (h,)
    if moe.has_experts(cfg):
        e, f = cfg["num_experts"], cfg["moe_ffn_hidden_size"]
        out[f"{b}.mlp.router.weight"] = (e, h)
        out[f"{b}.mlp.router.fi_accu"] = (e,)
        out[f"{b}.mlp.experts.weight1"] = (e * h, 2 * f)
        out[f"{b}.mlp.experts.weight2"] = (e * f, h)
    else:
        ffn = cfg["ffn_hidden_size"]
        out[f"{b}.mlp.linear_fc1.weight"] = (2 * ffn, h)
        out[f"{b}.mlp.linear_fc2.weight"] = (h, ffn)
    return out


def mcore_reasons(cfg: dict, base_model_config: dict, tp: int) -> list[str]:
    """Why ``cfg`` (a llama ``model`` section) under the base's ``model_config`` at ``tp`` has
    no faithful mcore strategy here (see the module doc)."""
    unsupported = {
        "kv_lora_rank": "multi-latent attention",
        "mtp_layers": "multi-token prediction modules",
        "shared_ffn_hidden_size": "shared experts",
        "dense_layers": "dense first layers of an MoE model",
        "experts_tensor_parallel": "experts split over tp",
    }
    reasons = [
        f"the mcore parameter names of {what} (model.{key}) are not established"
        for key, what in unsupported.items()
        if cfg.get(key)
    ]
    if base_model_config.get("tie_word_embeddings"):
        reasons.append("tied embeddings (tie_word_embeddings): the mcore head is not established")
    flags = {k: base_model_config.get(k, v) for k, v in LAYOUT_KEYS.items()}
    if tp > 1 and flags["use_contiguous_weight_layout_attention"]:
        reasons.append(
            "use_contiguous_weight_layout_attention: the fused QKV is [Q; K; V], so a tp rank's "
            "rows are not its heads' queries, keys and values: no strategy can describe it"
        )
    if tp > 1 and not flags["use_interleaved_weight_layout_mlp"] and not moe.has_experts(cfg):
        reasons.append(
            "use_interleaved_weight_layout_mlp: false: linear_fc1 is [gate; up], so a tp rank's "
            "rows are not its gate and up rows: no strategy can describe it"
        )
    groups = kv_heads(cfg)
    if tp > 1 and groups % tp:
        reasons.append(f"tp = {tp} does not divide the {groups} key/value groups of linear_qkv")
    ffn = cfg.get("ffn_hidden_size") or 0
    if tp > 1 and not moe.has_experts(cfg) and ffn % tp:
        reasons.append(f"tp = {tp} does not divide ffn {ffn}: linear_fc1's gate-up pairs split")
    return reasons
