"""The registry of built-in networks by family name, and what their networks share.

Contract: :data:`NETWORKS` maps a family name (`autotune.families`) to the builder of one rank's
network, ``(model section, placement) -> nn.Cell``; :func:`network` registers one (a test checks
that every family has a network whose parameters are its shapes, in order); :func:`build_network`
builds the network a rank of a built-in family runs.
"""

from collections import OrderedDict

from mindspore import nn

from autotune.families.layers import stage_layers
from autotune.train.parallel.groups import Placement

LN_EPS = 1e-5
SINGLE = Placement.of(0, 1, 1, 1)

# family name → the builder of one rank's network: (model section, placement) → nn.Cell. Each
# family's MindSpore-free side is its `autotune.families` entry; a test checks that every family
# there has a network here, with the parameters its shapes name.
NETWORKS: dict = {}


def network(family: str):
    """Register the decorated builder as the network of ``family``."""

    def add(builder):
        NETWORKS[family] = builder
        return builder

    return add


def build_network(model_cfg: dict, placement: Placement = SINGLE) -> nn.Cell:
    """The network one rank of a built-in family runs (float32 parameters, zeros until
    `autotune.train.models.weights.initialize` fills them)."""
    family = model_cfg["family"]
    if family not in NETWORKS:
        raise ValueError(
            f"model.family: unknown built-in family {family!r} (expected one of "
            f"{', '.join(NETWORKS)})"
        )
    return NETWORKS[family](model_cfg, placement)


def stage_blocks(num_layers, p: Placement, make) -> nn.SequentialCell:
    """The stage's blocks, named by their layer index in the whole model (``blocks.<i>.``)."""
    return nn.SequentialCell(
        OrderedDict((str(i), make()) for i in stage_layers(num_layers, p.pp, p.stage))
    )
