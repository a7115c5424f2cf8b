"""The llama family under MindFormers' mcore names: the parameters of an mcore Qwen3, Qwen3-MoE or
DeepSeek-V3 (``use_legacy: False``) as MindFormers 1.9 builds them, and how its layers split them
(MindSpore-free).

Contract: :func:`mcore_shapes` maps a llama ``model`` section, with the base's ``model_config``
(what changes the names: :func:`built`), to ``{name: shape}`` in the network's parameter order,
under the names MindSpore saves (``Parameter.name``: no ``model.`` prefix, the training model is
built with ``auto_prefix=False``); :func:`mcore_rules` are the TP rules (`autotune.layout`) of
those names; :func:`mcore_reasons` lists why a model or a layout has no faithful mcore strategy
here (empty: it has one). Read from mindformers 1.9.0 (``parallel_core/training_graph``) and
checked against the network it builds on CPU (``tests/export/test_mcore_names.py``):

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
- multi-latent attention (DeepSeek-V3, ``multi_latent_attention``; `autotune.families.mcore_mla`):
  its down-projections whole, its up-projections and ``linear_proj`` split over tp by heads.
- the dense MLP's ``linear_fc1`` (2·ffn, h) fuses gate and up row by row (``MLPInterleaved``,
  ``use_interleaved_weight_layout_mlp: True``, the default: reshape to (…, ffn, 2)), so a dim-0
  split hands rank t its ffn/tp gate–up pairs when tp divides ffn; ``linear_fc2`` (h, ffn)
  columns over tp. The contiguous [gate; up] (``MLP``) does not: refused at tp > 1. A model with
  experts builds it in its first ``dense_layers`` layers (``first_k_dense_replace``:
  ``get_gpt_decoder_block_spec``'s dense layer spec), the others MoE layers.
- an MoE layer (``MoELayer``, ``moe_grouped_gemm`` — MindFormers refuses False):
  ``mlp.router.weight`` (E, h) whole; with ``moe_router_enable_expert_bias`` (DeepSeek-V3's
  default) ``mlp.router.expert_bias`` and ``mlp.router.expert_load`` (E,), then
  ``mlp.router.fi_accu`` (E,) — these three the router's balancing state, not trained
  (``requires_grad=False``: no Adam moments) and ``parallel_optimizer=False``;
  ``mlp.experts.weight1`` (E·h, 2·F) and ``mlp.experts.weight2`` (E·F, h) (``FFNGroupedGEMM``,
  Megatron's GroupedMLP shapes), dim 0 over ep (``layout_moe``: ``("ep", None)``), never over
  tp; with shared experts (``shared_ffn_hidden_size``, MindFormers'
  ``moe_shared_expert_intermediate_size``) ``mlp.shared_experts.linear_fc1`` (2·S, h) and
  ``mlp.shared_experts.linear_fc2`` (h, S): ``SequenceParallelLinear``, weights whole on every
  rank (``layout("None", "None")``; the tokens, not the weights, are split over tp) — unlike
  Megatron, which splits shared experts over tp like a dense MLP.
- MTP modules (``mtp_layers``, ``mtp_num_layers``; ``MultiTokenPredictionBlock``), after
  ``decoder.final_layernorm``: ``mtp.layers.J.enorm``, ``hnorm`` (h,), ``eh_proj`` (h, 2h)
  (``SequenceParallelLinear``: whole), ``transformer_layer.`` — a layer like the decoder's last
  (``get_gpt_mtp_block_spec``) — and ``final_layernorm`` (h,); the token table and the head are
  the main model's. MindFormers puts them on the last pipeline stage (``GPTModel``:
  ``mtp.pipeline_stage = pipeline_stage - 1``), and so does `autotune.layout` (an
  ``mtp.layers.J.`` is not layer J's).
- tied embeddings (``tie_word_embeddings``, Qwen3's smaller models): the training graph builds
  the whole model (``pre_process`` and ``post_process`` both true), so ``output_layer`` allocates
  no weight (``skip_weight_param_allocation``) and the head multiplies by the token table
  (``shared_embedding_or_output_weight``): no ``output_layer.weight``. Under a pipeline the table
  is stage 0's and the head the last stage's (``GPTModel``'s ``pipeline_stage``s), one parameter
  on two stages, which this strategy cannot say: refused at pp > 1, as beside an MTP module
  (which passes ``output_layer.weight`` on).
- the parallel optimizer: every trained weight joins it (none is ``parallel_optimizer=False``,
  the norms and the token table included) — :data:`MCORE_WHOLE` lists those that do not.

Not established here, so refused: experts split over tp, tied embeddings under a pipeline or
beside MTP, the shared experts' gate (``use_shared_expert_gating``).
"""

