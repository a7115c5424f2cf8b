"""A MindFormers config's experts, multi-latent attention and MTP modules → model.yaml rows
(``autotune init --mindformers``; the llama family's options, `autotune.families.moe`).

Contract: :func:`read_experts` appends to ``reading.model`` the rows of what MindFormers builds,
each with its source, and to ``reading.warnings`` a line per setting MindFormers ignores; it
refuses by key what the llama family cannot represent. Read from MindFormers 1.9's source:

- mcore (``use_legacy: False``; after `autotune.spec.mindformers_mcore` merged
  ``config.json`` under the YAML): the experts ``num_experts`` / ``n_routed_experts`` (the
  converters' names for ``num_moe_experts``), ``num_experts_per_tok``, ``moe_intermediate_size``,
  the shared experts ``moe_shared_expert_intermediate_size`` or ``n_shared_experts`` ×
  ``moe_intermediate_size`` (``TransformerConfig.__post_init__``), the dense first layers
  ``first_k_dense_replace`` (else ``moe_layer_freq``: 1 or a list of k zeros then ones; any
  other pattern is refused), the router's ``moe_expert_capacity_factor`` (None or < 0:
  dropless); multi-latent attention when ``multi_latent_attention`` (DeepSeek-V3's default) with
  ``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``;
  the MTP modules ``num_nextn_predict_layers`` (``mtp_num_layers``). Qwen3-MoE's
  ``decoder_sparse_step`` and ``mlp_only_layers`` are deleted by its config class
  (``NotSupportedInfo.useless``): every layer is MoE, and a config that says otherwise is warned.
- legacy (``moe_config``, ``mindformers/modules/transformer/moe.py``'s ``MoEConfig``):
  ``expert_num``, ``num_experts_chosen`` (default 1), ``capacity_factor`` (default 1.1; ≤ 0:
  dropless), each expert split over model_parallel too unless ``expert_model_parallel`` is 1
  (``models/llama/llama_layer.py``'s shard: ``w1`` ``(ep, mp, 1)``), and for DeepSeek's research models ``shared_expert_num``, ``moe_intermediate_size``,
  ``first_k_dense_replace``; a legacy llama's experts (Mixtral) are its FFN
  (``intermediate_size``) each; its MLA under ``model_config`` by the same names, its MTP
  modules ``mtp_depth``.
"""

from __future__ import annotations

MC = "model.model_config"
MLA = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# MindFormers' legacy research models with experts and latent attention
DEEPSEEK_LEGACY = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


def _first(cfg, keys: tuple):
    """(key, value) of the first of ``keys`` the merged config states, else (None, None)."""
    for key in keys:
        if cfg.get(key) is not None:
            return key, cfg.get(key)
    return None, None


def read_experts(cfg, r, legacy: bool, arch: str, ffn: int) -> None:
    """Append the rows of ``cfg``'s experts, latent attention and MTP modules (see the module
    doc); ``ffn`` is the dense feed-forward width already read."""
    if legacy:
        _legacy_experts(cfg, r, arch, ffn)
    else:
        _mcore_experts(cfg, r)
    _latent(cfg, r, legacy)
    keys = (
        (f"{MC}.mtp_depth",)
        if legacy
        else (f"{MC}.num_nextn_predict_layers", f"{MC}.mtp_num_layers")
    )
    key, value = _first(cfg, keys)
    if value:
        r.model.append(("mtp_layers", cfg.number(key, minimum=0), cfg.label(key)))


def _legacy_experts(cfg, r, arch: str, ffn: int) -> None:
    experts = cfg.get("moe_config.expert_num")
    if not isinstance(experts, int) or experts < 2:
        return
    r.model.append(("num_experts", experts, "moe_config.expert_num"))
    key = "moe_config.num_experts_chosen"
    k = cfg.number(key, default=1, minimum=1)
    r.model.append(("experts_per_token", k, key if cfg.get(key) else f"{key} (MoEConfig: 1)"))
    if arch in DEEPSEEK_LEGACY:
        width = cfg.number("moe_config.moe_intermediate_size", default=1407, minimum=1)
        r.model.append(("moe_ffn_hidden_size", width, "moe_config.moe_intermediate_size"))
        shared = cfg.number("moe_config.shared_expert_num", default=0, minimum=0)
        if shared:
            r.model.append(
                ("shared_ffn_hidden_size", shared * width, "moe_config.shared_expert_num × width")
            )
        dense = cfg.get("moe_config.first_k_dense_replace")
        if isinstance(dense, int) and not isinstance(dense, bool) and dense > 0:
            r.model.append(("dense_layers", dense, "moe_config.first_k_dense_replace"))
    else:  # a legacy llama's experts are its feed-forward, each (Mixtral)
        r.model.append(("moe_ffn_hidden_size", ffn, "each expert the llama's feed-forward"))
    if cfg.get("moe_config.expert_model_parallel") != 1:  # llama_layer.py: w1 (ep, mp, 1)
        r.model.append(
            (
                "experts_tensor_parallel",
                True,
                "moe_config.expert_model_parallel not 1: legacy MoE splits each expert over "
                "model_parallel",
            )
        )
    capacity = cfg.get("moe_config.capacity_factor", 1.1)
    if capacity is not None and capacity > 0:
        where = "moe_config.capacity_factor" + (
            "" if cfg.get("moe_config.capacity_factor") is not None else " (MoEConfig: 1.1)"
        )
        r.model.append(("moe_capacity_factor", float(capacity), where))


