"""What one sample costs in a built-in model family: parameters, FLOPs, activations, traffic.

Contract: :func:`workload_for` turns a spec's ``model`` section into a :class:`Workload`, or
returns ``None`` when the section lacks the dimensions to price it (an ``entry`` model that gives
none). An ``entry`` model that gives the transformer dimensions is priced as the built-in
transformer. Every quantity is per *sample* (one sequence of ``seq_length`` tokens) and per layer
unless its name says otherwise; FLOPs count a multiply-add as 2 and are for the whole model
(summed over tensor-parallel ranks); activation bytes are what one tensor-parallel rank stores.

The parameter layout follows ``autotune/train/shapes.py`` (GPT-style blocks with biases, learned
positions, an untied output head; the MLP family's residual blocks). The formulas are the
published ones, generalised from ``ffn = 4h`` to any ``ffn_hidden_size``:

- FLOPs: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", appendix: 72·B·s·l·h²·(1 + s/6h + V/12lh) per step for forward+backward
  (i.e. per layer and sample 3·[s·(8h² + 4h·ffn) + 4s²h], plus 6·s·h·V for the logits).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", eq. 1–2: s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes per layer with 16-bit
  activations and tensor parallelism t (34·sbh + 5·as²b at t = 1); 24 = 8 (attention) + 16
  (MLP, 4·ffn/h with ffn = 4h). Selective recompute drops the 5·as²b/t attention-core term;
  full recompute keeps only the 2·sbh layer input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

# Bytes per element of the compute dtype (activations, TP/PP messages, 16-bit gradients).
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class Workload(ABC):
    """Per-sample costs of one model. Subclasses implement the family's formulas."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int

    # -- parameters: (split across TP ranks, replicated on every TP rank) --------------------
    @abstractmethod
    def layer_params(self) -> tuple[int, int]: ...

    @abstractmethod
    def first_stage_params(self) -> tuple[int, int]:
        """Parameters only the first pipeline stage holds (embeddings, input projection)."""

    @abstractmethod
    def last_stage_params(self) -> tuple[int, int]:
        """Parameters only the last pipeline stage holds (final norm, output head)."""

    def total_params(self) -> int:
        parts = [self.first_stage_params(), self.last_stage_params()]
        return self.layers * sum(self.layer_params()) + sum(sum(p) for p in parts)

    # -- FLOPs (forward + backward, whole model, per sample) ----------------------------------
    @abstractmethod
    def layer_flops(self) -> float: ...

    @abstractmethod
    def last_stage_flops(self) -> float:
        """FLOPs of the output head (the last stage runs them; never recomputed)."""

    @abstractmethod
    def recompute_flops(self, mode: str) -> float:
        """Extra forward FLOPs per layer that recompute ``mode`` repeats in the backward pass."""

    # -- activations (bytes one TP rank keeps, per sample) ------------------------------------
    @abstractmethod
    def layer_activations(self, tp: int, mode: str, dtype_bytes: int) -> float:
        """Bytes per layer kept from forward to backward under recompute ``mode``."""

    def last_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        """Bytes of the output head's activations: Korthikanti et al.'s output-layer term
        4·s·b·h/t·(1 + V/h) at 16-bit (final norm output and fp32 logits for the loss)."""
        return 4 * self.seq * self.hidden / tp * (1 + self.vocab / self.hidden) * dtype_bytes / 2

    def first_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        return 0.0

    # -- communication (bytes per sample) -----------------------------------------------------
    @abstractmethod
    def tp_allreduces(self, mode: str) -> int:
        """All-reduces per layer and micro-batch in forward + backward (+ recomputed forward)."""

    def tp_message_bytes(self, dtype_bytes: int) -> float:
        """Size of one TP all-reduce and of one pipeline send: the s×h hidden state."""
        return self.seq * self.hidden * dtype_bytes


