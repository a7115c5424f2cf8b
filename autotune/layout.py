"""Where every parameter lives under a (dp, tp, pp[, ep]) layout: the one definition that the trainer's
parallel engine, the export's strategy files and the cost model's memory estimate all read.

Contract (pure Python, no MindSpore):
- :func:`plan_layout` maps ``{name: shape}`` (in the network's parameter order) to
  ``{name: ParamLayout}`` and returns the reasons the layout is impossible (empty = valid). It
  never raises on a bad layout, so the caller can report every problem at once.
  :func:`builtin_layout` does the same for a built-in family from its ``model`` section.
- Tensor parallelism follows *TP rules*: an ordered mapping of parameter-name globs (fnmatch, ``*``
  crosses dots) to ``column`` (split dim 0: column-parallel dense, vocab-parallel embedding and
  head), ``row`` (split dim 1 of a weight; a 1-D bias stays whole) or ``replicated``. The first
  matching glob wins; unmatched parameters are replicated. Built-in families have fixed rules
  (their `autotune.families` entry); an ``entry`` model uses the user's rules followed by
  MindFormers' (`autotune.families.llama.MINDFORMERS_RULES`).
  A split is always contiguous (all a strategy file can express): tp rank ``t`` holds block ``t``
  of ``tp`` equal blocks of the split dimension (:meth:`ParamLayout.local_slice`).
- Expert parallelism: a rule ``expert`` marks a mixture of experts' stacked expert weights
  ((experts, out, in), `autotune.families.moe`), split on dim 0 over ``ep`` ranks and never over
  tp (:attr:`ParamLayout.ep_split`), as MindFormers' mcore experts are (its ``layout_moe``:
  device matrix (dp·tp·cp / ep, ep), the weights ``("ep", None)``); ``ep`` must divide the
  experts. With ``model.experts_tensor_parallel`` each expert is also split over tp, gate and up
  by their rows, down by its columns (:data:`EXPERT_TP_RULES`), as MindFormers' legacy MoE
  shards them (``models/llama/llama_layer.py``: ``w1`` ``(ep, mp, 1)``, ``w2`` ``(ep, 1, mp)``).
- Pipeline stages: a parameter whose name carries a layer index (``layers.N.``, ``blocks.N.``,
  ``layer.N.``, ``h.N.``) goes to the stage that runs layer N (`autotune.families.layers.stage_layers`:
  as even as it can be, the first ``layers mod pp`` stages one layer more; under an interleaved
  pipeline, ``plan_layout``'s ``interleave``, the chunks MindFormers' ``LayerSetting`` deals
  round the stages: `autotune.families.layers.stage_of`); any other
  parameter goes to stage 0 if it comes before the first layer in parameter order (embeddings),
  else to the last stage (final norm, head) — so do MindFormers' mcore MTP modules
  (``mtp.layers.J.``, after the final norm), where its ``GPTModel`` puts them
  (``mtp.pipeline_stage = pipeline_stage - 1``).
- Ranks, as MindSpore's strategy files and ``transform_checkpoints`` define them: each stage's
  device matrix is ``[dp, tp]`` (row-major, so the tp index varies fastest) and
  ``rank = stage·(dp·tp) + dp_index·tp + tp_index`` (:func:`rank_coords`). So a tp group is
  ``tp`` adjacent ranks, a dp group strides by ``tp``, and pipeline neighbours are ``dp·tp`` apart.
- The trainer's checkpoints hold, per rank, its slice of every parameter of its stage and of the
  Adam moments of each (:data:`OPTIMIZER_STATES`, laid out like their parameter):
  :func:`with_optimizer_states` adds those, so a strategy file describes exactly what is saved.
- The parallel optimizer (MindSpore's at its default level, read from its source in
  docs/parallel.md): :func:`with_optimizer_shards` marks each parameter whose optimizer update is
  split further along dim 0 of its tp slice (:class:`OptimizerShard`) over every rank of the stage
  that holds the same slice — the dp group for a tp-split parameter, all dp·tp ranks of the stage
  for a replicated one — unless its full size is smaller than the threshold (64 KB by default;
  MindSpore's ``SplitParam`` skips ``size < threshold``), that dim 0 does not divide evenly, or
  the model creates it with ``parallel_optimizer=False`` (:func:`optimizer_whole`: MindFormers'
  llama norms, and its token table unless ``model.embedding_parallel_optimizer``). A sharded rank
  saves only its shard of the parameter and of its moments, as MindSpore's parallel optimizer
  does.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from autotune.families import family, parameter_shapes
from autotune.families.layers import stage_of

# Bytes per element of the dtypes a model's parameters, compute or optimizer states may take.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# MindSpore's (and MindFormers') default parallel_optimizer_threshold, in KB: parameters smaller
# than this are not sharded.
OPTIMIZER_SHARD_THRESHOLD_KB = 64
# Prefixes of the optimizer's per-parameter state (MindSpore's AdamWeightDecay: first and second
# moments, cloned from the parameters as "<prefix>.<parameter name>").
OPTIMIZER_STATES = ("adam_m", "adam_v")

# stacked experts split over tp as well (``model.experts_tensor_parallel``; see the module doc)
EXPERT_TP_RULES = {
    "*feed_forward.experts.w1.*": "expert_column",
    "*feed_forward.experts.w3.*": "expert_column",
    "*feed_forward.experts.w2.*": "expert_row",
}
# an MTP module's ``mtp.layers.J.`` (MindFormers' mcore) is not decoder layer J
_LAYER_INDEX = re.compile(r"(?:^|(?<!mtp)\.)(?:layers|blocks|layer|h)\.(\d+)\.")


@dataclass(frozen=True)
class OptimizerShard:
    """How the parallel optimizer splits a parameter's tp slice along dim 0: over ``size`` ranks
    that stride by ``step`` in the stage's rank order (MindSpore's ``opt_weight_shard_size`` and
    ``opt_weight_shard_step``: ``tp`` for a tp-split parameter, 1 for a replicated one)."""

    size: int
    step: int

    def index(self, dp_index: int, tp_index: int, tp: int) -> int:
        """Which of the ``size`` shards the rank at (dp_index, tp_index) holds: its position
        among the stage's ranks that stride by ``step`` (step tp: a dp group, its dp index;
        step ep: the ranks holding the same experts)."""
        return (dp_index * tp + tp_index) // self.step


@dataclass(frozen=True)
class ParamLayout:
    """One parameter: full shape, pipeline stage, the dimension split across tp (or None), and
    the parallel optimizer's shard of it (or None)."""

    name: str
    shape: tuple[int, ...]
    stage: int
    split_dim: int | None
    opt_shard: OptimizerShard | None = None
    ep_split: bool = False  # stacked experts: dim 0 split over the ep ranks

    def tensor_map(self) -> list[int]:
        # Entries index the device matrix [dp, tp] from the right: 0 is the tp axis, -1 = whole.
        return [0 if i == self.split_dim else -1 for i in range(len(self.shape))]

    def local_shape(self, tp: int, ep: int = 1) -> tuple[int, ...]:
        """The shape one rank holds: its tp block, and its ep block of stacked experts."""
        return tuple(
            d // tp if i == self.split_dim else d // ep if i == 0 and self.ep_split else d
            for i, d in enumerate(self.shape)
        )

    def local_slice(
        self, tp_index: int, tp: int, ep_index: int = 0, ep: int = 1
    ) -> tuple[slice, ...]:
        """The index of tp rank ``tp_index``'s block in the full tensor (and of ep rank
        ``ep_index``'s experts, for stacked experts)."""
        index = [slice(None)] * len(self.shape)
        if self.split_dim is not None:
            size = self.shape[self.split_dim] // tp
            index[self.split_dim] = slice(tp_index * size, (tp_index + 1) * size)
        if self.ep_split:
            size = self.shape[0] // ep
            index[0] = slice(ep_index * size, (ep_index + 1) * size)
        return tuple(index)

    def shard_rows(self, tp: int, dp_index: int, tp_index: int, ep: int = 1) -> slice:
        """The rows (dim 0 of this rank's tp or ep slice) whose update this rank owns; all of
        them without an optimizer shard."""
        rows = self.local_shape(tp, ep)[0] if self.shape else 1
        if self.opt_shard is None:
            return slice(0, rows)
        size = rows // self.opt_shard.size
        start = self.opt_shard.index(dp_index, tp_index, tp) * size
        return slice(start, start + size)

    def shared_by_dp_group(self, tp: int) -> bool:
        """Whether the ranks holding the same slice (those an optimizer shard is spread over)
        are the dp group — a tp-split parameter, or any with tp = 1 — rather than all dp·tp
        ranks of the stage."""
        return self.split_dim is not None or tp == 1

    def rank_shape(self, tp: int, ep: int = 1) -> tuple[int, ...]:
        """The shape this rank's optimizer updates and saves: its tp (or ep) slice, its
        optimizer shard of that slice when it has one."""
        local = self.local_shape(tp, ep)
        if self.opt_shard is None:
            return local
        return (local[0] // self.opt_shard.size, *local[1:])


def split_kind(name: str, rules: dict) -> str:
    for glob, kind in rules.items():
        if fnmatch.fnmatchcase(name, glob):
            return kind
    return "replicated"


def _split_dim(kind: str, ndim: int) -> int | None:
    if kind == "column" and ndim >= 1:
        return 0
    if kind == "row" and ndim >= 2:
        return 1
    if kind == "expert_column" and ndim >= 3:  # stacked (E, out, in): each expert's rows
        return 1
    if kind == "expert_row" and ndim >= 3:  # stacked (E, out, in): each expert's columns
        return 2
    return None


def _stages(names: list[str], pp: int, interleave: int = 1) -> tuple[dict, list[str]]:
    """Stage of every name, and the reasons stages cannot be assigned."""
    index = {n: int(m.group(1)) for n in names if (m := _LAYER_INDEX.search(n))}
    if pp == 1:
        return dict.fromkeys(names, 0), []
    if not index:
        return {}, [
            f"pp = {pp}: no parameter name carries a layer index "
            "(layers.N. / blocks.N. / layer.N. / h.N.), so stages cannot be assigned"
        ]
    layers = max(index.values()) + 1
    if layers < pp:
        return {}, [f"pp = {pp} exceeds the model's {layers} layers"]
    if interleave > 1 and layers % (pp * interleave):
        return {}, [
            f"pp · pp_interleave_num = {pp} · {interleave} does not divide the model's "
            f"{layers} layers (MindFormers' LayerSetting)"
        ]
    first_layer = next(i for i, n in enumerate(names) if n in index)
    stages = {}
    for position, name in enumerate(names):
        if name in index:
            stages[name] = stage_of(layers, pp, index[name], interleave)
        else:
            stages[name] = 0 if position < first_layer else pp - 1
    return stages, []


def plan_layout(
    shapes: dict, tp: int, pp: int, rules: dict, ep: int = 1, interleave: int = 1
) -> tuple[dict, list[str]]:
    """``({name: ParamLayout}, reasons)``; ``shapes`` must be in the network's parameter order;
    ``interleave``: the layers dealt to the stages in that many chunks each (MindFormers'
    interleaved pipeline: :func:`autotune.families.layers.stage_of`)."""
    names = list(shapes)
    reasons = [
        f"parameter name {n!r} contains '-', which MindSpore's merged pipeline strategy "
        "format reserves for '<stage>-<name>'"
        for n in names
        if "-" in n
    ]
    stages, stage_reasons = _stages(names, pp, interleave)
    reasons += stage_reasons
    layouts = {}
    for name in names:
        shape = tuple(int(d) for d in shapes[name])
        kind = split_kind(name, rules)
        experts = kind.startswith("expert") and len(shape) >= 1
        split = _split_dim(kind, len(shape)) if tp > 1 else None
        if split is not None and shape[split] % tp:
            reasons.append(f"tp = {tp} does not divide {name} dim {split} ({shape[split]})")
        if experts and shape[0] % ep:
            reasons.append(f"ep = {ep} does not divide {name}'s {shape[0]} experts")
        layouts[name] = ParamLayout(name, shape, stages.get(name, 0), split, ep_split=experts)
    return layouts, reasons


def builtin_layout(model_cfg: dict, tp: int, pp: int, ep: int = 1) -> tuple[dict, list[str]]:
    """:func:`plan_layout` of a built-in family (``model_cfg["family"]``), shapes and rules
    included. The trainer builds exactly these local shapes; a test checks it on real networks."""
    rules = family(model_cfg["family"]).tp_rules
    if model_cfg.get("experts_tensor_parallel"):  # each expert split over tp too
        rules = {**EXPERT_TP_RULES, **rules}
    return plan_layout(parameter_shapes(model_cfg), tp, pp, rules, ep)


@lru_cache(maxsize=256)
def _builtin_reasons(frozen_model: tuple, tp: int, pp: int, ep: int) -> tuple[str, ...]:
    return tuple(builtin_layout(dict(frozen_model), tp, pp, ep)[1])


def builtin_layout_reasons(model_cfg: dict, tp: int, pp: int, ep: int = 1) -> list[str]:
    """Why a built-in family cannot be laid out with (tp, pp, ep); cached (the search asks
    often)."""
    frozen = tuple(sorted((k, v) for k, v in model_cfg.items() if isinstance(v, (int, float, str))))
    return list(_builtin_reasons(frozen, tp, pp, ep))


def with_optimizer_states(layouts: dict, frozen: tuple[str, ...] = ()) -> dict:
    """``layouts`` plus the Adam moments of every parameter but those ``frozen`` globs match
    (not trained: the optimizer has no moments of them), each laid out like its parameter."""
    states = {
        f"{prefix}.{name}": replace(p, name=f"{prefix}.{name}")
        for prefix in OPTIMIZER_STATES
        for name, p in layouts.items()
        if not any(fnmatch.fnmatchcase(name, g) for g in frozen)
    }
    return {**layouts, **states}


def optimizer_shard(
    p: ParamLayout,
    dp: int,
    tp: int,
    element_bytes: int,
    threshold_kb: float = OPTIMIZER_SHARD_THRESHOLD_KB,
    ep: int = 1,
) -> OptimizerShard | None:
    """The parallel optimizer's shard of ``p`` (see the module doc), or None if it stays whole.
    Stacked experts split over ``ep`` are shared by the stage's dp·tp / ep ranks that hold the
    same experts (every ep-th rank: step ep), where ep divides dp·tp."""
    if p.ep_split:  # split over tp too: the dp / ep ranks of its tp index hold the same slice
        size, step = (dp * tp) // ep // (tp if p.split_dim is not None else 1), ep
    else:
        size, step = (dp, tp) if p.split_dim is not None else (dp * tp, 1)
    if dp == 1 or size <= 1 or not p.shape:
        return None
    if math.prod(p.shape) * element_bytes < threshold_kb * 1024:
        return None
    if p.local_shape(tp, ep)[0] % size:
        return None
    return OptimizerShard(size, step)


def optimizer_whole(model_cfg: dict) -> tuple[str, ...]:
    """Globs of the parameters ``model_cfg`` (a ``model`` section) creates with
    ``parallel_optimizer=False`` (its family's `autotune.families.base.Family.optimizer_whole`:
    MindFormers' llama norms, and its token table unless ``embedding_parallel_optimizer``); none
    for a user ``entry`` model."""
    name = model_cfg.get("family")
    return family(name).optimizer_whole(model_cfg) if name else ()


def with_optimizer_shards(
    layouts: dict,
    dp: int,
    tp: int,
    element_bytes: int,
    threshold_kb: float = OPTIMIZER_SHARD_THRESHOLD_KB,
    whole: tuple[str, ...] = (),
    ep: int = 1,
) -> dict:
    """``layouts`` with the parallel optimizer's shards marked (``element_bytes``: the
    parameters' dtype size, which the threshold is measured in; ``whole``: globs of parameters
    left whole, :func:`optimizer_whole`)."""
    return {
        name: replace(
            p,
            opt_shard=None
            if any(fnmatch.fnmatchcase(name, g) for g in whole)
            else optimizer_shard(p, dp, tp, element_bytes, threshold_kb, ep),
        )
        for name, p in layouts.items()
    }


def rank_elements(layouts: dict, tp: int, stage: int, ep: int = 1) -> int:
    """Elements of the parameters one rank of ``stage`` holds (the cost model's count)."""
    return sum(math.prod(p.local_shape(tp, ep)) for p in layouts.values() if p.stage == stage)


def rank_coords(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """``(stage, dp_index, tp_index)`` of a global rank (MindSpore's pipeline rank order)."""
    stage, local = divmod(rank, dp * tp)
    return (stage, *divmod(local, tp))


def rank_of(stage: int, dp_index: int, tp_index: int, dp: int, tp: int) -> int:
    return stage * dp * tp + dp_index * tp + tp_index


def tp_group(rank: int, dp: int, tp: int) -> list[int]:
    """The ranks that split tensors with ``rank`` (same stage and dp index)."""
    stage, d, _ = rank_coords(rank, dp, tp)
    return [rank_of(stage, d, t, dp, tp) for t in range(tp)]


def dp_group(rank: int, dp: int, tp: int) -> list[int]:
    """The ranks that hold the same slices as ``rank`` and average gradients with it."""
    stage, _, t = rank_coords(rank, dp, tp)
    return [rank_of(stage, d, t, dp, tp) for d in range(dp)]


def ep_coords(rank: int, dp: int, tp: int, ep: int) -> tuple[int, list[int], list[int]]:
    """``(ep_index, ep group, expert replicas)`` of a global rank: its stage's dp·tp ranks form
    the experts' device matrix (dp·tp / ep, ep), the ep axis fastest (MindFormers'
    ``layout_moe``), so an ep group is ``ep`` adjacent ranks of a stage, holding one block of
    the experts each, and the ranks that hold the same experts (``dp·tp / ep`` of them) stride by
    ``ep``."""
    stage, local = divmod(rank, dp * tp)
    base, index = stage * dp * tp, local % ep
    group = [base + local - index + e for e in range(ep)]
    replicas = [base + index + ep * k for k in range(dp * tp // ep)]
    return index, group, replicas


def pipeline_peers(rank: int, dp: int, tp: int, pp: int) -> tuple[int | None, int | None]:
    """``(previous stage's rank, next stage's rank)`` that ``rank`` exchanges activations with."""
    stage = rank_coords(rank, dp, tp)[0]
    step = dp * tp
    return (rank - step if stage > 0 else None, rank + step if stage < pp - 1 else None)
