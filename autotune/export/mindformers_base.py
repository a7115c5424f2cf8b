"""The base config's keys that autotune does not tune, in the merged mindformers.yaml.

Contract (docs/mindformers.md, "The export is the run that was tuned"):
- :func:`stage_lists` returns ``{dotted key: value}`` for every recompute setting of the base
  that is keyed by pipeline stage and that the overlay does not set (``select_comm_recompute``,
  ``select_recompute_exclude``, ``select_comm_recompute_exclude``, each a list or a mapping of
  pattern → list), re-derived for the tuned ``pp`` with ``offset`` 0. MindFormers' ``LayerSetting``
  (``mindformers/parallel_core/training_graph/transformer/utils.py``) splits the layers into
  chunks (``pp_interleave_num`` × stages, ``num_layers // (pp · interleave) + offset`` each, in
  interleave-major order) and recomputes the first ``n`` layers of each chunk; the base's numbers
  mark those layers under its own pp, interleave and offset, and the new list counts the marked
  layers in each chunk of the tuned layout (the base's interleave kept). A list whose shape does
  not match the base's own layout is a :class:`SpecError` naming the key: MindFormers would fail
  on it too (``_alloc_recompute_layer``'s IndexError).
- :func:`kept` lists the keys of the merged config that change the layout, memory or schedule,
  that autotune neither tunes nor sets, with their values: the header's "kept from the base,
  not tuned" block.
"""

from __future__ import annotations

from autotune.spec.errors import SpecError

# Recompute settings keyed by stage that the overlay leaves to the base (it sets recompute and
# select_recompute, the tuned knob, as booleans).
STAGE_KEYED = ("select_comm_recompute", "select_recompute_exclude", "select_comm_recompute_exclude")
# Keys that change layout, memory or schedule and that the overlay does not set.
KEPT = ("parallel_config.use_seq_parallel", "parallel_config.gradient_aggregation_group",
        "parallel_config.seq_split_num", "model.model_config.fine_grain_interleave",
        "model.model_config.pp_interleave_num", "model.model_config.use_ring_attention",
        "model.model_config.use_attn_mask_compression", "recompute_config.select_comm_recompute",
        "recompute_config.select_recompute_exclude", "recompute_config.select_comm_recompute_exclude",
        "recompute_config.mp_comm_recompute", "recompute_config.parallel_optimizer_comm_recompute",
        "recompute_config.recompute_slice_activation", "swap_config", "parallel.pipeline_config",
        "parallel.parallel_optimizer_config", "context.memory_optimize_level")
_ALL = 2 ** 31 - 1  # MindFormers' MAX_INT32: True in a per-stage list, every layer of the stage


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _chunks(layers: int, pp: int, interleave: int, offset) -> list[list[int]]:
    """Layers per (interleave, stage) chunk, as ``LayerSetting.layer_list``."""
    if not isinstance(offset, list):
        rows = [[offset or 0] * pp] * interleave
    elif offset and isinstance(offset[0], list):
        rows = offset
    else:
        rows = [offset] * interleave
    if len(rows) != interleave or any(len(row) != pp for row in rows):
        raise SpecError(f"model.model_config.offset: {offset} does not match pipeline_stage {pp} "
                        f"× pp_interleave_num {interleave}")
    average = layers // (pp * interleave)
    return [[average + rows[i][j] for j in range(pp)] for i in range(interleave)]


def _counts(value, chunks: list[list[int]], key: str) -> list[list[int]]:
    """Recomputed layers per chunk for a per-stage ``value`` (``_format_recompute_list``)."""
    interleave, pp = len(chunks), len(chunks[0])
    if all(isinstance(v, (int, bool)) for v in value):  # one number per stage
        if len(value) != pp:
            raise SpecError(f"{key}: {value} has {len(value)} entries for the base's "
                            f"pipeline_stage {pp}")
        res = [[0] * pp for _ in range(interleave)]
        for j, n in enumerate(value):
            n = min(_ALL if n is True else int(n), sum(chunks[i][j] for i in range(interleave)))
            while n:  # _alloc_recompute_layer: one layer per chunk in turn
                for i in range(interleave):
                    if n and res[i][j] < chunks[i][j]:
                        res[i][j] += 1
                        n -= 1
        return res
    if len(value) != interleave or any(not isinstance(row, list) or len(row) != pp for row in value):
        raise SpecError(f"{key}: {value} does not match pipeline_stage {pp} × "
                        f"pp_interleave_num {interleave}")
    return [[chunks[i][j] if v is True else 0 if v is False else min(int(v), chunks[i][j])
             for j, v in enumerate(row)] for i, row in enumerate(value)]


def _rederive(value, old: list[list[int]], new: list[list[int]], key: str):
    if isinstance(value, dict):
        return {pattern: _rederive(v, old, new, f"{key}.{pattern}") for pattern, v in value.items()}
    if not isinstance(value, list) or not value or all(isinstance(v, str) for v in value):
        return value  # a boolean or a list of patterns: every layer alike
    marked = []  # per layer, in order: recomputed under the base's layout
    for chunk_row, count_row in zip(old, _counts(value, old, key)):
        for size, count in zip(chunk_row, count_row):
            marked += [True] * count + [False] * (size - count)
    counts, start = [], 0
    for row in new:
        counts.append([])
        for size in row:
            counts[-1].append(sum(marked[start:start + size]))
            start += size
    return counts[0] if len(new) == 1 else counts


def stage_lists(base: dict, layers: int, pp: int) -> dict:
    """``{"recompute_config.<key>": value}`` re-derived for ``pp`` stages (see the module doc)."""
    mc = _get(base, "model.model_config") or {}
    interleave = mc.get("pp_interleave_num") or 1
    base_pp = _get(base, "parallel_config.pipeline_stage") or 1
    offset = mc.get("offset") or 0
    old = _chunks(layers, base_pp, interleave, offset)
    new = _chunks(layers, pp, interleave, 0)
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

    return [(key, _get(merged, key)) for key in KEPT
            if not default(_get(merged, key)) and _get(overlay, key) is None]
