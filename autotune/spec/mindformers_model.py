"""The model of a MindFormers training config → model.yaml's ``model`` rows (``autotune init``).

Contract: :func:`read_model` takes the merged config (`autotune.spec.mindformers_config`'s typed
view, ``cfg``) and appends to ``reading.model`` the ``(key, value, source)`` rows of a ``family:
llama`` model, and to ``reading.warnings`` one line per setting it drops. It refuses — a
:class:`SpecError` naming the key or the architecture and what autotune would need, exit 2 —
every config autotune's llama family does not represent (docs/mindformers.md, "Refused"):

- the architecture is on an allow-list: legacy models (``use_legacy`` not false) by
  ``model.arch.type``, mcore models (``use_legacy: False``) by ``model.model_config.model_type``;
  an mcore config that leaves its shape to ``pretrained_model_dir`` (a Hugging Face folder
  autotune does not read) is refused naming that key;
- parameter-efficient fine-tuning (``pet_config``): MindFormers freezes the base weights, which
  autotune's cost model and trial do not (they price and train every weight's Adam states);
- mixture of experts, multi-latent attention, q/k layernorm, heads not hidden/heads wide (mcore),
  context parallelism.

The legacy llama ignores ``kv_channels`` and ``head_dim`` (its heads are hidden / heads wide,
``mindformers/models/llama/llama.py``), so init does too, with a warning when they disagree.
"""

from __future__ import annotations

from autotune.families.llama import FAMILY as LLAMA
from autotune.families.llama import llama_ffn

MC = "model.model_config"
# model_config keys: MindFormers' legacy LlamaConfig name first, then the mcore name.
NAMES = {
    "num_layers": ("num_layers", "num_hidden_layers"),
    "hidden_size": ("hidden_size",),
    "num_heads": ("num_heads", "num_attention_heads"),
    "num_kv_heads": ("n_kv_heads", "num_key_value_heads"),
    "vocab_size": ("vocab_size",),
    "seq_length": ("seq_length",),
}
# What autotune's llama family (RMSNorm, SwiGLU, rotary, untied head, GQA) represents: its entry
# in autotune.families says.
LEGACY_ARCHITECTURES = LLAMA.mindformers_architectures
MCORE_MODEL_TYPES = LLAMA.mindformers_model_types
_OWN_FAMILY = (
    "a model family of its own in autotune (a module of autotune/families/ with its cost "
    "model's workload, and its network in autotune/train/models/registry.py)"
)
_NEEDS = {  # what autotune would need for architectures MindFormers' configs name
    "GPT2LMHeadModel": "LayerNorm, GELU, learned positions and a tied head",
    "BloomLMHeadModel": "LayerNorm, GELU, ALiBi positions and a tied head",
    "T5ForConditionalGeneration": "an encoder–decoder with cross-attention and relative "
    "position buckets",
    "ChatGLM2ForConditionalGeneration": "GLM's attention (multi-query groups, its own rotary "
    "layout, qkv biases)",
    "Baichuan13BV2ForCausalLM": "ALiBi positions in place of rotary embeddings",
    "Baichuan13BForCausalLM": "ALiBi positions in place of rotary embeddings",
    "InternLMForCausalLM": "attention biases (has_bias)",
    "DeepseekV2ForCausalLM": "mixture of experts and multi-latent attention",
    "DeepseekV3ForCausalLM": "mixture of experts and multi-latent attention",
}
_HEADS = (
    "ForSequenceClassification",
    "RewardModel",
    "ForMultipleChoice",
    "ForQuestionAnswering",
    "ForTokenClassification",
    "ForPreTraining",
)


