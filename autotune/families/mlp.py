"""The ``mlp`` family: an input projection, residual blocks (norm → fc_in → GeLU → fc_out) and a
head; a sample is one row of ``hidden_size`` features. Its network is
`autotune.train.models.mlp.ResidualMLP`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.families.base import Family, dense, layer_norm
from autotune.families.workload import Workload, dimensions

TP_RULES = {
    "blocks.*.fc_in.*": "column",
    "blocks.*.fc_out.*": "row",
    "head.*": "column",
}


def shapes(cfg: dict) -> dict:
    """The MLP's parameters (see `autotune.families.base.Family.shapes`)."""
    h, ffn = cfg["hidden_size"], cfg["ffn_hidden_size"]
    out = dense("inp", h, h)
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}"
        out.update(layer_norm(f"{b}.norm", h))
        out.update(dense(f"{b}.fc_in", ffn, h))
        out.update(dense(f"{b}.fc_out", h, ffn))
    out.update(dense("head", cfg["vocab_size"], h))
    return out


@dataclass(frozen=True)
class MLP(Workload):
    """The ``mlp`` family: input projection, residual blocks (norm → fc_in → GeLU → fc_out), head.

    A sample is one row of ``hidden_size`` features; ``seq_length`` plays no part.
    """

    family: ClassVar[str] = "mlp"
    vocab_parallel_embedding: ClassVar[bool] = False  # the input projection is replicated

    @classmethod
    def of(cls, model, fused_attention: bool = False, sequence_parallel: bool = False):
        return cls(*dimensions(model))  # no attention to fuse

    @property
    def tokens(self) -> int:
        return 1

    def layer_flops(self) -> float:
        return 3 * 2 * (2 * self.hidden * self.ffn)

    def last_stage_flops(self) -> float:
        # The head, plus the input projection (tiny; counted here so the total is complete).
        return 6 * self.hidden * (self.vocab + self.hidden)

    def recompute_flops(self, mode: str) -> float:
        # No attention core: "selective" (the trainer recomputes each GeLU) prices as no
        # recompute, as recomputing only the GeLU was first measured to change nothing.
        # docs/mindspore-cpu.md "Activation recompute" (2026-11-29) measures −10…−19% peak
        # memory and +22…33% time for it on the 8-block MLP.
        return self.forward_layer_flops() if mode == "full" else 0.0

    def layer_activations(self, tp: int, mode: str, dtype_bytes: int, comm: bool = False) -> float:
        h, f = self.hidden, self.ffn
        if mode == "full":
            return h * dtype_bytes
        # norm input and output (h each), fc_in output and GeLU output (ffn each, TP-split).
        return (2 * h + 2 * f / tp) * dtype_bytes

    def tp_forward_allreduces(self) -> int:
        return 1  # after fc_out (its backward twin sits before fc_in)


FAMILY = Family("mlp", "residual MLP over feature rows", shapes, TP_RULES, MLP, token_input=False)
