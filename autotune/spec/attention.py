"""Fused attention (``model.flash_attention``, MindFormers' ``use_flash_attention``): where it
runs, and what it asks of the model.

MindSpore 2.10 runs fused attention (``flash_attention_score``) on Ascend only, in float16 or
bfloat16, with a head dimension that is a multiple of 16 (docs/mindformers.md, "Flash
attention"). Elsewhere a model with ``flash_attention: true`` computes the plain softmax
attention, and the cost model prices the s² score tensors there.

Contract: :func:`fused_refusal` says why the fused operator cannot run ``model`` (a spec's
``model`` section), or "" when it can; a backend that runs it (`autotune.spec.backends`, on
Ascend) refuses such a model at validation rather than fall back silently.
"""

from __future__ import annotations

from autotune.families import takes_tokens

FUSED_DTYPES = ("float16", "bfloat16")
HEAD_DIM_MULTIPLE = 16


def fused_refusal(model) -> str:
    """Why fused attention cannot run ``model`` ("" when it can)."""
    if not takes_tokens(model.family):
        return f"the {model.family or 'entry'} model has no attention the fused operator replaces"
    if model.dtype not in FUSED_DTYPES:
        return f"the fused operator computes in {' or '.join(FUSED_DTYPES)}, not {model.dtype}"
    if model.kv_lora_rank:  # latent attention: its heads' query/key and value widths
        widths = {
            "qk_nope_head_dim + qk_rope_head_dim": model.qk_nope_head_dim + model.qk_rope_head_dim,
            "v_head_dim": model.v_head_dim,
        }
    else:
        where = "head_dim" if model.head_dim else "hidden_size / num_heads"
        widths = {where: model.head_dim or model.hidden_size // model.num_heads}
    for where, head_dim in widths.items():
        if head_dim % HEAD_DIM_MULTIPLE:
            return (
                f"the head dimension {head_dim} ({where}) is not a multiple of {HEAD_DIM_MULTIPLE}"
            )
    return ""
