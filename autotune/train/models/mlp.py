"""The ``mlp`` family: a residual MLP, for one rank of a layout (the package doc).

Features (batch, hidden) → logits (batch, classes / tp). Input Dense h→h (first stage), residual
blocks (LayerNorm, Dense h→ffn, GELU, Dense ffn→h), head Dense h→classes (last stage).
Recompute: ``full`` every block, ``selective`` each GELU.
"""

from mindspore import nn, ops

from autotune.train.models.registry import LN_EPS, SINGLE, network, stage_blocks
from autotune.train.parallel.groups import Placement
from autotune.train.parallel.tp_layers import ColumnParallelDense, RowParallelDense


class ResidualBlock(nn.Cell):
    """x + fc_out(gelu(fc_in(norm(x)))), fc_in column- and fc_out row-parallel."""

    def __init__(self, hidden, ffn, p: Placement):
        super().__init__()
        self.norm = nn.LayerNorm((hidden,), epsilon=LN_EPS)
        self.fc_in = ColumnParallelDense(hidden, ffn, p.tp, p.tp_group)
        self.fc_out = RowParallelDense(ffn, hidden, p.tp, p.tp_group)
        self.gelu = ops.GeLU()

    def construct(self, x):
        return x + self.fc_out(self.gelu(self.fc_in(self.norm(x))))


class ResidualMLP(nn.Cell):
    """The ``mlp`` family (see the module doc)."""

    def __init__(self, num_layers, hidden_size, ffn_hidden_size, vocab_size, p: Placement = SINGLE):
        super().__init__()
        self.first, self.last = p.first, p.last
        if p.first:
            self.inp = ColumnParallelDense(
                hidden_size, hidden_size
            )  # replicated: whole on every rank
        self.blocks = stage_blocks(
            num_layers, p, lambda: ResidualBlock(hidden_size, ffn_hidden_size, p)
        )
        if p.last:
            self.head = ColumnParallelDense(hidden_size, vocab_size, p.tp, p.tp_group)

    def construct(self, x):
        if self.first:
            x = self.inp(x)
        x = self.blocks(x)
        if self.last:
            x = self.head(x)
        return x

    def apply_recompute(self, mode):
        """none | full (each block) | selective (each GELU: a primitive, so its own output is recomputed)."""
        for block in self.blocks.cells():
            if mode == "full":
                block.recompute()
            elif mode == "selective":
                block.gelu.recompute()


@network("mlp")
def _residual_mlp(model_cfg: dict, placement: Placement) -> nn.Cell:
    return ResidualMLP(
        model_cfg["num_layers"],
        model_cfg["hidden_size"],
        model_cfg["ffn_hidden_size"],
        model_cfg["vocab_size"],
        placement,
    )
