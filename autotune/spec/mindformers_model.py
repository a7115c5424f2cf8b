"""The model of a MindFormers training config → model.yaml's ``model`` rows (``autotune init``).

Contract: :func:`read_model` takes the merged config (`autotune.spec.mindformers_config`'s typed
view, ``cfg``) and appends to ``reading.model`` the ``(key, value, source)`` rows of a ``family:
llama`` model, and to ``reading.warnings`` one line per setting it drops. It refuses — a
:class:`SpecError` naming the key or the architecture and what autotune would need, exit 2 —
every config autotune's llama family does not represent (docs/mindformers.md, "Refused"):

- the architecture is on an allow-list: legacy models (``use_legacy`` not false) by
  ``model.arch.type``, mcore models (``use_legacy: False``) by ``model_type`` — of the model
  MindFormers builds: ``pretrained_model_dir``'s ``config.json`` under the YAML's
  ``model_config``, MindFormers' defaults for that type (`autotune.spec.mindformers_mcore`);
- parameter-efficient fine-tuning (``pet_config``): MindFormers freezes the base weights, which
  autotune's cost model and trial do not (they price and train every weight's Adam states);
- q/k layernorm on the legacy llama (which builds none). Experts, multi-latent attention and
  MTP modules are read (`autotune.spec.mindformers_experts`), refused by key where the llama
  family cannot represent them.

The legacy llama ignores ``kv_channels`` and ``head_dim`` (its heads are hidden / heads wide,
``mindformers/models/llama/llama.py``), so init does too, with a warning when they disagree; an
mcore model's ``head_dim`` and q/k norm are written as the llama family's ``head_dim`` and
``qk_norm`` (Qwen3).
"""

from __future__ import annotations

from autotune.families.llama import FAMILY as LLAMA
from autotune.families.llama import llama_ffn
from autotune.spec import mindformers_mcore as mcore
from autotune.spec.mindformers_experts import read_experts

MC = "model.model_config"
# model_config keys: MindFormers' legacy LlamaConfig name first, then the mcore name; an mcore
# model's are its Hugging Face names only (MindFormers' converter maps them; the same-name
# TransformerConfig key beside one is its "Mapping Conflicts" error).
NAMES = {
    "num_layers": ("num_layers", "num_hidden_layers"),
    "hidden_size": ("hidden_size",),
    "num_heads": ("num_heads", "num_attention_heads"),
    "num_kv_heads": ("n_kv_heads", "num_key_value_heads"),
    "vocab_size": ("vocab_size",),
    "seq_length": ("seq_length",),
}
MCORE_NAMES = {
    "num_layers": ("num_hidden_layers",),
    "hidden_size": ("hidden_size",),
    "num_heads": ("num_attention_heads",),
    "num_kv_heads": ("num_key_value_heads",),
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
    "TelechatForCausalLM": "TeleChat's attention (a fused key-value projection wk_v, split over "
    "tp as its own parameter; MindFormers' research/telechat2 and telechat3) and the biases of "
    "its attention output and feed-forward w2",
    "Baichuan13BV2ForCausalLM": "ALiBi positions in place of rotary embeddings",
    "Baichuan13BForCausalLM": "ALiBi positions in place of rotary embeddings",
    "InternLMForCausalLM": "attention biases (has_bias)",
}
_HEADS = (
    "ForSequenceClassification",
    "RewardModel",
    "ForMultipleChoice",
    "ForQuestionAnswering",
    "ForTokenClassification",
    "ForPreTraining",
)


def architecture(cfg, r) -> tuple[str, str]:
    """``(key, architecture)`` of the config, refusing one the llama family does not represent;
    an mcore model is completed as MindFormers builds it (`autotune.spec.mindformers_mcore`)."""
    if cfg.get("use_legacy", True) is False:
        key = f"{MC}.model_type"
        arch = mcore.model_type(cfg)
        if arch is None:
            named = mcore.pretrained_dir(cfg)
            if named is not None:
                folder = named[1]
                cfg.fail(
                    named[0],
                    f"{folder!r}: {mcore.config_json(folder)} is not there and {MC} states no "
                    "model_type: "
                    "an mcore config (use_legacy: False) takes its architecture and shape from "
                    "that Hugging Face file; point pretrained_model_dir at the model's folder "
                    f"(or state model_type and {', '.join(mcore.SHAPE)} under {MC})",
                )
            cfg.fail(key, "is required for an mcore config (use_legacy: False): the architecture")
        if arch not in MCORE_MODEL_TYPES:
            why = mcore.NOT_READ.get(arch) or f"{arch} would need {_OWN_FAMILY}"
            cfg.fail(
                key,
                f"{arch!r}: autotune's llama family represents the mcore models "
                f"{', '.join(MCORE_MODEL_TYPES)}; {why}",
            )
        mcore.complete(cfg, r, arch)
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
    """SpecError for a model or setting autotune's llama family cannot represent (of an mcore
    config: what MindFormers builds, its config.json read)."""
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
    if cfg.get("use_legacy", True) is not False:  # an mcore model's is its type's (mcore.complete)
        for key in (f"{MC}.qk_layernorm", f"{MC}.qk_norm", f"{MC}.use_qk_norm"):
            if cfg.get(key) is True:
                cfg.fail(
                    key,
                    "q/k layernorm: MindFormers' legacy LlamaForCausalLM builds none, so it "
                    "would be dropped; autotune reads it for the mcore Qwen3 (qk_norm)",
                )


