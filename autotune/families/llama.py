"""The ``llama`` family: MindFormers' legacy LLaMA decoder (RMSNorm, grouped-query attention with
rotary embeddings, a SwiGLU feed-forward, an untied head), named and split as MindFormers names
and splits it, with the options MindFormers' mcore Qwen3, Qwen3-MoE and DeepSeek-V3 add.

Its names and shapes are those of MindFormers' legacy ``LlamaForCausalLM``
(``mindformers/models/llama``, docs/mindformers.md "Parameter names"): no biases, grouped-query
``wk``/``wv`` of ``num_kv_heads`` heads, a three-matrix SwiGLU feed-forward, RMSNorm weights, an
untied ``lm_head``. Its network is `autotune.train.models.llama.Llama`.

Options (model.yaml; docs/model-yaml.md): ``head_dim``, the width of every attention head, which
need not be hidden / heads (Qwen3-32B: 64 heads of 128 over a hidden size of 5120, so its
``wq`` is 8192 × 5120); ``qk_norm``, an RMSNorm over each query and key head before the rotary
embedding (``attention.q_layernorm``, ``attention.k_layernorm``: one ``head_dim`` weight each,
shared by the heads, as mcore's ``q_layernorm``/``k_layernorm``), which every Qwen3 layer has;
routed and shared experts, multi-latent attention and multi-token prediction modules
(`autotune.families.moe`: Qwen3-MoE, DeepSeek-V3).
"""

from __future__ import annotations

from autotune.families import moe
from autotune.families.base import Family
from autotune.families.llama_workload import Llama

# MindFormers' parameter names and how its layers split them under tensor parallelism: the legacy
# llama family and the mcore layers (use_legacy: False), each read from MindFormers' source in
# docs/mindformers.md ("Parameter names"). A user's model.tp_rules come first and can override these.
MINDFORMERS_RULES = {
    # legacy llama (mindformers/models/llama)
    "*attention.wq.*": "column",
    "*attention.wk.*": "column",
    "*attention.wv.*": "column",
    "*attention.w_qkv.*": "column",
    "*attention.wo.*": "row",
    "*feed_forward.w1.*": "column",
    "*feed_forward.w3.*": "column",
    "*feed_forward.w_gate_hidden.*": "column",  # w1 and w3 fused, rows interleaved per tp rank
    "*feed_forward.w2.*": "row",
    "*tok_embeddings.*": "column",
    "*lm_head.*": "column",
    # mcore (mindformers/parallel_core/training_graph): ColumnParallelLinear, RowParallelLinear,
    # VocabParallelEmbedding
    "*self_attention.linear_qkv.*": "column",
    "*self_attention.linear_proj.*": "row",
    "*mlp.linear_fc1.*": "column",
    "*mlp.linear_fc2.*": "row",
    "*embedding.word_embeddings.*": "column",
    "*output_layer.*": "column",
}
# The built-in llama family is named as MindFormers' legacy llama (unfused: no qkv_concat) and
# split as MindFormers splits it.
LLAMA_RULES = {
    glob: split
    for glob, split in MINDFORMERS_RULES.items()
    if glob.startswith(("*attention.w", "*feed_forward.w", "*tok_embeddings", "*lm_head"))
    and "w_qkv" not in glob
    and "w_gate_hidden" not in glob
} | moe.MOE_RULES
# Parameters MindFormers' legacy llama creates with parallel_optimizer=False, which MindSpore's
# SplitParam leaves whole ("manually set"): the RMSNorm weights always (LlamaRMSNorm), the token
# table unless model_config.parallel_optimizer (LlamaEmbedding; its default False). The q/k
# norms are kept whole with them: head_dim-wide weights, too small to shard.
LLAMA_NORMS = ("*attention_norm.*", "*ffn_norm.*", "*norm_out.*", "*_layernorm.*")
LLAMA_EMBEDDING = "*tok_embeddings.*"


