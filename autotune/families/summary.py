"""The model as read, in one line: what ``autotune init`` and ``autotune estimate`` print so a
user sees at once whether their model was read as it is.

Contract: :func:`parameter_count` is the number of parameters of a built-in family's ``model``
section (the shapes its network creates, `autotune.families.base.parameter_shapes`; None for a
user ``entry`` model, which must be built to be counted); :func:`model_line` is one line with
that count and the dimensions that decide it — for a mixture of experts the main model's count
(as its publishers count it: multi-token prediction modules apart) and the parameters one
token's forward touches (`autotune.families.moe.active_parameters`).
"""

from __future__ import annotations

import math

from autotune.families import moe
from autotune.families.base import parameter_shapes


def parameter_count(model_cfg: dict) -> int | None:
    """Parameters of ``model_cfg`` (a ``model`` section), None for an ``entry`` model."""
    if not model_cfg.get("family"):
        return None
    return sum(math.prod(shape) for shape in parameter_shapes(model_cfg).values())


def _count(n: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def counts(model_cfg: dict) -> tuple[int, int, int]:
    """``(main model, active per token, MTP modules)`` parameters of a built-in family's
    ``model`` section."""
    shapes = parameter_shapes(model_cfg)
    mtp = sum(math.prod(s) for name, s in shapes.items() if moe.is_mtp(name))
    total = sum(math.prod(s) for s in shapes.values())
    return total - mtp, moe.active_parameters(model_cfg, shapes), mtp


def model_line(model_cfg: dict) -> str:
    """``model: llama, 32.76 B parameters (64 layers, hidden 5120, …)`` of a ``model`` section."""
    if not model_cfg.get("family"):
        return f"model: entry {model_cfg.get('entry')}: parameters counted once it is built"
    c = model_cfg
    main, active, mtp = counts(c)
    count = _count(main) + " parameters"
    if moe.has_experts(c):
        count += f", {_count(active)} active per token"
    if mtp:
        count += f", + {_count(mtp)} in {c['mtp_layers']} MTP module(s)"
    parts = [f"{c['num_layers']} layers", f"hidden {c['hidden_size']}"]
    if moe.has_mla(c):
        q = f"queries through rank {c['q_lora_rank']}, " if c.get("q_lora_rank") else ""
        parts.append(
            f"latent attention ({c['num_heads']} heads of {moe.qk_width(c)}/"
            f"{c['v_head_dim']}, {q}keys and values through rank {c['kv_lora_rank']})"
        )
    elif c.get("num_heads"):
        width = c.get("head_dim") or c["hidden_size"] // c["num_heads"]
        heads = f"{c['num_heads']} heads of {width}"
        if c.get("num_kv_heads") and c["num_kv_heads"] != c["num_heads"]:
            heads += f", {c['num_kv_heads']} key/value heads"
        parts.append(heads)
    if c.get("qk_norm"):
        parts.append("q/k norm")
    if moe.has_experts(c):
        dense = c.get("dense_layers") or 0
        if dense:
            parts.append(f"FFN {c['ffn_hidden_size']} in the first {dense}")
        shared = c.get("shared_ffn_hidden_size")
        parts.append(
            f"{c['num_experts']} experts of {c['moe_ffn_hidden_size']}, "
            f"{c['experts_per_token']} per token" + (f", shared {shared}" if shared else "")
        )
    else:
        parts.append(f"FFN {c['ffn_hidden_size']}")
    if c.get("vocab_size"):
        parts.append(f"vocabulary {c['vocab_size']}")
    if c.get("seq_length") and c.get("num_heads"):
        parts.append(f"sequence {c['seq_length']}")
    if c.get("flash_attention"):
        parts.append("flash attention")
    return f"model: {c['family']}, {count} ({', '.join(parts)})"
