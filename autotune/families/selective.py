"""What a layer under selective recompute does not keep for its backward, and rebuilds there.

Contract: :func:`recomputed` gives, for one layer's recompute mode and the model's
``recompute_modules``, the set of parts the layer rebuilds in the backward instead of keeping —
:data:`MODULES`' names, and ``mlp_act``, the dense and shared SwiGLUs' — empty unless the mode
is ``selective`` (``full`` rebuilds the whole layer and is priced apart). The llama workload
(`autotune.families.llama_workload`) prices each part's memory and FLOPs; this module only
names them.

- Without ``recompute_modules``: MindFormers' default ``select_recompute`` patterns, which every
  engine is priced with — the SwiGLU's activation and product of every feed-forward (dense,
  routed and shared experts) and, unfused, the attention core's softmax.
- With them (model.yaml ``recompute_modules``, Megatron-Core's ``--recompute-modules`` under
  ``--recompute-granularity selective``; the ``megatron`` engine only — the others run their
  own patterns): exactly the modules listed, of :data:`MODULES` — ``core_attn`` the attention
  core (Megatron's default), ``layernorm`` the two RMSNorms (their outputs not kept),
  ``mla_up_proj`` latent attention's up-projections (the per-head queries, keys and values not
  kept; rebuilt from the latents), ``moe_act`` the routed experts' SwiGLU (its output not kept;
  Megatron-Core's ``GroupedMLP``: ``activation_recompute`` when ``"moe_act" in
  recompute_modules``). Megatron's ``mlp``, ``moe`` and ``shared_experts`` (whole sub-modules)
  are not priced, so model.yaml refuses them (:data:`UNPRICED`).
"""

from __future__ import annotations

MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act")
UNPRICED = ("mlp", "moe", "shared_experts")
MINDFORMERS_PATTERNS = frozenset({"core_attn", "moe_act", "mlp_act"})


def recomputed(mode: str, modules: tuple[str, ...]) -> frozenset[str]:
    """The parts a layer recomputed ``mode`` rebuilds (see the module doc)."""
    if mode != "selective":
        return frozenset()
    return frozenset(modules) if modules else MINDFORMERS_PATTERNS
