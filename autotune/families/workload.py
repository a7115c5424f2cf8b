"""What one sample costs in a model family: FLOPs, activations, messages — the cost model's side
of a family (`autotune.families`), without the cost model.

Contract: a family's :class:`Workload` subclass prices one sample; :meth:`Workload.of` builds it
from a spec's ``model`` section (`autotune.costmodel.workload.workload_for` chooses the family).
Every quantity is per *sample* and per layer unless its name says otherwise; FLOPs
count a multiply-add as 2 and are for the whole model (summed over tensor-parallel ranks);
activation bytes are what one tensor-parallel rank stores. Parameters are not counted here: the
memory model counts them from :mod:`autotune.layout`, the definition the trainer builds from
(:meth:`Workload.layout_config`).

A transformer sample is one sequence of ``seq_length`` tokens; an ``mlp`` sample is one row of
``hidden_size`` features (the built-in MLP maps (batch, hidden) → (batch, classes)), so
:attr:`Workload.tokens` is ``seq_length`` or 1. The formulas are the published ones, generalised
from ``ffn = 4h`` to any ``ffn_hidden_size``:

- FLOPs: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", appendix: 72·B·s·l·h²·(1 + s/6h + V/12lh) per step for forward+backward
  (i.e. per layer and sample 3·[s·(8h² + 4h·ffn) + 4s²h], plus 6·s·h·V for the logits).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", eq. 1–2: s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes per layer with 16-bit
  activations and tensor parallelism t (34·sbh + 5·as²b at t = 1); 24 = 8 (attention) + 16
  (MLP, 4·ffn/h with ffn = 4h). Selective recompute drops the 5·as²b/t attention-core term;
  full recompute keeps only the 2·sbh layer input.
- ``llama`` (MindFormers' legacy llama, `autotune.families.llama`): the same accounting for its layer —
  grouped-query Q/K/V (K and V of ``kv_heads`` heads), the output projection, a three-matrix
  SwiGLU, two RMSNorms, no dropout; its heads ``head_dim`` wide (q_dim = heads × head_dim,
  hidden without it; Qwen3's 8192 over 5120): GEMMs 2·(2h·q_dim + 2h·kv_dim + 3h·ffn) and QKᵀ,
  AV 4·s²·q_dim forward FLOPs per token. Per layer and sample, 16-bit activations kept for the
  backward: the two norm inputs and outputs (8·s·h), Q, K, V after the rotary embedding and the
  output projection's input ((4·q_dim + 4·kv_dim)·s/t), with ``qk_norm`` the q/k norms' inputs
  (2·(q_dim + kv_dim)·s/t), the SwiGLU's gate, up, SiLU and product (8·s·ffn/t), and the
  softmax output (2·a·s²/t). Its ``selective`` recompute is MindFormers'
  ``select_recompute`` (docs/mindformers.md, "Recompute"): the default patterns
  ``feed_forward.mul`` and ``feed_forward.w1.activation.silu`` — the SiLU output and the
  product are not kept (−4·s·ffn/t), recomputed from the kept gate and up at memory bandwidth —
  plus, when attention is not fused, the attention core (its 2·a·s²/t softmax output, and QKᵀ
  and AV again: 4·s²·h FLOPs), as ``LLamaAttention`` recomputes it.
- Sequence parallelism (``sequence_parallel``, llama, tp > 1: MindFormers' ``use_seq_parallel``;
  Korthikanti et al. 2022 §4.2.2): the norms and residual adds run on s/t tokens, so the two
  norm inputs are 4·s·h/t; each norm output is all-gathered into the next block's matmuls, whose
  backward keeps the gathered 2·s·h each (4·s·h) unless ``select_comm_recompute`` marks the
  layer — then the s/t shard is kept and the all-gather runs again in the backward (4·s·h/t).
  A fully recomputed layer keeps its s·h/t input. Each tensor-parallel all-reduce becomes a
  reduce-scatter and an all-gather (the timing model prices them).
- Fused attention (``fused_attention``: MindSpore's flash_attention_score, Ascend): the score
  tensors are never stored, so the s² term of the activations goes, and the kernel is causal
  (``next_tokens=0``, as MindFormers calls it): it computes the lower half of the s × s scores,
  so QKᵀ and AV cost 2·s²·h instead of 4·s²·h FLOPs per forward. (Its backward recomputes the
  scores inside the kernel; that is not priced.)
- Recompute by layer (``recompute_marks``: ``model.recompute_layers``): each layer's mode and
  whether its norms' all-gather is recomputed, from `autotune.families.layers.layer_recompute`;
  :meth:`Workload.stage_modes` counts them per pipeline stage.
- Tensor-parallel collectives (Megatron, Shoeybi et al. 2019, as the trainer runs them): per
  layer :meth:`Workload.tp_forward_allreduces` in forward and as many in backward; a
  vocab-parallel token embedding (transformer) all-reduces its output in forward; the
  vocab-parallel head all-reduces its input gradient in backward and the vocab-parallel
  cross-entropy runs 3 small all-reduces (the timing model prices those).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from autotune.families.layers import layer_recompute, stage_layers


def dimensions(model) -> tuple:
    """(layers, hidden, heads, ffn, seq, vocab) of a spec's ``model`` section (None where not
    given)."""
    return (
        model.num_layers,
        model.hidden_size,
        model.num_heads,
        model.ffn_hidden_size,
        model.seq_length,
        model.vocab_size,
    )


@dataclass(frozen=True)
class Workload(ABC):
    """Per-sample costs of one model. Subclasses implement the family's formulas."""

    family: ClassVar[str]  # the built-in family whose layout prices the parameters
    vocab_parallel_embedding: ClassVar[bool]  # input embedding split over the vocabulary (TP)

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    fused_attention: bool = False  # the s² scores never stored, the causal half computed
    sequence_parallel: bool = False  # llama under MindSpore with tp > 1 (see the module doc)
    # ((MindFormers recompute key, True or layer indices), ...): model.recompute_layers, frozen
    recompute_marks: tuple = ()
    embedding_parallel_optimizer: bool = False  # MindFormers' token table joins the sharding

    @classmethod
    def of(cls, model, fused_attention: bool = False, sequence_parallel: bool = False):
        """The workload of a spec's ``model`` section (its dimensions all given)."""
        return cls(*dimensions(model), fused_attention)

    def layout_config(self) -> dict:
        """The ``model`` section :func:`autotune.layout.builtin_layout` lays out."""
        return {
            "family": self.family,
            "num_layers": self.layers,
            "hidden_size": self.hidden,
            "num_heads": self.heads,
            "ffn_hidden_size": self.ffn,
            "seq_length": self.seq,
            "vocab_size": self.vocab,
            "embedding_parallel_optimizer": self.embedding_parallel_optimizer,
        }

    def stage_modes(self, knob: str, pp: int, stage: int) -> tuple:
        """``(((mode, comm), layers), ...)`` of a stage's layers under recompute ``knob``."""
        return _stage_modes(self.recompute_marks, self.layers, knob, pp, stage)

    def attention_flops(self) -> float:
        """Forward FLOPs of QKᵀ and AV per layer and sample: 4·s²·h, the causal half when
        fused (see the module doc)."""
        return (2 if self.fused_attention else 4) * self.seq * self.seq * self.hidden

    @property
    @abstractmethod
    def tokens(self) -> int:
        """Rows of the hidden state per sample (sequence positions; 1 for the MLP)."""

    # -- FLOPs (forward + backward, whole model, per sample) ----------------------------------
    @abstractmethod
    def layer_flops(self) -> float: ...

    def forward_layer_flops(self) -> float:
        return self.layer_flops() / 3  # backward = 2 × forward (Narayanan et al.)

    @abstractmethod
    def last_stage_flops(self) -> float:
        """FLOPs of the output head (the last stage runs them; never recomputed)."""

    @abstractmethod
    def recompute_flops(self, mode: str) -> float:
        """Extra forward FLOPs per layer that recompute ``mode`` repeats in the backward pass."""

    # -- activations (bytes one TP rank keeps, per sample) ------------------------------------
    @abstractmethod
    def layer_activations(self, tp: int, mode: str, dtype_bytes: int, comm: bool = False) -> float:
        """Bytes per layer kept from forward to backward under recompute ``mode`` (``comm``:
        its norms' all-gather recomputed, which acts under sequence parallelism only)."""

    def last_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        """Bytes of the output head's activations: Korthikanti et al.'s output-layer term
        4·s·b·h/t·(1 + V/h) at 16-bit (final norm output and fp32 logits for the loss)."""
        return 4 * self.tokens * self.hidden / tp * (1 + self.vocab / self.hidden) * dtype_bytes / 2

    def first_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        return 0.0

    # -- parts of the step a family's options add (none here) --------------------------------
    def part_flops(self) -> dict:
        """FLOPs per layer and sample (fwd+bwd, averaged over the layers) of the mechanisms
        the estimate prices as parts of their own (``experts``, ``mla``), included in
        :meth:`layer_flops`."""
        return {}

    def routed_flops(self) -> float:
        """Of ``part_flops()["experts"]``: the routed experts', whose slowest rank the others
        wait for (fwd+bwd per layer and sample, averaged)."""
        return 0.0

    capacity: ClassVar[float] = 0.0  # an MoE router's capacity factor (0: dropless)
    # MindFormers' legacy MoE (``model.experts_tensor_parallel``): its own dispatch
    # (`autotune.costmodel.moe_time`)
    legacy_experts: ClassVar[bool] = False
    # how the run computes and communicates (`autotune.families.moe`'s fields): FP8 linear
    # layers, expert all-to-alls overlapped with computation, the nodes a token's experts may
    # be on (0: any), a token's routed experts
    fp8_linear: ClassVar[bool] = False
    moe_comm_overlap: ClassVar[bool] = False
    node_limit: ClassVar[int] = 0
    top_k: ClassVar[int] = 0
    dualpipe: ClassVar[bool] = False  # ``model.pipeline_schedule: dualpipe``
    interleave: ClassVar[int] = 1  # ``model.pipeline_interleave``: chunks per stage
    fsdp: ClassVar[bool] = False  # ``model.fsdp``: Megatron-FSDP
    # autotune's trainer runs the experts: every local expert on every gathered token
    # (:meth:`executed_by`)
    gathered_experts: ClassVar[bool] = False

    def executed_by(self, engine: str) -> Workload:
        """This workload as ``engine`` (one of `autotune.spec.backends.ENGINES`) computes it:
        the same model, unless the engine runs a mechanism its own way."""
        return self

    def linear_flops(self) -> float:
        """Of :meth:`layer_flops`: the linear layers' GEMMs (projections, feed-forward,
        experts; not the attention core nor the router), what FP8 runs (fwd+bwd per layer
        and sample, averaged)."""
        return 0.0

    def router_flops(self) -> float:
        """Of ``part_flops()["experts"]``: the router's scores (kept in the compute dtype)."""
        return 0.0

    def mtp_flops(self, linear: bool = False) -> float:
        """FLOPs per sample (fwd+bwd) of the multi-token prediction modules (last stage);
        ``linear``: of those, the linear layers' GEMMs (what FP8 runs)."""
        return 0.0

    def stage_moe_layers(self, pp: int, stage: int) -> int:
        """The MoE layers of pipeline stage ``stage`` (each runs its all-to-alls)."""
        return 0

    def dispatch_bytes(self, dtype_bytes: int) -> float:
        """Bytes per sample of one expert-parallel dispatch (or combine) of an MoE layer."""
        return 0.0

    def kv_bytes(self, dtype_bytes: int) -> float:
        """Bytes per sample of one layer's keys and values (what context parallelism's ring
        passes on): 2·s·h."""
        return 2 * self.tokens * self.hidden * dtype_bytes

    def head_exchange_bytes(self, dtype_bytes: int) -> tuple[float, float]:
        """Bytes per sample of one layer's (queries, keys and values; attention output), what
        a Ulysses all-to-all moves: 3·s·h and s·h."""
        return 3 * self.tokens * self.hidden * dtype_bytes, self.tokens * self.hidden * dtype_bytes

    # -- communication ------------------------------------------------------------------------
    @abstractmethod
    def tp_forward_allreduces(self) -> int:
        """All-reduces per layer in one forward pass (as many run in its backward)."""

    def tp_allreduces(self, mode: str) -> int:
        """All-reduces per layer and micro-batch in forward + backward (+ recomputed forward)."""
        forward = self.tp_forward_allreduces()
        return 2 * forward + (forward if mode == "full" else 0)

    def hidden_state_bytes(self, dtype_bytes: int) -> float:
        """The hidden state of one sample in the compute dtype: the size of one TP all-reduce,
        of one pipeline message, and what a stage input kept for a later backward costs."""
        return self.tokens * self.hidden * dtype_bytes


@lru_cache(maxsize=4096)
def _stage_modes(marks: tuple, layers: int, knob: str, pp: int, stage: int) -> tuple:
    counts = Counter(
        layer_recompute(knob, layer, dict(marks)) for layer in stage_layers(layers, pp, stage)
    )
    return tuple(sorted(counts.items()))