def llama_ffn(hidden: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The feed-forward width MindFormers' llama derives when ``intermediate_size`` is not given
    (``LlamaFeedForward``, docs/mindformers.md): 4·hidden, times ``ffn_dim_multiplier`` + 0.01
    when given, two thirds of it, rounded up to ``multiple_of``. 4096 → 11008, 5120 → 13824,
    8192 with 1.3 → 28672."""
    width = 4 * hidden
    if ffn_dim_multiplier is not None:
        width = int((ffn_dim_multiplier + 0.01) * width)
    width = int(2 * width / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def kv_heads(model_cfg: dict) -> int:
    """Key/value heads of a llama model (grouped-query attention; all heads when not given)."""
    return model_cfg.get("num_kv_heads") or model_cfg["num_heads"]


def head_dim(model_cfg: dict) -> int:
    """The width of each attention head: ``head_dim`` where given, else hidden / heads."""
    return model_cfg.get("head_dim") or model_cfg["hidden_size"] // model_cfg["num_heads"]


def shapes(cfg: dict) -> dict:
    """The decoder's parameters (see `autotune.families.base.Family.shapes`); with experts,
    latent attention or MTP modules, as `autotune.families.moe` lays them out."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {"model.tok_embeddings.embedding_weight": (vocab, h)}
    for i in range(cfg["num_layers"]):
        out.update(layer_shapes(f"model.layers.{i}", cfg, i))
    out.update(moe.mtp_shapes(cfg, lambda prefix, i: layer_shapes(prefix, cfg, i)))
    out["model.norm_out.weight"] = (h,)
    out["lm_head.weight"] = (vocab, h)
    return out


def layer_shapes(b: str, cfg: dict, index: int) -> dict:
    """One decoder layer's parameters under prefix ``b``; ``index`` decides dense or MoE."""
    h, ffn = cfg["hidden_size"], cfg["ffn_hidden_size"]
    out = {f"{b}.attention_norm.weight": (h,)}
    if moe.has_mla(cfg):
        out.update(moe.mla_shapes(b, cfg))
    else:
        d = head_dim(cfg)
        q_dim, kv_dim = cfg["num_heads"] * d, kv_heads(cfg) * d
        out[f"{b}.attention.wq.weight"] = (q_dim, h)
        out[f"{b}.attention.wk.weight"] = (kv_dim, h)
        out[f"{b}.attention.wv.weight"] = (kv_dim, h)
        if cfg.get("qk_norm"):
            out[f"{b}.attention.q_layernorm.weight"] = (d,)
            out[f"{b}.attention.k_layernorm.weight"] = (d,)
        out[f"{b}.attention.wo.weight"] = (h, q_dim)
    out[f"{b}.ffn_norm.weight"] = (h,)
    if moe.moe_layer(cfg, index):
        out.update(moe.moe_shapes(b, cfg))
    else:
        out[f"{b}.feed_forward.w1.weight"] = (ffn, h)  # gate
        out[f"{b}.feed_forward.w2.weight"] = (h, ffn)  # down
        out[f"{b}.feed_forward.w3.weight"] = (ffn, h)  # up
    return out


def optimizer_whole(model_cfg: dict) -> tuple[str, ...]:
    """The norms always, and the token table unless ``embedding_parallel_optimizer``
    (see :data:`LLAMA_NORMS`)."""
    return (
        LLAMA_NORMS
        + moe.LATENT_NORMS
        + (() if model_cfg.get("embedding_parallel_optimizer") else (LLAMA_EMBEDDING,))
    )


FAMILY = Family(
    "llama",
    "MindFormers' legacy LLaMA decoder (and its mcore Qwen3: head_dim, qk_norm)",
    shapes,
    LLAMA_RULES,
    Llama,
    default_ffn=llama_ffn,
    fields=(
        "num_kv_heads",
        "head_dim",
        "qk_norm",
        "sequence_parallel",
        "embedding_parallel_optimizer",
        "recompute_layers",
        "recompute_modules",
        *moe.FIELDS,
    ),
    optimizer_whole=optimizer_whole,
    # what its layer represents: Qwen 1.5/2/2.5, Yi, CodeLlama, DeepSeek-Coder use LlamaForCausalLM
    # MindFormers' research DeepSeek-V2/V3 (experts, latent attention: autotune.families.moe)
    mindformers_architectures=(
        "LlamaForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
    ),
    # mcore model types (their defaults: autotune.spec.mindformers_mcore.MCORE_TYPES)
    mindformers_model_types=("qwen3", "qwen3_moe", "deepseek_v3"),
)