from __future__ import annotations

from autotune.families import moe
from autotune.families.llama import head_dim, kv_heads
from autotune.families.mcore_mla import MLA_RULES, mla_reasons, mla_shapes

_RULES = {
    "*self_attention.linear_proj.*": "row",
    **MLA_RULES,
    "*mlp.linear_fc1.*": "column",
    "*mlp.linear_fc2.*": "row",
    "*mlp.experts.weight*": "expert",
    "*mlp.shared_experts.*": "replicated",  # SequenceParallelLinear: weights whole
    "embedding.word_embeddings.*": "column",
    "output_layer.*": "column",
}
# not trained: no Adam moments (MindFormers' optimizer takes trainable_params())
MCORE_FROZEN = ("*.router.fi_accu", "*.router.expert_bias", "*.router.expert_load")
# created with parallel_optimizer=False: the parallel optimizer leaves them whole
MCORE_WHOLE = MCORE_FROZEN
# the base config's keys that change which parameters are built, or the fused weights' row order
# (the two layout keys): TransformerConfig's defaults (parallel_core/transformer_config.py), a
# model type's own where its config class registers one (DeepseekV3Config's
# @register_mf_model_parameter), and the older names MindFormers' converter maps onto them
# (transformer_config_utils.py)
BUILT = {
    "mla_qkv_concat": True,
    "qk_layernorm": False,
    "moe_router_enable_expert_bias": False,
    "use_shared_expert_gating": False,
    "use_contiguous_weight_layout_attention": False,
    "use_interleaved_weight_layout_mlp": True,
}
TYPE_DEFAULTS = {"deepseek_v3": {"moe_router_enable_expert_bias": True}}
ALIASES = {
    "qk_layernorm": ("use_qk_norm",),
    "moe_router_enable_expert_bias": ("balance_via_topk_bias",),
}


def built(base_model_config: dict) -> dict:
    """The base's :data:`BUILT` settings as MindFormers reads them: stated, else the default."""
    defaults = {**BUILT, **TYPE_DEFAULTS.get(base_model_config.get("model_type"), {})}
    out = {}
    for key, default in defaults.items():
        stated = [k for k in (key, *ALIASES.get(key, ())) if base_model_config.get(k) is not None]
        out[key] = base_model_config[stated[0]] if stated else default
    return out


def mcore_rules(cfg: dict) -> dict:
    """The TP rules of :func:`mcore_shapes`' names: MLA's ``linear_qkv`` is its whole
    down-projection, standard attention's the fused QKV split by groups."""
    qkv = "replicated" if moe.has_mla(cfg) else "column"
    return {"*self_attention.linear_qkv.*": qkv, **_RULES}


def mcore_shapes(cfg: dict, base_model_config: dict) -> dict:
    """``{name: shape}`` of the mcore network for llama ``model`` section ``cfg`` built from a base
    whose ``model_config`` is ``base_model_config`` (module doc)."""
    flags = built(base_model_config)
    h, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_layers"]
    out = {"embedding.word_embeddings.weight": (vocab, h)}
    for i in range(layers):
        out.update(_layer(f"decoder.layers.{i}", cfg, flags, moe.moe_layer(cfg, i)))
    out["decoder.final_layernorm.weight"] = (h,)
    for j in range(cfg.get("mtp_layers") or 0):
        b = f"mtp.layers.{j}"
        out[f"{b}.enorm.weight"] = out[f"{b}.hnorm.weight"] = (h,)
        out[f"{b}.eh_proj.weight"] = (h, 2 * h)
        # the decoder's last layer spec: an MoE layer where the model has experts
        out.update(_layer(f"{b}.transformer_layer", cfg, flags, moe.moe_layer(cfg, layers)))
        out[f"{b}.final_layernorm.weight"] = (h,)
    if not base_model_config.get("tie_word_embeddings"):
        out["output_layer.weight"] = (vocab, h)
    return out


