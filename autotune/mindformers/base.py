"""The base config's keys that autotune does not tune, in the merged mindformers.yaml.

Contract (docs/mindformers.md, "The export is the run that was tuned"):
- :func:`stage_lists` returns ``{dotted key: value}`` for every recompute setting of the base
  that is keyed by pipeline stage (``select_comm_recompute``, ``select_recompute_exclude``,
  ``select_comm_recompute_exclude``, each a list or a mapping of pattern → list), re-derived for
  the tuned ``pp`` with ``offset`` 0 (`autotune.spec.mindformers_layers`: MindFormers'
  ``LayerSetting``): the base's numbers mark layers under its own pp, interleave and offset, and
  the new list counts the marked layers in each chunk of the tuned layout (the base's interleave
  kept). A list whose shape does not match the base's own layout is a :class:`SpecError` naming
  the key: MindFormers would fail on it too (``_alloc_recompute_layer``'s IndexError). Where
  the overlay sets a key from the model.yaml (``model.recompute_layers``: the layers the study
  priced), the overlay's value is written.
- :func:`kept` lists the keys of the merged config that change the layout, memory or schedule,
  that autotune neither tunes nor sets, with their values: the header's "kept from the base,
  not tuned" block.
"""

from __future__ import annotations

from autotune.spec.mindformers_layers import chunks, marked_layers, per_stage

# Recompute settings keyed by stage that the base's lists re-derive (the overlay sets recompute
# and select_recompute, and select_comm_recompute where the model.yaml marks layers: those win).
STAGE_KEYED = ("select_comm_recompute", "select_recompute_exclude", "select_comm_recompute_exclude")
# Keys that change layout, memory or schedule and that the overlay does not set.
KEPT = (
    "parallel_config.use_seq_parallel",
    "parallel_config.gradient_aggregation_group",
    "parallel_config.seq_split_num",
    "model.model_config.fine_grain_interleave",
    "model.model_config.pp_interleave_num",
    "model.model_config.use_ring_attention",
    "model.model_config.use_attn_mask_compression",
    "recompute_config.select_comm_recompute",
    "recompute_config.select_recompute_exclude",
    "recompute_config.select_comm_recompute_exclude",
    "recompute_config.mp_comm_recompute",
    "recompute_config.parallel_optimizer_comm_recompute",
    "recompute_config.recompute_slice_activation",
    "swap_config",
    "parallel.pipeline_config",
    "parallel.parallel_optimizer_config",
    "context.memory_optimize_level",
)


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _rederive(value, old: list[list[int]], new: list[list[int]], key: str):
    if isinstance(value, dict):
        return {pattern: _rederive(v, old, new, f"{key}.{pattern}") for pattern, v in value.items()}
    if not isinstance(value, list) or not value or all(isinstance(v, str) for v in value):
        return value  # a boolean or a list of patterns: every layer alike
    return per_stage(marked_layers(value, old, key), new)


def stage_lists(base: dict, layers: int, pp: int) -> dict:
    """``{"recompute_config.<key>": value}`` re-derived for ``pp`` stages (see the module doc)."""
    mc = _get(base, "model.model_config") or {}
    interleave = mc.get("pp_interleave_num") or 1
    base_pp = _get(base, "parallel_config.pipeline_stage") or 1
    offset = mc.get("offset") or 0
    old = chunks(layers, base_pp, interleave, offset)
    new = chunks(layers, pp, interleave, 0)
    changed = {}
    for name in STAGE_KEYED:
        key = f"recompute_config.{name}"
        value = _get(base, key)
        if value is not None:
            derived = _rederive(value, old, new, key)
            if derived != value:
                changed[key] = derived
    return changed


def kept(merged: dict, overlay: dict) -> list[tuple[str, object]]:
    """``(key, value)`` of each :data:`KEPT` key the merged config has and the overlay sets not."""

    def default(value) -> bool:  # off, absent, or 1 (no interleave, no split)
        return value is None or value is False or type(value) is int and value == 1

    return [
        (key, _get(merged, key))
        for key in KEPT
        if not default(_get(merged, key)) and _get(overlay, key) is None
    ]
