"""model.yaml's ``model`` section → a :class:`~autotune.spec.specs.ModelSpec`.

Contract: :func:`parse_model` reads the section (a `autotune.spec.model_yaml` ``_Section``) and
returns the model, or fails naming the field (``model.num_kv_heads: …``): exactly one of
``family`` (its dimensions required) or ``entry`` (imported now, so a bad entry fails at
validation, not inside a trial; a stored study's is only resolved); a field of a family that
does not take it; heads that do not divide the hidden size or the query heads; a
``recompute_layers`` key or layer index out of range; a ``recompute_modules`` entry that is
not priced or names a part the model lacks; an unknown field (an entry model's own
fields reach its ``build(config)`` untouched). The experts' fields are
`autotune.spec.model_experts`'. :data:`LATER_MODEL_FIELDS` are the fields added after studies
were first stored, at the values a study's fingerprint leaves out.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autotune.families import FAMILIES, owners
from autotune.families.layers import RECOMPUTE_LAYER_KEYS
from autotune.families.selective import MODULES, UNPRICED
from autotune.spec import entry as entry_loader
from autotune.spec.knobs import DTYPES
from autotune.spec.model_experts import NONE as EXPERTS_NONE
from autotune.spec.model_experts import parse_experts
from autotune.spec.specs import ModelSpec

if TYPE_CHECKING:
    from autotune.spec.model_yaml import _Section

TP_SPLITS = ("column", "row", "replicated")  # how a tensor-parallel layout splits a weight

# Model fields added after studies were first stored: at these values a study's fingerprint
# leaves them out, so a study made before them still resumes (`autotune.study.opening`).
LATER_MODEL_FIELDS = {
    "num_kv_heads": None,
    "head_dim": None,
    "qk_norm": False,
    "param_dtype": "float32",
    "optimizer_dtype": "float32",
    "flash_attention": False,
    "sequence_parallel": False,
    "embedding_parallel_optimizer": False,
    "recompute_layers": {},
    "recompute_modules": (),
    **EXPERTS_NONE,
}


def parse_model(s: _Section, base: Path, stored: bool = False) -> ModelSpec:
    family = s.get("family", str, default=None, choices=tuple(FAMILIES))
    entry = s.get("entry", str, default=None)
    if (family is None) == (entry is None):
        s.fail(
            "family", f"give exactly one of model.family ({' | '.join(FAMILIES)}) or model.entry"
        )
    if entry is not None:
        entry = entry_loader.resolve(entry, base) if stored else _check_entry(entry, base, s)
    # A built-in family needs its dimensions; an entry model may give them for the cost model.
    required = ... if family is not None else None
    dims = {
        key: s.get(key, int, minimum=1, default=required)
        for key in ("num_layers", "hidden_size", "num_heads", "seq_length", "vocab_size")
    }
    attention = _parse_attention(s, family)
    experts = parse_experts(s, family, dims["num_layers"])
    if (
        attention["head_dim"] is None
        and experts["kv_lora_rank"] is None
        and dims["hidden_size"]
        and dims["num_heads"]
        and dims["hidden_size"] % dims["num_heads"]
    ):
        s.fail(
            "hidden_size",
            f"{dims['hidden_size']} is not a multiple of model.num_heads = "
            f"{dims['num_heads']} (each head gets hidden_size / num_heads unless model.head_dim "
            "says)",
        )
    dims["ffn_hidden_size"] = s.get("ffn_hidden_size", int, minimum=1, default=None)
    if dims["ffn_hidden_size"] is None and dims["hidden_size"] is not None:
        # the family's own width (llama: MindFormers' SwiGLU width); an entry model's 4·hidden
        dims["ffn_hidden_size"] = (
            FAMILIES[family].default_ffn(dims["hidden_size"]) if family else 4 * dims["hidden_size"]
        )
    kv = s.get("num_kv_heads", int, minimum=1, default=None)
    if kv is not None and family not in owners("num_kv_heads"):
        names, choice = _taking("num_kv_heads")
        s.fail("num_kv_heads", f"grouped-query attention is the {names} family's ({choice})")
    if kv is not None and dims["num_heads"] % kv:
        s.fail(
            "num_kv_heads",
            f"{kv} does not divide model.num_heads = {dims['num_heads']} "
            "(each key/value head serves a whole group of query heads)",
        )
    dtype = s.get("dtype", str, default="float32", choices=DTYPES)
    precision = {
        "param_dtype": s.get("param_dtype", str, default="float32", choices=DTYPES),
        "optimizer_dtype": s.get("optimizer_dtype", str, default="float32", choices=DTYPES),
        "flash_attention": s.get("flash_attention", bool, default=False),
    }
    mindformers = _parse_mindformers_run(s, family, dims["num_layers"])
    modules = _recompute_modules(s, family, experts)
    tp_rules = s.get("tp_rules", dict, default={})
    for glob, split in tp_rules.items():
        if not isinstance(glob, str) or split not in TP_SPLITS:
            s.fail(f"tp_rules.{glob}", f"must be one of {', '.join(TP_SPLITS)}, got {split!r}")
    extra = {}
    if entry is None:
        s.reject_unknown()
    else:  # a user model may take settings of its own; they reach build(config) untouched
        extra = {k: v for k, v in s.data.items() if k not in s.used}
    return ModelSpec(
        family,
        entry,
        dtype=dtype,
        **dims,
        num_kv_heads=kv,
        **attention,
        **precision,
        **mindformers,
        **experts,
        recompute_modules=modules,
        tp_rules=tp_rules,
        extra=extra,
    )


def _parse_attention(s: _Section, family: str | None) -> dict:
    """``head_dim`` and ``qk_norm``: the llama family's attention options (MindFormers' Qwen3)."""
    fields = {
        "head_dim": s.get("head_dim", int, minimum=1, default=None),
        "qk_norm": s.get("qk_norm", bool, default=False),
    }
    for name, value in fields.items():
        if value not in (None, False) and family not in owners(name):
            names, choice = _taking(name)
            s.fail(name, f"is the {names} family's attention option ({choice})")
    return fields


def _taking(field: str) -> tuple[str, str]:
    """("llama", "model.family: llama"): the families whose model.yaml takes ``field``, for an
    error about a model that is not one of them."""
    names = owners(field)
    return " or ".join(names), f"model.family: {' | '.join(names)}"


def _parse_mindformers_run(s: _Section, family: str | None, layers: int | None) -> dict:
    """``sequence_parallel``, ``embedding_parallel_optimizer``, ``recompute_layers``: how
    MindFormers runs a llama (its names; `autotune init --mindformers` writes them)."""
    fields = {
        "sequence_parallel": s.get("sequence_parallel", bool, default=False),
        "embedding_parallel_optimizer": s.get("embedding_parallel_optimizer", bool, default=False),
        "recompute_layers": s.get("recompute_layers", dict, default={}),
    }
    for name, value in fields.items():
        if value and family not in owners(name):
            names, choice = _taking(name)
            s.fail(name, f"describes MindFormers' {names} ({choice})")
    for key, value in fields["recompute_layers"].items():
        where = f"recompute_layers.{key}"
        if key not in RECOMPUTE_LAYER_KEYS:
            s.fail(where, f"unknown key (known: {', '.join(RECOMPUTE_LAYER_KEYS)})")
        if value is True:
            continue
        if not isinstance(value, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in value
        ):
            s.fail(
                where, f"must be true or a list of layer indices 0 … {layers - 1}, got {value!r}"
            )
    return fields


def _recompute_modules(s: _Section, family: str | None, experts: dict) -> tuple[str, ...]:
    """``recompute_modules``: Megatron-Core's selective modules, each priced
    (`autotune.families.selective`) and each of a part the model has."""
    modules = s.get("recompute_modules", list, default=[])
    if modules and family not in owners("recompute_modules"):
        names, choice = _taking("recompute_modules")
        s.fail("recompute_modules", f"prices the {names} family's layers ({choice})")
    for name in modules:
        if name in UNPRICED:
            s.fail(
                "recompute_modules",
                f"{name!r}: Megatron's, not priced (priced: {', '.join(MODULES)})",
            )
        if name not in MODULES:
            s.fail("recompute_modules", f"unknown module {name!r} (known: {', '.join(MODULES)})")
    if "mla_up_proj" in modules and experts["kv_lora_rank"] is None:
        s.fail(
            "recompute_modules",
            "'mla_up_proj': the model has no latent attention (model.kv_lora_rank)",
        )
    if "moe_act" in modules and experts["num_experts"] is None:
        s.fail("recompute_modules", "'moe_act': the model has no experts (model.num_experts)")
    return tuple(dict.fromkeys(modules))


def _check_entry(entry: str, base: Path, s: _Section) -> str:
    """Import ``entry`` now (`autotune.spec.entry`'s rule), so a bad entry fails at validation
    rather than inside a trial. Returns it with a file's path made absolute."""
    try:
        entry_loader.load(entry, base)
        return entry_loader.resolve(entry, base)
    except entry_loader.EntryError as exc:
        s.fail("entry", str(exc).removeprefix("model.entry: "))