def _layer(b: str, cfg: dict, flags: dict, experts: bool) -> dict:
    h = cfg["hidden_size"]
    out = {f"{b}.input_layernorm.weight": (h,)}
    if moe.has_mla(cfg):
        out.update(mla_shapes(f"{b}.self_attention", cfg, flags))
    else:
        d = head_dim(cfg)
        q_dim, kv_dim = cfg["num_heads"] * d, kv_heads(cfg) * d
        # the order MindFormers creates them in (Attention builds linear_proj before linear_qkv)
        out[f"{b}.self_attention.linear_proj.weight"] = (h, q_dim)
        out[f"{b}.self_attention.linear_qkv.weight"] = (q_dim + 2 * kv_dim, h)
        if cfg.get("qk_norm"):
            out[f"{b}.self_attention.q_layernorm.weight"] = (d,)
            out[f"{b}.self_attention.k_layernorm.weight"] = (d,)
    out[f"{b}.pre_mlp_layernorm.weight"] = (h,)
    if experts:
        e, f = cfg["num_experts"], cfg["moe_ffn_hidden_size"]
        out[f"{b}.mlp.router.weight"] = (e, h)
        if flags["moe_router_enable_expert_bias"]:
            out[f"{b}.mlp.router.expert_bias"] = out[f"{b}.mlp.router.expert_load"] = (e,)
        out[f"{b}.mlp.router.fi_accu"] = (e,)
        out[f"{b}.mlp.experts.weight1"] = (e * h, 2 * f)
        out[f"{b}.mlp.experts.weight2"] = (e * f, h)
        shared = cfg.get("shared_ffn_hidden_size")
        if shared:
            out[f"{b}.mlp.shared_experts.linear_fc1.weight"] = (2 * shared, h)
            out[f"{b}.mlp.shared_experts.linear_fc2.weight"] = (h, shared)
    else:
        ffn = cfg["ffn_hidden_size"]
        out[f"{b}.mlp.linear_fc1.weight"] = (2 * ffn, h)
        out[f"{b}.mlp.linear_fc2.weight"] = (h, ffn)
    return out


def _dense_mlp(cfg: dict) -> bool:
    """Whether any layer (an MTP module's included) has the dense MLP."""
    layers = cfg["num_layers"] + (1 if cfg.get("mtp_layers") else 0)
    return any(not moe.moe_layer(cfg, i) for i in range(layers))


def mcore_reasons(cfg: dict, base_model_config: dict, tp: int, pp: int = 1) -> list[str]:
    """Why ``cfg`` (a llama ``model`` section) under the base's ``model_config`` at ``tp`` and
    ``pp`` has no faithful mcore strategy here (see the module doc)."""
    flags = built(base_model_config)
    reasons = []
    if cfg.get("experts_tensor_parallel"):
        reasons.append(
            "the mcore parameter names of experts split over tp (model.experts_tensor_parallel) "
            "are not established: MindFormers' mcore experts split over ep only"
        )
    if cfg.get("shared_ffn_hidden_size") and flags["use_shared_expert_gating"]:
        reasons.append("use_shared_expert_gating: the shared experts' gate is not established")
    if base_model_config.get("tie_word_embeddings") and (pp > 1 or cfg.get("mtp_layers")):
        why = (
            f"at pp = {pp}, the token table of stage 0 is the head of stage {pp - 1}"
            if pp > 1
            else "beside an MTP module, which takes output_layer.weight"
        )
        reasons.append(f"tied embeddings (tie_word_embeddings) {why}: not established")
    if tp > 1 and flags["use_contiguous_weight_layout_attention"] and not moe.has_mla(cfg):
        reasons.append(
            "use_contiguous_weight_layout_attention: the fused QKV is [Q; K; V], so a tp rank's "
            "rows are not its heads' queries, keys and values: no strategy can describe it"
        )
    dense = _dense_mlp(cfg)
    if tp > 1 and not flags["use_interleaved_weight_layout_mlp"] and dense:
        reasons.append(
            "use_interleaved_weight_layout_mlp: false: linear_fc1 is [gate; up], so a tp rank's "
            "rows are not its gate and up rows: no strategy can describe it"
        )
    if moe.has_mla(cfg):
        reasons += mla_reasons(cfg, tp)
    elif tp > 1 and kv_heads(cfg) % tp:
        groups = kv_heads(cfg)
        reasons.append(f"tp = {tp} does not divide the {groups} key/value groups of linear_qkv")
    ffn = cfg.get("ffn_hidden_size") or 0
    if tp > 1 and dense and ffn % tp:
        reasons.append(f"tp = {tp} does not divide ffn {ffn}: linear_fc1's gate-up pairs split")
    return reasons
