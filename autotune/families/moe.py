"""Mixture of experts, multi-latent attention and multi-token prediction: the llama family's
options for MindFormers' Qwen3-MoE and DeepSeek-V3 (MindSpore-free).

Contract: the functions below read a llama ``model`` section's options (docs/model-yaml.md,
"Experts, latent attention, multi-token prediction") and give their parameters' names and
shapes, in the network's order, and the counts a person checks a model by:

- experts: ``num_experts`` routed experts in each MoE layer (None: a dense model), of which a
  token goes to ``experts_per_token``; each a SwiGLU ``moe_ffn_hidden_size`` wide, stacked on
  dim 0 (``feed_forward.experts.w1/w2/w3``: (E, out, in)); ``shared_ffn_hidden_size``, the
  shared experts' width together (every token goes through them; DeepSeek's
  ``n_shared_experts × moe_intermediate_size``); a router (``feed_forward.router``, (E, h));
  the first ``dense_layers`` layers keep the dense ``ffn_hidden_size`` SwiGLU (DeepSeek's
  ``first_k_dense_replace``). ``moe_capacity_factor`` (None: dropless) bounds the tokens an
  expert takes; it changes work, not parameters. ``experts_tensor_parallel``: each expert is split
  over tp as well (MindFormers' legacy MoE; its mcore one splits experts over ep only:
  `autotune.layout`). DeepSeek-V3's router bias for its
  auxiliary-loss-free balancing (E values per layer, no gradient) is not counted.
- multi-latent attention (``kv_lora_rank`` given; DeepSeek-V2/V3): queries through a
  ``q_lora_rank`` bottleneck with its RMSNorm (``attention.wq_a``, ``q_a_norm``, ``wq_b``; a
  whole ``wq`` without one), keys and values from one compressed latent (``attention.wkv_a``:
  ``kv_lora_rank`` + the shared rotary key ``qk_rope_head_dim``; ``kv_a_norm``; ``wkv_b``:
  per head a ``qk_nope_head_dim`` key and a ``v_head_dim`` value), each head's query and key
  ``qk_nope_head_dim + qk_rope_head_dim`` wide, the output ``wo`` over heads × ``v_head_dim``.
- multi-token prediction (``mtp_layers``; DeepSeek-V3's ``num_nextn_predict_layers``): per
  module two RMSNorms (``enorm`` of the next token's embedding, ``hnorm`` of the hidden
  state), their concatenation projected back (``eh_proj``, (h, 2h)), one decoder layer (an MoE
  one where the model has experts) and a final norm; the embedding and the head are the main
  model's. Named ``model.mtp.<j>.``: after the layers, on the last pipeline stage.
- how the run computes and communicates them, which changes no parameter (the cost model's,
  `autotune.families.moe_workload`): ``fp8_linear``, the linear layers' GEMMs in FP8
  (DeepSeek-V3's FP8 mixed precision); ``moe_comm_overlap``, the expert all-to-alls overlapped
  with computation (DeepSeek-V3's DualPipe, MindFormers' ``comp_comm_parallel``, Megatron's
  ``overlap_moe_expert_parallel_comm``); ``moe_node_limit``, the nodes a token's experts may be
  on, each reached once (DeepSeek-V3's node-limited routing, ``topk_group`` 4 of its 8 one-node
  groups, with its per-node deduplicated dispatch); ``pipeline_schedule: dualpipe``, DeepSeek-V3's
  bidirectional pipeline, and ``pipeline_interleave``, v chunks of layers per stage (Megatron's
  virtual pipeline, MindFormers' ``pp_interleave_num``), both `autotune.costmodel.schedules`;
  ``fsdp``, parameters, gradients and optimizer states sharded over data parallelism
  (Megatron-FSDP, `autotune.costmodel.fsdp`).

:func:`active_parameters` is what one token's forward touches: every parameter but the routed
experts it is not sent to (the token table counted whole, as Qwen counts "activated"
parameters).
"""

from __future__ import annotations

import math

# parameter-name globs → how tensor parallelism splits them (the llama family's rules add these):
# MindFormers' mcore MLA splits the up-projections over heads and keeps the down-projections
# whole (Megatron's "duplicated" linear_q_down_proj / linear_kv_down_proj); its experts are
# split over expert parallelism only (`autotune.layout`'s "expert": dim 0 over ep); the shared
# experts as a dense SwiGLU, as autotune's trainer and Megatron split them (MindFormers' mcore
# keeps them whole: docs/costmodel.md, "Not modelled").
MOE_RULES = {
    "*attention.wq_b.*": "column",
    "*attention.wkv_b.*": "column",
    "*feed_forward.experts.*": "expert",
    "*feed_forward.shared.w1.*": "column",
    "*feed_forward.shared.w3.*": "column",
    "*feed_forward.shared.w2.*": "row",
}
# the latent norms are head_dim-small and whole, as the llama's q/k norms are
LATENT_NORMS = ("*_a_norm.*",)
MTP_PREFIX = "model.mtp."
# the model.yaml fields these options take (the llama family's, beside its own)
FIELDS = (
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "shared_ffn_hidden_size",
    "dense_layers",
    "moe_capacity_factor",
    "experts_tensor_parallel",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "mtp_layers",
    "fp8_linear",
    "moe_comm_overlap",
    "moe_node_limit",
    "pipeline_schedule",
    "pipeline_interleave",
    "fsdp",
)
# The options autotune's trainer (`autotune.train`) does not build, and why: its network refuses
# them by key, and the trainer program refuses a study with them before any trial where its
# trials are the trainer's runs (`autotune.spec.programs.Trainer.check`); the cost model prices
# them. Here because both import this module and neither may import the other.
TRAINER_UNBUILT = {
    "mtp_layers": "the trial program builds no multi-token prediction modules",
    "moe_capacity_factor": (
        "the trial program's experts are dropless (a capacity drops tokens by the batch's "
        "composition, which a layout changes)"
    ),
    "experts_tensor_parallel": "the trial program splits experts over ep only, not over tp",
    "fp8_linear": "the trial program computes no FP8 GEMMs (it trains in the compute dtype)",
}


