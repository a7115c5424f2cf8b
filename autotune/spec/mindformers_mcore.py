"""The model of an mcore MindFormers config (``use_legacy: False``) as MindFormers builds it.

Contract: :func:`resolve` turns the merged config's ``model.model_config`` into the model
config MindFormers builds for training (mindformers 1.9.0, and its source on the branches
``master`` and ``r1.8.0``), recording where each key came from (:attr:`_Config.sources`), or
refuses it — a :class:`SpecError` naming the key, or the folder and the file:

- ``pretrained_model_dir`` (the top-level key, else ``model.pretrained_model_dir``: the trainer
  copies the first into the second, ``trainer/base_trainer.py``) names a Hugging Face folder:
  its ``config.json`` is read and the YAML's ``model_config`` updated over it key by key — the
  YAML wins (``models/build_config.py``, ``get_model_config``, ``merge_model_config``:
  ``hf_dict.update(config_dict)``). A relative path is the working directory's, as MindFormers
  opens it (run init where you run MindFormers).
- ``model_type`` (from either) names the config class (``MindFormerRegister``
  ``get_instance_type_from_cfg``); a key neither states takes that class's default: its
  ``__init__`` signature, its ``@register_mf_model_parameter`` values, then the
  ``TransformerConfig`` field its converter maps the key to (``parallel_core/
  transformer_config.py``). :data:`MCORE_TYPES` transcribes them for the model types autotune
  reads; the slow tier checks every value against the installed MindFormers
  (``tests/mindformers/test_mcore_config.py``).
- The shape is not defaulted: a model's :data:`SHAPE` keys must come from ``config.json`` or the
  YAML, else the refusal names ``pretrained_model_dir``, the folder and ``config.json`` (or,
  without a folder, the first missing key).
- What the training model builds whatever the config says is :attr:`McoreType.fixed` (Qwen3's
  q/k norms: ``TrainingQwen3ForCausalLM`` passes ``qk_layernorm=True``); a config that says
  otherwise gets one warning.

The merged mapping replaces ``model.model_config`` in the config the rest of init reads, so the
model rows, the warnings and the recompute lists read what MindFormers builds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_JSON = "config.json"  # MindFormers' CONFIG_NAME (models/utils.py)
MC = "model.model_config"
# The keys of a model's shape: MindFormers defaults them too (Qwen3Config: a Qwen3-8B-like
# 32 × 4096), which autotune never takes silently.
SHAPE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")


@dataclass(frozen=True)
class McoreType:
    """What MindFormers builds for one mcore ``model_type`` (see the module doc)."""

    config_class: str
    defaults: dict  # Hugging Face key → MindFormers' default
    # key → (value, why): what the training model builds whatever the config says
    fixed: dict = field(default_factory=dict)


# TransformerConfig's field defaults (parallel_core/transformer_config.py) for the keys autotune
# reads: every mcore model type's, where its config class does not set its own
TRANSFORMER_CONFIG_DEFAULTS = {
    "use_flash_attention": True,
    "compute_dtype": "bfloat16",
    "params_dtype": "float32",
    "position_embedding_type": "rope",
    "multi_latent_attention": False,
}
MCORE_TYPES = {
    "qwen3": McoreType(
        "Qwen3Config",
        {
            # Qwen3Config.__init__ (models/qwen3/configuration_qwen3.py)
            "vocab_size": 151936,
            "num_key_value_heads": 32,
            "head_dim": 128,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
            "attention_bias": False,
            # its @register_mf_model_parameter
            "seq_length": 4096,
            "normalization": "RMSNorm",
            "add_bias_linear": False,
            "gated_linear_unit": True,
            **TRANSFORMER_CONFIG_DEFAULTS,
        },
        {
            "qk_layernorm": (
                True,
                "MindFormers' Qwen3 training model: get_gpt_layer_local_spec(qk_layernorm=True) "
                "in models/qwen3/modeling_qwen3_train.py",
            )
        },
    ),
    "qwen3_moe": McoreType(
        "Qwen3MoeConfig",
        {
            # Qwen3MoeConfig.__init__ (models/qwen3_moe/configuration_qwen3_moe.py); it has no
            # head_dim: without one, TransformerConfig's kv_channels is hidden / heads
            "vocab_size": 151936,
            "num_key_value_heads": 4,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "moe_intermediate_size": 768,
            "num_experts_per_tok": 8,
            "num_experts": 128,
            # its @register_mf_model_parameter
            "seq_length": 4096,
            "normalization": "RMSNorm",
            "add_bias_linear": False,
            "gated_linear_unit": True,
            **TRANSFORMER_CONFIG_DEFAULTS,
        },
        {
            "qk_layernorm": (
                True,
                "MindFormers' Qwen3-MoE training model: get_gpt_layer_local_spec("
                "qk_layernorm=True) in models/qwen3_moe/modeling_qwen3_moe_train.py",
            )
        },
    ),
    "deepseek_v3": McoreType(
        "DeepseekV3Config",
        {
            # DeepseekV3Config.__init__ (models/deepseek3/configuration_deepseek_v3.py): the
            # 671 B model's own numbers
            "vocab_size": 129280,
            "moe_intermediate_size": 2048,
            "num_nextn_predict_layers": 1,
            "num_key_value_heads": 128,
            "n_shared_experts": 1,
            "n_routed_experts": 256,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "qk_nope_head_dim": 128,
            "num_experts_per_tok": 8,
            "moe_layer_freq": 1,
            "first_k_dense_replace": 3,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
            "attention_bias": False,
            # its @register_mf_model_parameter (compute_dtype 'bf16': MindFormers' bfloat16)
            "seq_length": 4096,
            "compute_dtype": "bfloat16",
            "use_flash_attention": True,
            "normalization": "RMSNorm",
            "add_bias_linear": False,
            "gated_linear_unit": True,
            "multi_latent_attention": True,
            **{
                k: v
                for k, v in TRANSFORMER_CONFIG_DEFAULTS.items()
                if k not in ("compute_dtype", "multi_latent_attention")
            },
        },
    ),
}
# mcore model types MindFormers registers that train no llama-shaped dense model: why autotune
# does not read them (each from the type's modeling file)
NOT_READ = {
    "qwen2": "MindFormers' mcore Qwen2 does not train (Qwen2ForCausalLM: 'Train mode is not "
    "supported for Qwen2 model'); its legacy config (LlamaForCausalLM) is read",
    "glm4": "MindFormers' mcore GLM-4 does not train (Glm4ForCausalLM: 'Train mode is not "
    "supported for Glm4 model')",
    "telechat": "MindFormers' mcore TeleChat2 is an inference model only",
}
# the Hugging Face activations of a SwiGLU (MindFormers' mcore names them swiglu, fusedswiglu)
SWIGLU = ("silu", "swiglu", "fusedswiglu")


def config_json(folder: str) -> Path:
    """The ``config.json`` MindFormers opens for ``pretrained_model_dir`` ``folder`` (a relative
    folder is the working directory's)."""
    return Path(os.path.abspath(os.path.expanduser(folder))) / CONFIG_JSON


def pretrained_dir(cfg) -> tuple[str, str] | None:
    """(key, folder) of the config's ``pretrained_model_dir``, None when it names none."""
    for key in ("pretrained_model_dir", "model.pretrained_model_dir"):
        value = cfg.get(key)
        if isinstance(value, str) and value.strip():
            return key, value
    return None


def read_config_json(folder: str) -> dict | None:
    """The mapping of ``pretrained_model_dir`` ``folder``'s ``config.json``, None when the folder
    holds none; a ``ValueError`` saying why when MindFormers could not read the file."""
    path = config_json(folder)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON file MindFormers can read: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object")
    return data


def _hugging_face(cfg) -> tuple[dict, str | None, str | None]:
    """(config.json's mapping, its path, the pretrained_model_dir key) — ({}, None, key) when
    the folder holds no config.json."""
    named = pretrained_dir(cfg)
    if named is None:
        return {}, None, None
    key, folder = named
    try:
        data = read_config_json(folder)
    except ValueError as exc:
        cfg.fail(key, f"{folder!r}: {exc}")
    if data is None:
        return {}, None, key
    return data, str(config_json(folder)), key


def resolve(cfg, r) -> None:
    """Replace ``model.model_config`` of ``cfg`` by the model config MindFormers builds (see the
    module doc); the rows' sources go to ``cfg.sources``, warnings to ``r.warnings``."""
    yaml_config = cfg.get(MC, {})
    if not isinstance(yaml_config, dict):
        cfg.fail(MC, "must be a mapping")
    hf, hf_path, dir_key = _hugging_face(cfg)
    merged = {**hf, **yaml_config}
    for key in hf:
        if key not in yaml_config:
            cfg.sources[f"{MC}.{key}"] = f"{hf_path}: {key}"
    if dir_key is not None and hf_path is None:
        folder = cfg.get(dir_key)
        r.notes.append(
            f"{dir_key}: {folder!r} holds no {CONFIG_JSON} here: the model is the YAML's "
            "model_config alone (MindFormers itself reads that file when it starts)"
        )
    cfg.data.setdefault("model", {})["model_config"] = merged


def model_type(cfg) -> str | None:
    """The merged config's ``model_type`` (after :func:`resolve`)."""
    return cfg.get(f"{MC}.model_type")


def complete(cfg, r, kind: str) -> None:
    """Fill what ``model_type`` ``kind`` (one of :data:`MCORE_TYPES`) defaults, refuse a missing
    shape, and apply what its training model fixes (see the module doc)."""
    facts = MCORE_TYPES[kind]
    merged = cfg.data["model"]["model_config"]
    missing = [key for key in SHAPE if merged.get(key) is None]
    if missing:
        named = pretrained_dir(cfg)
        if named is not None:
            key, folder = named
            path = config_json(folder)
            cfg.fail(
                key,
                f"{folder!r}: {path} is not there and {MC} does not state "
                f"{', '.join(missing)}: MindFormers reads an mcore model's shape from that "
                "Hugging Face file; point pretrained_model_dir at the model's folder (or "
                f"state {', '.join(SHAPE)} under {MC})",
            )
        cfg.fail(
            f"{MC}.{missing[0]}",
            "is required: an mcore config without pretrained_model_dir states its shape "
            f"({', '.join(SHAPE)})",
        )
    for key, value in facts.defaults.items():
        if merged.get(key) is None:
            merged[key] = value
            cfg.sources[f"{MC}.{key}"] = f"MindFormers' {facts.config_class} default"
    for key, (value, why) in facts.fixed.items():
        stated = merged.get(key)
        if stated is not None and stated != value:
            r.warnings.append(f"{cfg.label(f'{MC}.{key}')}: {stated}: ignored: {why}")
        merged[key] = value
        cfg.sources[f"{MC}.{key}"] = why
    _llama_shaped(cfg)


def _llama_shaped(cfg) -> None:
    """Refuse a merged config whose layer is not the llama family's (RMSNorm, SwiGLU, rotary)."""
    checks = (
        ("normalization", lambda v: v == "RMSNorm", "RMSNorm"),
        ("gated_linear_unit", lambda v: v is True, "a gated feed-forward (SwiGLU)"),
        ("hidden_act", lambda v: str(v).lower() in SWIGLU, "SiLU (SwiGLU)"),
        ("position_embedding_type", lambda v: v == "rope", "rotary embeddings"),
    )
    for key, ok, llama in checks:
        value = cfg.get(f"{MC}.{key}")
        if not ok(value):
            cfg.fail(
                f"{MC}.{key}",
                f"{value!r}: autotune's llama family has {llama}; this layer would need a "
                "model family of its own",
            )
    if cfg.get(f"{MC}.kv_channels") is not None:
        cfg.fail(
            f"{MC}.kv_channels",
            "MindFormers' converter maps head_dim onto kv_channels too, and refuses a config "
            "that gives both (its 'Mapping Conflicts' error); state head_dim",
        )