def _head_width(cfg, r) -> None:
    """The legacy llama's heads are hidden / heads wide whatever head_dim or kv_channels say."""
    _, hidden = cfg.first(NAMES["hidden_size"])
    heads_key, heads = cfg.first(NAMES["num_heads"])
    for key in (f"{MC}.head_dim", f"{MC}.kv_channels"):
        value = cfg.get(key)
        if value is not None and value * heads != hidden:
            r.warnings.append(
                f"{key}: {value}: ignored, as MindFormers' legacy llama ignores it "
                f"(its heads are hidden_size / {heads_key.rsplit('.', 1)[1]} = "
                f"{hidden // heads} wide)"
            )


def read_model(cfg, r) -> None:
    """Append the ``model`` rows and warnings of ``cfg`` to reading ``r`` (see the module doc)."""
    legacy = cfg.get("use_legacy", True) is not False
    if not legacy:
        mcore.resolve(cfg, r)
    refuse(cfg)
    arch_key, arch = architecture(cfg, r)
    names = NAMES if legacy else MCORE_NAMES
    if legacy:
        _head_width(cfg, r)
    r.model.append(("family", LLAMA.name, f"{arch_key} {arch}: RMSNorm, SwiGLU, rotary embeddings"))
    dims = {name: cfg.first(keys) for name, keys in names.items() if name != "num_kv_heads"}
    for name in ("num_layers", "hidden_size", "num_heads"):
        r.model.append((name, dims[name][1], cfg.label(dims[name][0])))
    kv_key, kv = cfg.first(names["num_kv_heads"], default=None)
    if kv is not None and kv != dims["num_heads"][1]:
        r.model.append(("num_kv_heads", kv, f"{cfg.label(kv_key)} (grouped-query attention)"))
    if not legacy:
        _mcore_attention(cfg, r, dims["hidden_size"][1], dims["num_heads"][1])
    if cfg.get(f"{MC}.intermediate_size") is not None:
        r.model.append(
            (
                "ffn_hidden_size",
                cfg.number(f"{MC}.intermediate_size", minimum=1),
                cfg.label(f"{MC}.intermediate_size"),
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
    ffn = next(v for k, v, _ in r.model if k == "ffn_hidden_size")
    read_experts(cfg, r, legacy, arch, ffn)
    for name in ("seq_length", "vocab_size"):
        r.model.append((name, dims[name][1], cfg.label(dims[name][0])))
    param_key = f"{MC}.param_init_type" if legacy else f"{MC}.params_dtype"
    compute = _dtype(cfg, f"{MC}.compute_dtype", "float16")
    params = _dtype(cfg, param_key, "float32", f"{MC}.params_dtype")
    r.model += [
        ("dtype", compute, cfg.label(f"{MC}.compute_dtype")),
        ("param_dtype", params, cfg.label(param_key)),
        (
            "optimizer_dtype",
            "float32",
            f"optimizer.type {cfg.get('optimizer.type')}: "
            "MindFormers' AdamW and FP32StateAdamWeightDecay keep float32 moments",
        ),
        (
            "flash_attention",
            cfg.get(f"{MC}.use_flash_attention", False) is True,
            cfg.label(f"{MC}.use_flash_attention"),
        ),
    ]
    _warn(cfg, r)


def _mcore_attention(cfg, r, hidden: int, heads: int) -> None:
    """The mcore model's ``head_dim`` (written where it is not hidden / heads; a type without
    one has MindFormers' kv_channels default, hidden / heads) and q/k norm; latent attention
    has neither (`autotune.spec.mindformers_experts`)."""
    if cfg.get(f"{MC}.multi_latent_attention"):
        return
    key = f"{MC}.head_dim"
    width = cfg.number(key, default=hidden // heads, minimum=1)
    if width * heads != hidden:
        r.model.append(("head_dim", width, cfg.label(key)))
    if cfg.get(f"{MC}.qk_layernorm") is True:
        r.model.append(("qk_norm", True, cfg.label(f"{MC}.qk_layernorm")))


def _dtype(cfg, key: str, default: str, other: str | None = None) -> str:
    value = cfg.get(key, cfg.get(other) if other else None) or default
    if value not in ("float16", "bfloat16", "float32"):
        cfg.fail(key, f"must be float16, bfloat16 or float32, got {value!r}")
    return value


def _warn(cfg, r) -> None:
    """One warning line per setting autotune drops or fixes (docs/mindformers.md, "Warned")."""
    tp = cfg.get("parallel_config.model_parallel", 1)
    # an mcore model ignores qkv_concat (transformer_config_utils.py, DEFAULT_WHITE_KEY): its
    # linear_qkv is always fused, and the export names it so (autotune.families.mcore)
    names = (
        "exported parameter names are MindFormers' mcore ones (fused linear_qkv)"
        if cfg.get("use_legacy", True) is False
        else "exported parameter names are the unfused ones"
    )
    checks = (
        (
            f"{MC}.qkv_concat",
            True,
            f"fused w_qkv: the trial runs wq, wk, wv apart (same work); {names}",
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
            f"{MC}.attention_bias",
            True,
            "q/k/v biases dropped (the trial's llama has none; negligible work and memory)",
        ),
        (
            f"{MC}.add_bias_linear",
            True,
            "the linear layers' biases dropped (negligible work and memory)",
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
            r.warnings.append(f"{cfg.label(key)}: {value}: {what}")
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
        r.warnings.append(
            f"{MC}.offset: {offset}: layers are split as evenly as they go over the stages "
            "(the first ones one more)"
        )


def flatten(value) -> list:
    return [x for v in value for x in flatten(v)] if isinstance(value, list) else [value]