def architecture(cfg) -> tuple[str, str]:
    """``(key, architecture)`` of the config, refusing one the llama family does not represent."""
    if cfg.get("use_legacy", True) is False:
        key = f"{MC}.model_type"
        arch = cfg.get(key)
        if arch is None:
            if cfg.get(f"{MC}.hidden_size") is None and cfg.get("pretrained_model_dir"):
                cfg.fail(
                    "pretrained_model_dir",
                    f"{cfg.get('pretrained_model_dir')!r}: this mcore "
                    "config (use_legacy: False) takes its model from a Hugging Face folder's "
                    "config.json, which autotune does not read; state model_type, "
                    "num_hidden_layers, hidden_size, num_attention_heads, vocab_size and "
                    f"seq_length under {MC}",
                )
            cfg.fail(key, "is required for an mcore config (use_legacy: False): the architecture")
        if arch not in MCORE_MODEL_TYPES:
            cfg.fail(
                key,
                f"{arch!r}: autotune's llama family represents the mcore models "
                f"{', '.join(MCORE_MODEL_TYPES)}; {arch} would need {_OWN_FAMILY}",
            )
        return key, arch
    key = "model.arch.type"
    arch = cfg.get(key)
    if arch is None:
        cfg.fail(key, "is required: the model's architecture (e.g. LlamaForCausalLM)")
    if arch not in LEGACY_ARCHITECTURES:
        need = _NEEDS.get(arch)
        if need is None and arch.endswith(_HEADS):
            need = (
                "a head other than the language-model head (classification, reward, "
                "pre-training objectives)"
            )
        cfg.fail(
            key,
            f"{arch}: autotune's llama family represents {', '.join(LEGACY_ARCHITECTURES)} "
            f"(RMSNorm, SwiGLU, rotary embeddings, an untied head); {arch} would need "
            + (f"{need}: {_OWN_FAMILY}" if need else _OWN_FAMILY),
        )
    return key, arch


def refuse(cfg) -> None:
    """SpecError for a model or setting autotune's llama family cannot represent."""
    pet = cfg.get(f"{MC}.pet_config")
    if pet:
        kind = pet.get("pet_type") if isinstance(pet, dict) else pet
        cfg.fail(
            f"{MC}.pet_config",
            f"parameter-efficient fine-tuning ({kind}): MindFormers "
            "freezes the base weights and trains the adapters only, while autotune prices and "
            "trains Adam states for every weight; autotune would need frozen weights in its "
            "trial program and cost model",
        )
    experts = [
        (k, cfg.get(k))
        for k in (
            "moe_config.expert_num",
            f"{MC}.num_experts",
            f"{MC}.num_moe_experts",
            f"{MC}.n_routed_experts",
        )
    ]
    for key, value in experts:
        if isinstance(value, int) and value > 1:
            cfg.fail(
                key,
                f"{value} experts: mixture-of-experts models cannot be represented "
                "(autotune's llama family is dense)",
            )
    for key in (f"{MC}.multi_latent_attention", f"{MC}.q_lora_rank", f"{MC}.kv_lora_rank"):
        if cfg.get(key) not in (None, False):
            cfg.fail(key, "multi-latent attention cannot be represented")
    for key in (f"{MC}.qk_layernorm", f"{MC}.qk_norm", f"{MC}.use_qk_norm"):
        if cfg.get(key) is True:
            cfg.fail(key, "q/k layernorm cannot be represented (autotune's llama has none)")
    if cfg.get("parallel_config.context_parallel", 1) != 1:
        cfg.fail(
            "parallel_config.context_parallel",
            f"{cfg.get('parallel_config.context_parallel')}:"
            " context parallelism is not a knob autotune has (its devices have no layout)",
        )


def _head_width(cfg, r, legacy: bool) -> None:
    _, hidden = cfg.first(NAMES["hidden_size"])
    heads_key, heads = cfg.first(NAMES["num_heads"])
    for key in (f"{MC}.head_dim", f"{MC}.kv_channels"):
        value = cfg.get(key)
        if value is None or value * heads == hidden:
            continue
        if legacy:
            r.warnings.append(
                f"{key}: {value}: ignored, as MindFormers' legacy llama ignores it "
                f"(its heads are hidden_size / {heads_key.rsplit('.', 1)[1]} = "
                f"{hidden // heads} wide)"
            )
        else:
            cfg.fail(
                key,
                f"{value} ≠ hidden_size / {heads_key.rsplit('.', 1)[1]} = "
                f"{hidden / heads:g}: autotune's heads are hidden / heads wide",
            )


