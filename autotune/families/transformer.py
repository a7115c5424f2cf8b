"""The ``transformer`` family: a GPT-style decoder (learned positions, LayerNorm, GeLU MLP, an
untied vocab-parallel head), split Megatron-style.

Its network is `autotune.train.models.transformer.GPT`; the fused QKV weight is stored head-major — rows
(heads, [q, k, v], head_dim) — so that the contiguous dim-0 split gives each tp rank whole heads
with their own Q, K and V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.families.base import Family, dense, layer_norm
from autotune.families.workload import Workload

TP_RULES = {
    "embed.tok.*": "column",  # vocab-parallel token table; the position table stays whole
    "blocks.*.attn.qkv.*": "column",
    "blocks.*.attn.proj.*": "row",
    "blocks.*.mlp.fc_in.*": "column",
    "blocks.*.mlp.fc_out.*": "row",
    "head.*": "column",  # vocab-parallel logits
}


def shapes(cfg: dict) -> dict:
    """The decoder's parameters (see `autotune.families.base.Family.shapes`)."""
    h, ffn, vocab = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"]
    out = {
        "embed.tok.embedding_table": (vocab, h),
        "embed.pos.embedding_table": (cfg["seq_length"], h),
    }
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}"
        out.update(layer_norm(f"{b}.ln1", h))
        out.update(dense(f"{b}.attn.qkv", 3 * h, h))
        out.update(dense(f"{b}.attn.proj", h, h))
        out.update(layer_norm(f"{b}.ln2", h))
        out.update(dense(f"{b}.mlp.fc_in", ffn, h))
        out.update(dense(f"{b}.mlp.fc_out", h, ffn))
    out.update(layer_norm("ln_f", h))
    out.update(dense("head", vocab, h))
    return out


@dataclass(frozen=True)
class Transformer(Workload):
    """GPT-style decoder block: LN → QKV → attention → proj → LN → fc_in → GeLU → fc_out."""

    family: ClassVar[str] = "transformer"
    vocab_parallel_embedding: ClassVar[bool] = True

    @property
    def tokens(self) -> int:
        return self.seq

    def layer_flops(self) -> float:
        s, h, f = self.seq, self.hidden, self.ffn
        # 2·(3h² + h² + 2h·ffn) per token for the four GEMMs, QKᵀ and AV; backward = 2 × forward.
        return 3 * (s * (8 * h * h + 4 * h * f) + self.attention_flops())

    def last_stage_flops(self) -> float:
        return 6 * self.seq * self.hidden * self.vocab

    def recompute_flops(self, mode: str) -> float:
        if mode == "full":
            return self.forward_layer_flops()
        if mode == "selective":
            return self.attention_flops()  # only QKᵀ and AV are redone
        return 0.0

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int, comm: bool = False) -> float:
        s, h, a = self.seq, self.hidden, self.heads
        scale = dtype_bytes / 2  # Korthikanti's counts assume 16-bit activations
        if mode == "full":
            return 2 * s * h * scale
        per_token = 10 + (8 + 4 * self.ffn / h) / tp  # = 10 + 24/t when ffn = 4h
        stored = s * h * per_token
        if mode == "none" and not self.fused_attention:
            stored += 5 * a * s * s / tp  # softmax input/output and dropout mask
        return stored * scale

    def first_stage_activations(self, tp: int, dtype_bytes: int) -> float:
        return self.seq * self.hidden  # embedding dropout mask, 1 byte per element

    def tp_forward_allreduces(self) -> int:
        return 2  # after attention and after the MLP (Megatron)


FAMILY = Family("transformer", "GPT-style decoder", shapes, TP_RULES, Transformer)
