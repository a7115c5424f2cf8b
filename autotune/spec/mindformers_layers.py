"""Which layers MindFormers' per-stage recompute lists mark: its ``LayerSetting`` rule, both ways.

MindFormers' ``LayerSetting`` (``mindformers/models/utils.py`` at 15218ea4; the same rule in
``mindformers/parallel_core/training_graph/transformer/utils.py`` at fd4deebc) splits a model's
layers into ``pp_interleave_num`` × ``pipeline_stage`` chunks of ``num_layers // (pp · interleave)
+ offset`` layers, in interleave-major order, and for a per-stage list ``[n₀, n₁, …]`` (True: a
whole stage; a 2-D list: one row per interleave) marks the first ``n`` layers of each chunk
(``_format_recompute_list``, ``_alloc_recompute_layer``: a stage's number is dealt one layer per
chunk in turn). A list longer or shorter than the stages fails there (IndexError), so it is a
:class:`SpecError` naming the key here.

Contract:

- :func:`chunks` is ``LayerSetting.layer_list``; :func:`marked_layers` the global indices of the
  layers a per-stage ``value`` marks under a layout; :func:`per_stage` the inverse for another
  layout (offset 0): how many marked layers each chunk holds — the list that, under that layout,
  marks as many layers in every chunk.
- :func:`layer_marks` reads one ``recompute_config`` key (a boolean, a per-stage list, a list of
  patterns or a mapping of pattern → either) into ``(True | layer indices | None, patterns)``:
  True for every layer, None for none, and the patterns it names (None: MindFormers' defaults).
- :func:`pipeline_interleave` is the interleave ``LayerSetting`` splits a config's layers with:
  its ``model.model_config.pp_interleave_num`` when ``parallel.pipeline_config.
  pipeline_interleave`` is on (MindFormers 1.9.0,
  ``parallel_core/training_graph/transformer/utils.py``: ``self.pp_interleave_num =
  pp_interleave_num if use_pp_interleave else 1``, ``use_pp_interleave`` MindSpore's
  ``pipeline_interleave`` context), else 1. ``LayerSetting._check_inputs`` then refuses a layout
  whose offsets do not sum to ``num_layers % (pp · interleave)``: with offset 0, one whose
  ``pp · interleave`` does not divide the layers (`autotune.spec.constraints`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from autotune.spec.errors import SpecError
from autotune.spec.mindformers_file import load_config

ALL = 2**31 - 1  # MindFormers' MAX_INT32: True in a per-stage list, every layer of the stage


def chunks(layers: int, pp: int, interleave: int, offset) -> list[list[int]]:
    """Layers per (interleave, stage) chunk, as ``LayerSetting.layer_list``."""
    if not isinstance(offset, list):
        rows = [[offset or 0] * pp] * interleave
    elif offset and isinstance(offset[0], list):
        rows = offset
    else:
        rows = [offset] * interleave
    if len(rows) != interleave or any(len(row) != pp for row in rows):
        raise SpecError(
            f"model.model_config.offset: {offset} does not match pipeline_stage {pp} "
            f"× pp_interleave_num {interleave}"
        )
    average = layers // (pp * interleave)
    return [[average + rows[i][j] for j in range(pp)] for i in range(interleave)]


def _counts(value, layout: list[list[int]], key: str) -> list[list[int]]:
    """Recomputed layers per chunk for a per-stage ``value`` (``_format_recompute_list``)."""
    interleave, pp = len(layout), len(layout[0])
    if all(isinstance(v, (int, bool)) for v in value):  # one number per stage
        if len(value) != pp:
            raise SpecError(
                f"{key}: {value} has {len(value)} entries for the config's pipeline_stage {pp}"
            )
        res = [[0] * pp for _ in range(interleave)]
        for j, n in enumerate(value):
            n = min(ALL if n is True else int(n), sum(layout[i][j] for i in range(interleave)))
            while n:  # _alloc_recompute_layer: one layer per chunk in turn
                for i in range(interleave):
                    if n and res[i][j] < layout[i][j]:
                        res[i][j] += 1
                        n -= 1
        return res
    if len(value) != interleave or any(
        not isinstance(row, list) or len(row) != pp for row in value
    ):
        raise SpecError(
            f"{key}: {value} does not match pipeline_stage {pp} × pp_interleave_num {interleave}"
        )
    return [
        [
            layout[i][j] if v is True else 0 if v is False else min(int(v), layout[i][j])
            for j, v in enumerate(row)
        ]
        for i, row in enumerate(value)
    ]


def marked_layers(value: list, layout: list[list[int]], key: str) -> list[int]:
    """Global indices of the layers a per-stage list ``value`` marks under ``layout``
    (:func:`chunks`), in order."""
    marked, start = [], 0
    for chunk_row, count_row in zip(layout, _counts(value, layout, key)):
        for size, count in zip(chunk_row, count_row):
            marked += range(start, start + count)
            start += size
    return marked


def per_stage(marked, layout: list[list[int]]):
    """Marked layers per chunk of ``layout``: a per-stage list (one row per interleave when
    there are several)."""
    marked, counts, start = set(marked), [], 0
    for row in layout:
        counts.append([])
        for size in row:
            counts[-1].append(sum(layer in marked for layer in range(start, start + size)))
            start += size
    return counts[0] if len(layout) == 1 else counts


def layer_marks(value, layout: list[list[int]], key: str):
    """``(marks, patterns)`` of one recompute key (see the module doc)."""
    if value is None or value is False or value == [] or value == {}:
        return None, None
    if value is True:
        return True, None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return True, list(value)  # patterns, every layer
    if isinstance(value, dict):
        union: set = set()
        for pattern, v in value.items():
            marks, _ = layer_marks(v, layout, f"{key}.{pattern}")
            if marks is True:
                return True, list(value)
            union |= set(marks or ())
        return sorted(union) or None, list(value)
    if isinstance(value, list):
        return marked_layers(value, layout, key) or None, None
    raise SpecError(
        f"{key}: {value!r}: expected a boolean, a per-stage list, patterns or a mapping of them"
    )


@cache
def pipeline_interleave(base: str) -> int:
    """The interleave ``LayerSetting`` runs the MindFormers config at path ``base`` with (see the
    module doc); 1 for a file that is not there (a stored study read elsewhere: nothing of it
    runs). Read once per path."""
    if not Path(base).is_file():
        return 1
    config = load_config(base)
    pipeline = (config.get("parallel") or {}).get("pipeline_config") or {}
    if not pipeline.get("pipeline_interleave"):
        return 1
    return ((config.get("model") or {}).get("model_config") or {}).get("pp_interleave_num") or 1
