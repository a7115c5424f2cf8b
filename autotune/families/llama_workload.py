"""The ``llama`` family's workload: what one sample of MindFormers' legacy LLaMA layer (and the
options MindFormers' mcore Qwen3, Qwen3-MoE and DeepSeek-V3 add) costs, for the cost model.

Contract: :class:`Llama` is the family's `autotune.families.workload.Workload` — the
transformer's accounting (`autotune.families.transformer`) for a layer of RMSNorm, grouped-query
attention with rotary embeddings, RMSNorm and SwiGLU, with ``head_dim``/``qk_norm`` (Qwen3),
experts, latent attention and MTP modules (`autotune.families.moe_workload`), and what selective
recompute rebuilds (`autotune.families.selective`); :meth:`Llama.executed_by` says how an engine
runs it differently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from autotune.families import selective
from autotune.families.layers import stage_layers
from autotune.families.moe_workload import MoEOptions
from autotune.families.transformer import Transformer
from autotune.families.workload import dimensions


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
    recompute_modules: tuple = ()  # Megatron's selective modules (`autotune.families.selective`)

    def executed_by(self, engine: str) -> Llama:
        """Under autotune's trainer (`autotune.train.models.moe`) each rank runs its local
        experts over every token its ep group gathered (weighting 0 those not routed to it):
        the routed experts priced at top-k = E, the dispatch and combine all-reduces of the
        group's rows (`autotune.costmodel.moe_time`). Under Megatron, sequence parallelism
        keeps each linear layer's input as its shard and all-gathers it again in the backward
        (LinearWithGradAccumulationAndAsyncCommunication): every layer's norms' communication
        recomputed; and the router's probabilities multiply the experts' SwiGLU output
        (TEGroupedMLP's weighted_bias_swiglu_impl, Megatron-Core 0.13 on), so the combine
        sums the expert outputs unweighted and keeps none of them. ``recompute_modules`` are
        Megatron's: the other engines run their own selective patterns."""
        if engine != "megatron" and self.recompute_modules:
            return replace(self, recompute_modules=()).executed_by(engine)
        if engine == "megatron":
            work = self
            if self.moe is not None:
                work = replace(work, moe=replace(self.moe, weighted_combine=False))
            if self.sequence_parallel:
                marks = dict(self.recompute_marks, select_comm_recompute=True)
                work = replace(work, recompute_marks=tuple(sorted(marks.items())))
            return work
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
            recompute_modules=tuple(model.recompute_modules),
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
    def interleave(self) -> int:
        return max(1, self.moe.interleave) if self.moe is not None else 1

    @property
    def fsdp(self) -> bool:
        return self.moe is not None and self.moe.fsdp

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
        if mode != "selective":
            return super().recompute_flops(mode)
        # norms and SwiGLUs are element-wise (no FLOPs); the core when unfused, the up-projections
        parts = selective.recomputed(mode, self.recompute_modules)
        core = "core_attn" in parts and not self.fused_attention
        up = "mla_up_proj" in parts and self.mla
        return (self.attention_flops() if core else 0.0) + (
            self.seq * self.moe.up_projection_flops(self.heads) if up else 0.0
        )

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int, comm: bool = False) -> float:
        s, h, a = self.seq, self.hidden, self.heads
        scale = dtype_bytes / 2  # the counts below are 16-bit bytes
        split = self.sequence_parallel and tp > 1
        if mode == "full":
            return 2 * s * h * scale / (tp if split else 1)
        parts = selective.recomputed(mode, self.recompute_modules)
        # the two norm inputs, and the two norm outputs the matmuls' backward needs (gathered
        # under sequence parallelism unless their all-gather is recomputed) unless rebuilt
        norms = 4 * h / tp + (4 * h / tp if comm else 4 * h) if split else 8 * h
        if "layernorm" in parts:
            norms = 4 * h / tp if split else 4 * h
        swiglu = (4 if "mlp_act" in parts else 8) * self.ffn  # gate, up (+ SiLU, product)
        # q, k, v after the rotary embedding and the output projection's input; with q/k norms
        # also the norms' inputs (an RMSNorm's backward needs its input)
        attention = 4 * self.q_dim + 4 * self.kv_dim
        if self.qk_norm:
            attention += 2 * (self.q_dim + self.kv_dim)
        if self.moe is None:
            stored = s * (norms + (attention + swiglu) / tp)
        else:  # experts and latent attention (`autotune.families.moe_workload`)
            ffn = self.moe.ffn_bytes(self.hidden, self.ffn, self.layers, parts, tp)
            if self.mla:
                up = "mla_up_proj" in parts
                stored = s * (norms + self.moe.attention_bytes(self.heads, tp, up) + ffn)
            else:
                stored = s * (norms + attention / tp + ffn)
        if "core_attn" not in parts and not self.fused_attention:
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