def _mcore_experts(cfg, r) -> None:
    key, experts = _first(
        cfg, (f"{MC}.num_experts", f"{MC}.n_routed_experts", f"{MC}.num_moe_experts")
    )
    if not isinstance(experts, int) or experts < 2:
        return
    r.model.append(("num_experts", experts, cfg.label(key)))
    key, _ = _first(cfg, (f"{MC}.num_experts_per_tok", f"{MC}.moe_router_topk"))
    if key is None:
        cfg.fail(f"{MC}.num_experts_per_tok", "is required with experts")
    r.model.append(("experts_per_token", cfg.number(key, minimum=1), cfg.label(key)))
    key, _ = _first(cfg, (f"{MC}.moe_intermediate_size", f"{MC}.moe_ffn_hidden_size"))
    if key is None:
        cfg.fail(f"{MC}.moe_intermediate_size", "is required with experts")
    width = cfg.number(key, minimum=1)
    r.model.append(("moe_ffn_hidden_size", width, cfg.label(key)))
    shared_key = f"{MC}.moe_shared_expert_intermediate_size"
    count_key, count = _first(cfg, (f"{MC}.n_shared_experts", f"{MC}.shared_expert_num"))
    if cfg.get(shared_key):
        r.model.append(("shared_ffn_hidden_size", cfg.number(shared_key), cfg.label(shared_key)))
    elif count:
        where = f"{cfg.label(count_key)} × moe_intermediate_size"
        r.model.append(("shared_ffn_hidden_size", cfg.number(count_key) * width, where))
    _dense_layers(cfg, r)
    capacity = cfg.get(f"{MC}.moe_expert_capacity_factor")
    if isinstance(capacity, (int, float)) and not isinstance(capacity, bool) and capacity > 0:
        key = f"{MC}.moe_expert_capacity_factor"
        r.model.append(("moe_capacity_factor", float(capacity), cfg.label(key)))


def _dense_layers(cfg, r) -> None:
    """The dense first layers: ``first_k_dense_replace``, else ``moe_layer_freq``'s pattern."""
    key = f"{MC}.first_k_dense_replace"
    dense = cfg.get(key)
    if dense:
        r.model.append(("dense_layers", cfg.number(key, minimum=0), cfg.label(key)))
        return
    freq_key = f"{MC}.moe_layer_freq"
    freq = cfg.get(freq_key, 1)
    if isinstance(freq, list):
        k = freq.index(1) if 1 in freq else len(freq)
        if freq != [0] * k + [1] * (len(freq) - k):
            cfg.fail(
                freq_key,
                f"{freq}: MoE layers that are not the last ones after dense first layers; "
                "autotune's llama family has dense layers first only (first_k_dense_replace)",
            )
        if k:
            r.model.append(("dense_layers", k, cfg.label(freq_key)))
    elif freq != 1:
        cfg.fail(
            freq_key,
            f"{freq}: an MoE layer every {freq} layers; autotune's llama family has dense "
            "layers first only (first_k_dense_replace)",
        )
    for ignored, default in (("decoder_sparse_step", 1), ("mlp_only_layers", [])):
        value = cfg.get(f"{MC}.{ignored}")
        if value is not None and value != default and cfg.get(f"{MC}.model_type") == "qwen3_moe":
            r.warnings.append(
                f"{cfg.label(f'{MC}.{ignored}')}: {value}: ignored, as MindFormers' Qwen3MoeConfig "
                "deletes it: every layer is an MoE layer"
            )


def _latent(cfg, r, legacy: bool) -> None:
    """Multi-latent attention's widths (see the module doc)."""
    on = cfg.get(f"{MC}.kv_lora_rank") if legacy else cfg.get(f"{MC}.multi_latent_attention")
    if not on:
        if not legacy and cfg.get(f"{MC}.kv_lora_rank") is not None:
            cfg.fail(
                f"{MC}.multi_latent_attention",
                f"{cfg.get(f'{MC}.multi_latent_attention')}: kv_lora_rank is given but "
                "MindFormers builds standard attention then, which autotune does not read "
                "beside latent widths",
            )
        return
    for name in MLA:
        key = f"{MC}.{name}"
        value = cfg.get(key)
        if value is None and name == "q_lora_rank":
            continue  # queries projected whole
        r.model.append((name, cfg.number(key, minimum=1), cfg.label(key)))
