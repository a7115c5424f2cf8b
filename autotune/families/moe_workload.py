"""What experts, latent attention and MTP modules cost per sample: the cost model's side of the
llama family's options (`autotune.families.moe`), MindSpore-free.

Contract: :class:`MoEOptions` holds a ``model`` section's options (:meth:`MoEOptions.of`; None
for a model without any) and prices them for the llama workload that carries it
(`autotune.families.llama_workload.Llama`), per sample of ``seq`` tokens, FLOPs counting a multiply-add
as 2 (forward only unless a name says fwd+bwd, where backward = 2 × forward):

- routed experts: per token 2·3·h·f_e for each of the k experts it goes to, the shared experts
  2·3·h·f_s, the router 2·h·E (its scores); a dense first layer 2·3·h·ffn. The per-layer
  figures the workload reports are averages over the model's layers (a stage with the dense
  first layers is priced at the average; its parameters are counted exactly by the layout).
- multi-latent attention: per token the projections 2·(h·r_q + r_q·H·d_qk + h·(r_kv + d_rope) +
  r_kv·H·(d_nope + d_v) + H·d_v·h) (r_q = 0: 2·h·H·d_qk), and per sample QKᵀ over d_qk and AV
  over d_v: 2·s²·H·(d_qk + d_v), the causal half when fused.
- activations kept for the backward (16-bit bytes per token and layer, as the llama's): MLA's
  latents and their norms' outputs (4·r_q + 2·(r_kv + d_rope) + 2·r_kv, whole on every tp rank)
  and per head q, k, v and the output projection's input ((4·H·d_qk + 4·H·d_v) / tp; only the
  latter, 2·H·d_v / tp, when selective recompute rebuilds the up-projections); an MoE layer's
  router scores and probabilities (float32: 8·E), the k dispatched copies of the token (2·k·h)
  and, where the combine weights the k expert outputs by their probabilities
  (``weighted_combine``), those outputs for the router's gradient (2·k·h), each expert's
  SwiGLU (8·k·f_e, 4·k·f_e when selective recompute rebuilds its output), the shared experts'
  (8·f_s, likewise 4·f_s); which parts selective recompute rebuilds is
  `autotune.families.selective`'s. A capacity factor c pads the dispatched buffers (× c). With
  FP8 linear layers the dispatched copies and the SwiGLU's cached inputs are kept in FP8, 1
  byte (DeepSeek-V3 §3.3.3: activations quantized before the dispatch, the SwiGLU's inputs
  cached in FP8): k·h and half the SwiGLU's. MindFormers splits an MoE layer's tokens over
  dp·tp·cp, so those are per tp rank (/ tp) too.
- an MTP module per sample: the projection of the concatenated norms (2·2h·h per token), one
  decoder layer (an MoE one where the model has experts), its own logits (2·h·V per token);
  fwd+bwd, on the last stage, with the activations of one layer and one more logits tensor.
- expert-parallel messages: one dispatch (or combine) moves the k copies of each token,
  k·h elements (× c with a capacity factor); context parallelism moves each layer's keys and
  values, s·(H·d_qk + H·d_v) elements per sample with latent attention.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class MoEOptions:
    """A llama model's experts, latent attention and MTP modules (0: none)."""

    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    capacity: float = 0.0  # 0: dropless
    expert_tp: bool = False  # each expert split over tp too (its layout only)
    q_rank: int = 0
    kv_rank: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_dim: int = 0
    mtp: int = 0
    fp8: bool = False  # the linear layers' GEMMs in FP8
    overlap: bool = False  # the expert all-to-alls overlapped with computation
    node_limit: int = 0  # 0: a token's experts on any node, each copy sent on its own
    schedule: str = ""  # the pipeline's: "" (1F1B) or "dualpipe"
    interleave: int = 0  # chunks of layers per pipeline stage (0, 1: not interleaved)
    fsdp: bool = False  # parameters, gradients and states sharded over dp (Megatron-FSDP)
    # the combine weights the k expert outputs by their probabilities, so keeps them for the
    # router's gradient; an engine's choice, no model.yaml field (Llama.executed_by)
    weighted_combine: bool = True

    # model.yaml's name of each field (`autotune.families.moe.FIELDS`)
    NAMES = {
        "experts": "num_experts",
        "top_k": "experts_per_token",
        "expert_ffn": "moe_ffn_hidden_size",
        "shared_ffn": "shared_ffn_hidden_size",
        "dense_layers": "dense_layers",
        "capacity": "moe_capacity_factor",
        "expert_tp": "experts_tensor_parallel",
        "q_rank": "q_lora_rank",
        "kv_rank": "kv_lora_rank",
        "qk_nope": "qk_nope_head_dim",
        "qk_rope": "qk_rope_head_dim",
        "v_dim": "v_head_dim",
        "mtp": "mtp_layers",
        "fp8": "fp8_linear",
        "overlap": "moe_comm_overlap",
        "node_limit": "moe_node_limit",
        "schedule": "pipeline_schedule",
        "interleave": "pipeline_interleave",
        "fsdp": "fsdp",
    }

    @classmethod
    def of(cls, model) -> MoEOptions | None:
        """The options of a spec's ``model`` section, None when it has none."""
        values = {
            f.name: getattr(model, cls.NAMES[f.name]) or 0
            for f in fields(cls)
            if f.name in cls.NAMES
        }
        return cls(**values) if any(values.values()) else None

    def config(self) -> dict:
        """The options as model.yaml fields (None where absent), for the layout."""
        # where absent; the rest None
        counts = {
            "dense_layers": 0,
            "mtp": 0,
            "expert_tp": False,
            "fp8": False,
            "overlap": False,
            "fsdp": False,
        }
        return {name: getattr(self, key) or counts.get(key) for key, name in self.NAMES.items()}

    @property
    def mla(self) -> bool:
        return self.kv_rank > 0

    @property
    def qk_width(self) -> int:
        return self.qk_nope + self.qk_rope

    def moe_layer(self, layer: int) -> bool:
        return self.experts > 1 and layer >= self.dense_layers

    def moe_share(self, layers: int) -> float:
        """The share of the model's layers that route to experts."""
        return sum(self.moe_layer(i) for i in range(layers)) / layers

    # -- FLOPs, forward, per token unless a sample --------------------------------------------
    def projection_flops(self, hidden: int, heads: int) -> float:
        """MLA's projections per token (see the module doc)."""
        h, r_q, r_kv = hidden, self.q_rank, self.kv_rank
        queries = h * r_q + r_q * heads * self.qk_width if r_q else h * heads * self.qk_width
        latent = h * (r_kv + self.qk_rope) + r_kv * heads * (self.qk_nope + self.v_dim)
        return 2 * (queries + latent + heads * self.v_dim * h)

    def core_flops(self, seq: int, heads: int, fused: bool) -> float:
        """MLA's QKᵀ and AV per sample (the causal half when fused)."""
        return (1 if fused else 2) * seq * seq * heads * (self.qk_width + self.v_dim)

    def routed_flops(self, hidden: int) -> float:
        """A token's routed experts in one MoE layer."""
        return 6 * hidden * self.expert_ffn * self.top_k

    def moe_flops(self, hidden: int) -> float:
        """A token's MoE layer: routed and shared experts and the router."""
        return self.routed_flops(hidden) + 6 * hidden * self.shared_ffn + 2 * hidden * self.experts

    def ffn_flops(self, hidden: int, ffn: int, layers: int) -> float:
        """A token's feed-forward, averaged over the layers (dense first ones included)."""
        share = self.moe_share(layers) if self.experts > 1 else 0.0
        return share * self.moe_flops(hidden) + (1 - share) * 6 * hidden * ffn

    # -- activations, 16-bit bytes per token and layer on one tp rank -------------------------
    def attention_bytes(self, heads: int, tp: int, up_recomputed: bool = False) -> float:
        """A token's latent attention activations; ``up_recomputed``: the up-projections
        rebuilt in the backward, so of the per-head tensors only the output projection's input
        is kept."""
        latents = 4 * self.q_rank + 2 * (self.kv_rank + self.qk_rope) + 2 * self.kv_rank
        if up_recomputed:
            return latents + 2 * heads * self.v_dim / tp
        return latents + (4 * heads * self.qk_width + 4 * heads * self.v_dim) / tp

    def up_projection_flops(self, heads: int) -> float:
        """MLA's up-projections per token, forward: the per-head queries, keys and values."""
        queries = self.q_rank * heads * self.qk_width if self.q_rank else 0
        return 2 * (queries + self.kv_rank * heads * (self.qk_nope + self.v_dim))

    def ffn_bytes(self, hidden: int, ffn: int, layers: int, parts: frozenset, tp: int) -> float:
        """A token's feed-forward activations, averaged over the layers (see the module doc);
        ``parts``: what selective recompute rebuilds (`autotune.families.selective`)."""
        swiglu = 4 if "mlp_act" in parts else 8  # the dense and shared SwiGLUs
        if self.experts < 2:
            return swiglu * ffn / tp
        pad = self.capacity or 1.0
        act = 4 if "moe_act" in parts else 8  # the routed experts'
        outputs = 2 * hidden if self.weighted_combine else 0
        if self.fp8:  # the dispatched copy and the SwiGLU's cached inputs in FP8: 1 byte
            routed = pad * self.top_k * (hidden + outputs + act / 2 * self.expert_ffn)
        else:
            routed = pad * self.top_k * (2 * hidden + outputs + act * self.expert_ffn)
        moe = (8 * self.experts + routed + swiglu * self.shared_ffn) / tp
        share = self.moe_share(layers)
        return share * moe + (1 - share) * swiglu * ffn / tp

    # -- messages, elements per sample --------------------------------------------------------
    def dispatch_elements(self, seq: int, hidden: int) -> float:
        """One all-to-all of an MoE layer: the k copies of every token (× the capacity)."""
        return (self.capacity or 1.0) * self.top_k * seq * hidden

    def kv_elements(self, seq: int, heads: int) -> float:
        """One layer's keys and values (latent attention: materialised per head)."""
        return seq * heads * (self.qk_width + self.v_dim)