@dataclass(frozen=True)
class Transformer(Workload):
    """GPT-style decoder block: LN → QKV → attention → proj → LN → fc_in → GeLU → fc_out."""

    def layer_params(self) -> tuple[int, int]:
        h, f = self.hidden, self.ffn
        # Megatron shards QKV/fc_in column-wise (weights and biases) and proj/fc_out row-wise
        # (weights only); their output biases and both layer norms stay whole on every rank.
        split = 3 * h * h + 3 * h + h * h + h * f + f + f * h
        whole = h + h + 2 * (2 * h)
        return split, whole

    def first_stage_params(self) -> tuple[int, int]:
        # Vocabulary-parallel token embedding; learned positions replicated.
        return self.vocab * self.hidden, self.seq * self.hidden

    def last_stage_params(self) -> tuple[int, int]:
        return self.vocab * self.hidden + self.vocab, 2 * self.hidden

    def _forward_layer_flops(self) -> float:
        s, h, f = self.seq, self.hidden, self.ffn
        # 2·(3h² + h² + 2h·ffn) per token for the four GEMMs, 4·s·h per token for QKᵀ and AV.
        return s * (8 * h * h + 4 * h * f) + 4 * s * s * h

    def layer_flops(self) -> float:
        return 3 * self._forward_layer_flops()  # backward = 2 × forward (Narayanan et al.)

    def last_stage_flops(self) -> float:
        return 6 * self.seq * self.hidden * self.vocab

    def recompute_flops(self, mode: str) -> float:
        if mode == "full":
            return self._forward_layer_flops()
        if mode == "selective":
            return 4 * self.seq * self.seq * self.hidden  # only QKᵀ and AV are redone
        return 0.0

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int) -> float:
        s, h, a = self.seq, self.hidden, self.heads
        scale = dtype_bytes / 2  # Korthikanti's counts assume 16-bit activations
        if mode == "full":
            return 2 * s * h * scale
        per_token = 10 + (8 + 4 * self.ffn / h) / tp  # = 10 + 24/t when ffn = 4h
        stored = s * h * per_token
        if mode == "none":
            stored += 5 * a * s * s / tp  # softmax input/output and dropout mask
        return stored * scale

    def first_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        return self.seq * self.hidden  # embedding dropout mask, 1 byte per element

    def tp_allreduces(self, mode: str) -> int:
        # Two per layer forward (after attention and after the MLP), two backward (Megatron);
        # a full recompute repeats the forward pair.
        return 6 if mode == "full" else 4


@dataclass(frozen=True)
class MLP(Workload):
    """The ``mlp`` family: input projection, residual blocks (norm → fc_in → GeLU → fc_out), head.

    A sample is ``seq_length`` rows of ``hidden_size`` features, so its cost is per row × seq.
    """

    def layer_params(self) -> tuple[int, int]:
        h, f = self.hidden, self.ffn
        # fc_in column-parallel, fc_out row-parallel; the norm and fc_out's bias stay whole.
        return h * f + f + f * h, 2 * h + h

    def first_stage_params(self) -> tuple[int, int]:
        return 0, self.hidden * self.hidden + self.hidden

    def last_stage_params(self) -> tuple[int, int]:
        return self.vocab * self.hidden + self.vocab, 0

    def layer_flops(self) -> float:
        return 3 * 2 * self.seq * (2 * self.hidden * self.ffn)

    def last_stage_flops(self) -> float:
        # The head, plus the input projection (tiny; counted here so the total is complete).
        return 6 * self.seq * self.hidden * (self.vocab + self.hidden)

    def recompute_flops(self, mode: str) -> float:
        # No attention core: "selective" has nothing to skip (MINDSPORE_CPU.md: recomputing
        # only the GeLU changed nothing), so it prices as no recompute.
        return 2 * self.seq * (2 * self.hidden * self.ffn) if mode == "full" else 0.0

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int) -> float:
        s, h, f = self.seq, self.hidden, self.ffn
        if mode == "full":
            return s * h * dtype_bytes
        # norm input and output (h each), fc_in output and GeLU output (ffn each, TP-split).
        return s * (2 * h + 2 * f / tp) * dtype_bytes

    def tp_allreduces(self, mode: str) -> int:
        return 3 if mode == "full" else 2  # one after fc_out forward, one backward (+ recompute)


def workload_for(model) -> Workload | None:
    """The :class:`Workload` of a spec's ``model`` section, or ``None`` if it has no dimensions."""
    dims = (model.num_layers, model.hidden_size, model.num_heads, model.ffn_hidden_size,
            model.seq_length, model.vocab_size)
    if any(d is None for d in dims):
        return None
    cls = MLP if model.family == "mlp" else Transformer
    return cls(*dims)
