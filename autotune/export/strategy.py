"""MindSpore strategy files (``node_strategy_pb2.ParallelStrategyMap``) for a planned layout.

Contract:
- :func:`write_strategies` writes ``strategy.ckpt`` into a folder. With pp == 1 it is the one
  stage's map. With pp > 1 it first writes one map per stage to ``strategy_stages/stage<k>.ckpt``
  (parameter names as the network has them) and then ``strategy.ckpt`` with MindSpore's own
  ``merge_pipeline_strategys`` (names become ``"<stage>-<name>"``), so re-merging that folder
  reproduces the file. Returns the paths written.
- :func:`check_coverage` loads a written file back with ``build_searched_strategy`` and raises
  RuntimeError unless it holds exactly the expected parameters: MindSpore silently copies a
  parameter the file lacks whole to every rank, so a gap would otherwise go unnoticed.

Each layout item uses the device matrix ``[dp, tp]`` of its stage (see ``layout.py``) — a stacked
expert weight split over ``ep`` the experts' own, ``[dp·tp / ep, ep]`` with dim 0 on the ep axis
(tensor map ``[0, -1, -1]``: `autotune.layout.ep_coords`' rank order, MindFormers' ``layout_moe``) —
no field,
and the parallel optimizer's ``opt_weight_shard_step``/``opt_weight_shard_size`` where the
layout shards the parameter (``ParamLayout.opt_shard``). A stage map also needs at least one ``parallel_strategy_item``:
the merge reads the stage number from there. There is one item per parameter, keyed by the bare
parameter name, carrying its stage and per-dimension split. Semi-auto parallel looks operator
strategies up under ``<Primitive>_<first parameter name>`` (``MatMul_blocks.0.attn.qkv.weight``),
so these keys never override the ``shard()`` strategies the network sets itself (read from
MindSpore's source: semi-auto cannot run on CPU). The layouts are what checkpoint tools read.
"""

from __future__ import annotations

from pathlib import Path

from autotune.layout import ParamLayout

STRATEGY_FILE = "strategy.ckpt"
STAGES_DIR = "strategy_stages"


def _matrix(p: ParamLayout, dp: int, tp: int, ep: int) -> tuple[list, list, list]:
    """``(device matrix, tensor map, split per dimension)`` of one parameter."""
    if p.ep_split and ep > 1:
        if p.split_dim is not None:
            raise ValueError(f"{p.name}: experts split over tp and ep have no strategy here")
        rest = [-1] * (len(p.shape) - 1)
        return [dp * tp // ep, ep], [0, *rest], [ep] + [1] * len(rest)
    splits = [tp if i == p.split_dim else 1 for i in range(len(p.shape))]
    return [dp, tp], p.tensor_map(), splits


def _stage_map(layouts: list[ParamLayout], stage: int, dp: int, tp: int, ep: int = 1):
    from mindspore.train.node_strategy_pb2 import ParallelStrategyMap

    strategy_map = ParallelStrategyMap()
    strategy_map.current_stage = 1  # what MindSpore writes for a single save
    for p in layouts:
        matrix, tensor_map, splits = _matrix(p, dp, tp, ep)
        item = strategy_map.parallel_strategy_item.add()
        item.node_name = p.name
        item.parallel_strategys.stage = stage
        item.parallel_strategys.parallel_strategy.add().dim.extend(splits)
        layout_item = strategy_map.parallel_layout_item.add()
        layout_item.param_name = p.name
        parallel = layout_item.parallel_layouts
        parallel.dev_matrix.add().dim.extend(matrix)
        parallel.tensor_map.add().dim.extend(tensor_map)
        # MindSpore's reader indexes param_split_shape[0] unconditionally: keep an empty entry.
        parallel.param_split_shape.add()
        parallel.indices_offset.add()
        parallel.field = 0
        # the parallel optimizer's shard of the slice (what a sharded rank saves), as MindSpore
        # writes it: the ranks' stride and count; 0/0 when the slice is saved whole
        parallel.opt_weight_shard_step = p.opt_shard.step if p.opt_shard else 0
        parallel.opt_weight_shard_size = p.opt_shard.size if p.opt_shard else 0
    return strategy_map


def write_strategies(
    layouts: dict, dp: int, tp: int, pp: int, folder: Path, ep: int = 1
) -> list[Path]:
    by_stage = [[p for p in layouts.values() if p.stage == k] for k in range(pp)]
    merged = folder / STRATEGY_FILE
    if pp == 1:
        merged.write_bytes(_stage_map(by_stage[0], 0, dp, tp, ep).SerializeToString())
        return [merged]
    from mindspore.parallel import merge_pipeline_strategys

    stages_dir = folder / STAGES_DIR
    stages_dir.mkdir()
    written = []
    for k, stage_layouts in enumerate(by_stage):
        path = stages_dir / f"stage{k}.ckpt"
        path.write_bytes(_stage_map(stage_layouts, k, dp, tp, ep).SerializeToString())
        written.append(path)
    merge_pipeline_strategys(str(stages_dir), str(merged))
    return [merged, *written]


def strategy_names(layouts: dict, pp: int) -> set[str]:
    """The parameter keys a strategy file for ``layouts`` holds (merged naming when pp > 1)."""
    if pp == 1:
        return set(layouts)
    return {f"{p.stage}-{p.name}" for p in layouts.values()}


def check_coverage(path: Path, layouts: dict, pp: int) -> None:
    from mindspore.parallel import build_searched_strategy

    loaded = set(build_searched_strategy(str(path)))
    expected = strategy_names(layouts, pp)
    if loaded != expected:
        missing, extra = sorted(expected - loaded), sorted(loaded - expected)
        raise RuntimeError(
            f"{path} does not cover the model: missing {missing[:5]}, unexpected {extra[:5]}"
        )