def trainer_unbuilt(option) -> list[tuple[str, object, str]]:
    """``(key, value, why)`` of each :data:`TRAINER_UNBUILT` option set (truthy) where
    ``option(key)`` reads the model's options."""
    return [(key, option(key), why) for key, why in TRAINER_UNBUILT.items() if option(key)]


def has_experts(cfg: dict) -> bool:
    return (cfg.get("num_experts") or 0) > 1


def has_mla(cfg: dict) -> bool:
    return bool(cfg.get("kv_lora_rank"))


def moe_layer(cfg: dict, layer: int) -> bool:
    """Whether layer ``layer`` (a main-model index; an MTP module's is past the last) routes
    its tokens to experts."""
    return has_experts(cfg) and layer >= (cfg.get("dense_layers") or 0)


def moe_layers(cfg: dict) -> int:
    """MoE layers of the main model."""
    return sum(moe_layer(cfg, i) for i in range(cfg["num_layers"]))


def qk_width(cfg: dict) -> int:
    """An MLA head's query and key width: its unrotated and rotary parts."""
    return cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]


def mla_shapes(b: str, cfg: dict) -> dict:
    """The latent attention of layer prefix ``b`` (see the module doc)."""
    h, heads = cfg["hidden_size"], cfg["num_heads"]
    q_rank, kv_rank = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    rope, nope, v = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    out = {}
    if q_rank:
        out[f"{b}.attention.wq_a.weight"] = (q_rank, h)
        out[f"{b}.attention.q_a_norm.weight"] = (q_rank,)
        out[f"{b}.attention.wq_b.weight"] = (heads * (nope + rope), q_rank)
    else:
        out[f"{b}.attention.wq.weight"] = (heads * (nope + rope), h)
    out[f"{b}.attention.wkv_a.weight"] = (kv_rank + rope, h)
    out[f"{b}.attention.kv_a_norm.weight"] = (kv_rank,)
    out[f"{b}.attention.wkv_b.weight"] = (heads * (nope + v), kv_rank)
    out[f"{b}.attention.wo.weight"] = (h, heads * v)
    return out


def moe_shapes(b: str, cfg: dict) -> dict:
    """The routed and shared experts of layer prefix ``b`` (see the module doc)."""
    h, experts, width = cfg["hidden_size"], cfg["num_experts"], cfg["moe_ffn_hidden_size"]
    f = f"{b}.feed_forward"
    out = {
        f"{f}.router.weight": (experts, h),
        f"{f}.experts.w1.weight": (experts, width, h),  # gate
        f"{f}.experts.w2.weight": (experts, h, width),  # down
        f"{f}.experts.w3.weight": (experts, width, h),  # up
    }
    shared = cfg.get("shared_ffn_hidden_size")
    if shared:
        out[f"{f}.shared.w1.weight"] = (shared, h)
        out[f"{f}.shared.w2.weight"] = (h, shared)
        out[f"{f}.shared.w3.weight"] = (shared, h)
    return out


def mtp_shapes(cfg: dict, layer) -> dict:
    """The multi-token prediction modules; ``layer(prefix, index)`` lays out one decoder layer."""
    h, out = cfg["hidden_size"], {}
    for j in range(cfg.get("mtp_layers") or 0):
        m = f"{MTP_PREFIX}{j}"
        out[f"{m}.enorm.weight"] = (h,)
        out[f"{m}.hnorm.weight"] = (h,)
        out[f"{m}.eh_proj.weight"] = (h, 2 * h)
        out.update(layer(m, cfg["num_layers"] + j))
        out[f"{m}.norm.weight"] = (h,)
    return out


def is_mtp(name: str) -> bool:
    return name.startswith(MTP_PREFIX)


def active_parameters(cfg: dict, shapes: dict) -> int:
    """Parameters one token's forward touches (see the module doc), MTP modules left out."""
    total = sum(math.prod(s) for n, s in shapes.items() if not is_mtp(n))
    if not has_experts(cfg):
        return total
    per_expert = 3 * cfg["hidden_size"] * cfg["moe_ffn_hidden_size"]
    idle = cfg["num_experts"] - cfg["experts_per_token"]
    return total - moe_layers(cfg) * idle * per_expert
