"""Which layers a pipeline stage runs, and how each layer is recomputed.

Contract (pure Python): :func:`stage_layers` gives the global layer indices of a stage — the
split the trainer builds, the export writes and the cost model prices — and
:func:`layer_recompute` the recompute mode of one layer under the ``recompute`` knob and
``model.recompute_layers`` (MindFormers' per-layer lists, docs/mindformers.md).
"""

from __future__ import annotations

# MindFormers' per-layer recompute keys that model.recompute_layers carries (layer indices, or
# true for every layer): full recompute, its default selective patterns, the communication
# recompute of the norms (acts under sequence parallelism).
RECOMPUTE_LAYER_KEYS = ("recompute", "select_recompute", "select_comm_recompute")


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layer indices pipeline stage ``stage`` runs (pp must divide num_layers)."""
    per_stage = num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


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
