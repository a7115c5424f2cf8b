"""Which layers a pipeline stage runs, and how each layer is recomputed.

Contract (pure Python): :func:`stage_layers` gives the global layer indices of a stage — the
split the trainer builds, the export writes and the cost model prices: as even as it can be,
the first ``num_layers mod pp`` stages one layer more (DeepSeek-V3's 61 layers on 16 stages:
13 of 4, 3 of 3; MindFormers writes it as ``model_config.offset``, :func:`stage_offsets`) — and
:func:`layer_recompute` the recompute mode of one layer under the ``recompute`` knob and
``model.recompute_layers`` (MindFormers' per-layer lists, docs/mindformers.md).
"""

from __future__ import annotations

# MindFormers' per-layer recompute keys that model.recompute_layers carries (layer indices, or
# true for every layer): full recompute, its default selective patterns, the communication
# recompute of the norms (acts under sequence parallelism).
RECOMPUTE_LAYER_KEYS = ("recompute", "select_recompute", "select_comm_recompute")


def stage_sizes(num_layers: int, pp: int) -> list[int]:
    """Layers per stage: ``num_layers // pp``, one more on the first ``num_layers mod pp``."""
    base, extra = divmod(num_layers, pp)
    return [base + (stage < extra) for stage in range(pp)]


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layer indices pipeline stage ``stage`` runs (pp ≤ num_layers)."""
    sizes = stage_sizes(num_layers, pp)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def stage_offsets(num_layers: int, pp: int) -> int | list[int]:
    """MindFormers' ``model_config.offset`` for that split (``LayerSetting``: stage i runs
    ``num_layers // pp + offset[i]`` layers): 0 when pp divides the layers, else one per stage."""
    sizes = stage_sizes(num_layers, pp)
    return 0 if len(set(sizes)) == 1 else [size - num_layers // pp for size in sizes]


def stage_of(num_layers: int, pp: int, layer: int, interleave: int = 1) -> int:
    """The stage that runs global layer ``layer``; with ``interleave`` > 1 chunks per stage
    (MindFormers' ``pp_interleave_num``, pp · interleave dividing the layers) as MindFormers'
    ``LayerSetting`` deals them: ``pp · interleave`` chunks of equal size in order, chunk j on
    stage j mod pp (its ``pp_ids``)."""
    if interleave > 1:
        return layer // (num_layers // (pp * interleave)) % pp
    base, extra = divmod(num_layers, pp)
    wide = extra * (base + 1)  # the first stages' layers, one more each
    return layer // (base + 1) if layer < wide else extra + (layer - wide) // base


def layer_recompute(knob: str, layer: int, marks: dict) -> tuple[str, bool]:
    """``(mode, comm)`` of layer ``layer`` (global index): the recompute knob's mode
    (``none``, ``selective``, ``full``) refined by ``marks`` — ``model.recompute_layers``,
    {MindFormers key: layer indices or True} — and whether its norms' communication is recomputed.

    MindFormers' ``LayerSetting.set``: a layer its ``recompute`` list marks is recomputed whole,
    any other one gets the selective patterns where ``select_recompute`` marks it; the knob says
    which of them the run has (``full``: both lists, ``selective``: the second, ``none``: neither),
    and a list the marks leave out means every layer. ``select_comm_recompute`` is the base
    config's, kept whatever the knob."""

    def marked(key: str, default: bool) -> bool:
        value = marks.get(key)
        return default if value is None else value is True or layer in value

    comm = marked("select_comm_recompute", False)
    if knob == "full" and marked("recompute", True):
        return "full", comm
    if knob in ("full", "selective") and marked("select_recompute", knob == "selective"):
        return "selective", comm
    return "none", comm
