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

from dataclasses import dataclass, replace
from typing import ClassVar

from autotune.families import moe
from autotune.families.base import Family
from autotune.families.layers import stage_layers
from autotune.families.moe_workload import MoEOptions
from autotune.families.transformer import Transformer
from autotune.families.workload import dimensions

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


@dataclass(frozen=True)
class Llama(Transformer):
    """MindFormers' legacy llama layer: RMSNorm → grouped-query attention with rotary
    embeddings → RMSNorm → SwiGLU (w2(silu(w1·x) · w3·x)); no dropout, untied head."""

    family: ClassVar[str] = "llama"
    kv_heads: int = 0  # key/value heads (grouped-query attention)
    head_dim: int = 0  # each head's width (0: hidden / heads)
    qk_norm: bool = False  # an RMSNorm on each query and key head (Qwen3)
    # experts, latent attention, MTP modules (`autotune.families.moe_workload`); None: none
    moe: MoEOptions | None = None
    gathered_experts: bool = False  # see executed_by

    def executed_by(self, engine: str) -> Llama:
        """Under autotune's trainer (`autotune.train.models.moe`) each rank runs its local
        experts over every token its ep group gathered (weighting 0 those not routed to it):
        the routed experts priced at top-k = E, the dispatch and combine all-reduces of the
        group's rows (`autotune.costmodel.moe_time`). Under Megatron, sequence parallelism
        keeps each linear layer's input as its shard and all-gathers it again in the backward
        (LinearWithGradAccumulationAndAsyncCommunication): every layer's norms' communication
        recomputed."""
        if engine == "megatron" and self.sequence_parallel:
            marks = dict(self.recompute_marks, select_comm_recompute=True)
            return replace(self, recompute_marks=tuple(sorted(marks.items())))
        if engine != "trainer" or not self.experts:
            return self
        return replace(self, moe=replace(self.moe, top_k=self.moe.experts), gathered_experts=True)

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention's output: heads × head width."""
        return self.heads * self.head_width

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_width

    @classmethod
    def of(cls, model, fused_attention: bool = False, sequence_parallel: bool = False):
        marks = tuple(
            sorted(
                (key, value if value is True else tuple(value))
                for key, value in model.recompute_layers.items()
            )
        )
        return cls(
            *dimensions(model),
            fused_attention,
            sequence_parallel,
            marks,
            model.embedding_parallel_optimizer,
            kv_heads=model.num_kv_heads or model.num_heads,
            head_dim=model.head_dim or 0,
            qk_norm=model.qk_norm,
            moe=MoEOptions.of(model),
        )

    def layout_config(self) -> dict:
        return {
            **super().layout_config(),
            "num_kv_heads": self.kv_heads,
            "head_dim": self.head_dim or None,
            "qk_norm": self.qk_norm,
            **(self.moe.config() if self.moe else {}),
        }

    @property
    def mla(self) -> bool:
        return self.moe is not None and self.moe.mla

    @property
    def experts(self) -> bool:
        return self.moe is not None and self.moe.experts > 1

    def attention_flops(self) -> float:
        """QKᵀ and AV over the heads' width: 4·s²·q_dim forward, the causal half fused."""
        if self.mla:
            return self.moe.core_flops(self.seq, self.heads, self.fused_attention)
        return (2 if self.fused_attention else 4) * self.seq * self.seq * self.q_dim

    def projection_flops(self) -> float:
        """The attention's projections per token, forward: 2·(2h·q_dim + 2h·kv_dim)."""
        if self.mla:
            return self.moe.projection_flops(self.hidden, self.heads)
        return 4 * self.hidden * (self.q_dim + self.kv_dim)

    def ffn_flops(self) -> float:
        """The feed-forward per token, forward (averaged over dense and MoE layers)."""
        if self.moe is None:
            return 6 * self.hidden * self.ffn
        return self.moe.ffn_flops(self.hidden, self.ffn, self.layers)

    def layer_flops(self) -> float:
        # the seven GEMMs' 2·(2h·q_dim + 2h·kv_dim + 3h·ffn) per token, QKᵀ and AV;
        # backward = 2 × forward. The q/k norms are element-wise (not counted).
        s = self.seq
        return 3 * (s * (self.projection_flops() + self.ffn_flops()) + self.attention_flops())

    def part_flops(self) -> dict:
        parts = {}
        if self.experts:
            share = self.moe.moe_share(self.layers)
            parts["experts"] = 3 * self.seq * share * self.moe.moe_flops(self.hidden)
        if self.mla:
            parts["mla"] = 3 * self.seq * self.projection_flops()
        return parts

    def routed_flops(self) -> float:
        if not self.experts:
            return 0.0
        share = self.moe.moe_share(self.layers)
        return 3 * self.seq * share * self.moe.routed_flops(self.hidden)

    @property
    def capacity(self) -> float:
        return self.moe.capacity if self.experts else 0.0

    @property
    def legacy_experts(self) -> bool:
        return self.experts and self.moe.expert_tp

    @property
    def fp8_linear(self) -> bool:
        return self.moe is not None and self.moe.fp8

    @property
    def moe_comm_overlap(self) -> bool:
        return self.experts and self.moe.overlap

    @property
    def node_limit(self) -> int:
        return self.moe.node_limit if self.experts else 0

    @property
    def dualpipe(self) -> bool:
        return self.moe is not None and self.moe.schedule == "dualpipe"

    @property
    def top_k(self) -> int:
        return self.moe.top_k if self.experts else 0

    def router_flops(self) -> float:
        if not self.experts:
            return 0.0
        share = self.moe.moe_share(self.layers)
        return 3 * self.seq * share * 2 * self.hidden * self.moe.experts

    def linear_flops(self) -> float:
        return 3 * self.seq * (self.projection_flops() + self.ffn_flops()) - self.router_flops()

    def mtp_flops(self, linear: bool = False) -> float:
        """Each MTP module: its projection, one layer (an MoE one with experts), its logits;
        ``linear``: only its linear layers' GEMMs (the projection and the layer's, not the
        attention core, the router or the logits)."""
        if self.moe is None or not self.moe.mtp:
            return 0.0
        s, h = self.seq, self.hidden
        ffn = self.moe.moe_flops(h) if self.experts else 6 * h * self.ffn
        if linear:
            router = 2 * h * self.moe.experts if self.experts else 0
            return self.moe.mtp * 3 * s * (self.projection_flops() + ffn - router + 4 * h * h)
        layer = 3 * (s * (self.projection_flops() + ffn) + self.attention_flops())
        return self.moe.mtp * (layer + 6 * s * (2 * h * h + h * self.vocab))

    def stage_moe_layers(self, pp: int, stage: int) -> int:
        if not self.experts:
            return 0
        return sum(self.moe.moe_layer(i) for i in stage_layers(self.layers, pp, stage))

    def dispatch_bytes(self, dtype_bytes: int) -> float:
        if not self.experts:
            return 0.0
        return self.moe.dispatch_elements(self.seq, self.hidden) * dtype_bytes

    def kv_bytes(self, dtype_bytes: int) -> float:
        if self.mla:
            return self.moe.kv_elements(self.seq, self.heads) * dtype_bytes
        return 2 * self.seq * self.kv_dim * dtype_bytes

    def head_exchange_bytes(self, dtype_bytes: int) -> tuple[float, float]:
        """Queries, keys (grouped, or latent attention's per-head ones) and values; the output."""
        s, h = self.seq, self.heads
        if self.mla:  # per head: a query and a key of qk_width, a value and an output of v_dim
            qkv, out = s * h * (2 * self.moe.qk_width + self.moe.v_dim), s * h * self.moe.v_dim
        else:
            qkv, out = s * (self.q_dim + 2 * self.kv_dim), s * self.q_dim
        return qkv * dtype_bytes, out * dtype_bytes

    def recompute_flops(self, mode: str) -> float:
        if mode == "selective":  # MindFormers' patterns: element-wise, no FLOPs; the core unfused
            return 0.0 if self.fused_attention else self.attention_flops()
        return super().recompute_flops(mode)

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int, comm: bool = False) -> float:
        s, h, a = self.seq, self.hidden, self.heads
        scale = dtype_bytes / 2  # the counts below are 16-bit bytes
        split = self.sequence_parallel and tp > 1
        if mode == "full":
            return 2 * s * h * scale / (tp if split else 1)
        # the two norm inputs, and the two norm outputs the matmuls' backward needs (gathered
        # under sequence parallelism unless their all-gather is recomputed)
        norms = 4 * h / tp + (4 * h / tp if comm else 4 * h) if split else 8 * h
        swiglu = (8 if mode == "none" else 4) * self.ffn  # gate, up (+ SiLU, product)
        # q, k, v after the rotary embedding and the output projection's input; with q/k norms
        # also the norms' inputs (an RMSNorm's backward needs its input)
        attention = 4 * self.q_dim + 4 * self.kv_dim
        if self.qk_norm:
            attention += 2 * (self.q_dim + self.kv_dim)
        if self.moe is None:
            stored = s * (norms + (attention + swiglu) / tp)
        else:  # experts and latent attention (`autotune.families.moe_workload`)
            ffn = self.moe.ffn_bytes(self.hidden, self.ffn, self.layers, mode, tp)
            if self.mla:
                stored = s * (norms + self.moe.attention_bytes(self.heads, tp) + ffn)
            else:
                stored = s * (norms + attention / tp + ffn)
        if mode == "none" and not self.fused_attention:
            stored += 2 * a * s * s / tp  # the softmax output (no dropout)
        return stored * scale

    def first_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        return 0.0  # no embedding dropout

    def last_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        """The head's, and each MTP module's: one layer's and one more logits tensor."""
        head = super().last_stage_activations(tp, dtype_bytes)
        if self.moe is None or not self.moe.mtp:
            return head
        return head + self.moe.mtp * (head + self.layer_activations(tp, "none", dtype_bytes))


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