def read_model(cfg, r) -> None:
    """Append the ``model`` rows and warnings of ``cfg`` to reading ``r`` (see the module doc)."""
    arch_key, arch = architecture(cfg)
    refuse(cfg)
    legacy = cfg.get("use_legacy", True) is not False
    _head_width(cfg, r, legacy)
    r.model.append(("family", LLAMA.name, f"{arch_key} {arch}: RMSNorm, SwiGLU, rotary embeddings"))
    dims = {name: cfg.first(names) for name, names in NAMES.items() if name != "num_kv_heads"}
    for name in ("num_layers", "hidden_size", "num_heads"):
        r.model.append((name, dims[name][1], dims[name][0]))
    kv_key, kv = cfg.first(NAMES["num_kv_heads"], default=None)
    if kv is not None and kv != dims["num_heads"][1]:
        r.model.append(("num_kv_heads", kv, f"{kv_key} (grouped-query attention)"))
    if cfg.get(f"{MC}.intermediate_size") is not None:
        r.model.append(
            (
                "ffn_hidden_size",
                cfg.number(f"{MC}.intermediate_size", minimum=1),
                f"{MC}.intermediate_size",
            )
        )
    else:
        multiple = cfg.number(f"{MC}.multiple_of", default=256, minimum=1)
        factor = cfg.get(f"{MC}.ffn_dim_multiplier")
        if factor is not None:
            factor = cfg.number(f"{MC}.ffn_dim_multiplier", float)
        r.model.append(
            (
                "ffn_hidden_size",
                llama_ffn(dims["hidden_size"][1], multiple, factor),
                f"MindFormers' LlamaFeedForward rule: multiple_of {multiple}, "
                f"ffn_dim_multiplier {factor}",
            )
        )
    for name in ("seq_length", "vocab_size"):
        r.model.append((name, dims[name][1], dims[name][0]))
    compute = _dtype(cfg, f"{MC}.compute_dtype", "float16")
    params = _dtype(cfg, f"{MC}.param_init_type", "float32", f"{MC}.params_dtype")
    r.model += [
        ("dtype", compute, f"{MC}.compute_dtype"),
        ("param_dtype", params, f"{MC}.param_init_type"),
        (
            "optimizer_dtype",
            "float32",
            f"optimizer.type {cfg.get('optimizer.type')}: "
            "MindFormers' AdamW and FP32StateAdamWeightDecay keep float32 moments",
        ),
        (
            "flash_attention",
            cfg.get(f"{MC}.use_flash_attention", False) is True,
            f"{MC}.use_flash_attention",
        ),
    ]
    _warn(cfg, r)


def _dtype(cfg, key: str, default: str, other: str | None = None) -> str:
    value = cfg.get(key, cfg.get(other) if other else None) or default
    if value not in ("float16", "bfloat16", "float32"):
        cfg.fail(key, f"must be float16, bfloat16 or float32, got {value!r}")
    return value


def _warn(cfg, r) -> None:
    """One warning line per setting autotune drops or fixes (docs/mindformers.md, "Warned")."""
    tp = cfg.get("parallel_config.model_parallel", 1)
    checks = (
        (
            f"{MC}.qkv_concat",
            True,
            "fused w_qkv: the trial runs wq, wk, wv apart (same work); "
            "exported parameter names are the unfused ones",
        ),
        (
            f"{MC}.qkv_has_bias",
            True,
            "q/k/v biases dropped (the trial's llama has none; "
            "their work and memory are negligible)",
        ),
        (
            f"{MC}.attn_proj_has_bias",
            True,
            "the attention output's bias dropped (negligible work and memory)",
        ),
        (
            f"{MC}.fine_grain_interleave",
            "> 1",
            "dropped: the trial does not interleave "
            "communication with compute inside a layer; the export keeps it from the base",
        ),
        (
            f"{MC}.pp_interleave_num",
            "> 1",
            "dropped: the trial's stages are not interleaved; the export keeps it from the base",
        ),
        (
            f"{MC}.tie_word_embeddings",
            True,
            "the trial's head is untied (one more vocab × hidden matrix)",
        ),
        (
            "micro_batch_interleave_num",
            "> 1",
            "counted in the global batch; the trial and the export run 1",
        ),
    )
    for key, when, what in checks:
        value = cfg.get(key)
        hit = value is True if when is True else isinstance(value, int) and value > 1
        if hit:
            r.warnings.append(f"{key}: {value}: {what}")
    if cfg.get("parallel_config.vocab_emb_dp") is True and isinstance(tp, int) and tp > 1:
        r.warnings.append(
            f"parallel_config.vocab_emb_dp: True with model_parallel {tp}: "
            "MindFormers keeps the embedding whole on every rank and does not "
            "split the head over model_parallel; autotune's trial splits both "
            "(vocab-parallel), so trial 0 differs from this layout in those two "
            "matrices; the export writes vocab_emb_dp: tp == 1, as strategy.ckpt lays them out"
        )
    offset = cfg.get(f"{MC}.offset", 0)
    if offset not in (0, [], None) and any(flatten(offset)):
        r.warnings.append(f"{MC}.offset: {offset}: layers are split evenly over the stages")


def flatten(value) -> list:
    return [x for v in value for x in flatten(v)] if isinstance(value, list) else [value]
