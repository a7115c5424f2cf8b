"""Where every parameter lives under a (dp, tp, pp) candidate: pipeline stage and TP split.

Contract:
- :func:`plan_layout` maps ``{name: shape}`` (in the network's parameter order) to
  ``{name: ParamLayout}`` and returns the reasons the candidate cannot be laid out (empty = valid).
  It never raises on a bad layout, so the caller can report every problem at once.
- Tensor parallelism follows *TP rules*: an ordered mapping of parameter-name globs (fnmatch, ``*``
  crosses dots) to ``column`` (split dim 0: column-parallel dense, vocab-parallel embedding and
  head), ``row`` (split dim 1 of a weight; a 1-D bias stays whole) or ``replicated``. The first
  matching glob wins; unmatched parameters are replicated. Built-in families have fixed rules
  (Megatron-style); an ``entry`` model uses the user's rules followed by :data:`MINDFORMERS_RULES`.
- Pipeline stages: a parameter whose name carries a layer index (``layers.N.``, ``blocks.N.``,
  ``layer.N.``, ``h.N.``) goes to stage ``N // (layers / pp)``; any other parameter goes to stage 0
  if it comes before the first layer in parameter order (embeddings), else to the last stage
  (final norm, head).
- Device mapping, as MindSpore's strategy files and ``transform_checkpoints`` define it: each
  stage's device matrix is ``[dp, tp]`` (row-major, so the tp index varies fastest) and
  ``rank = stage·(dp·tp) + dp_index·tp + tp_index`` (see :func:`rank_coords`).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from autotune.spec import TP_SPLITS as SPLIT_KINDS  # defined with model.tp_rules
from autotune.spec import SpecError

TRANSFORMER_RULES = {
    "embed.tok.*": "column",          # vocab-parallel token table; the position table stays whole
    "blocks.*.attn.qkv.*": "column",
    "blocks.*.attn.proj.*": "row",
    "blocks.*.mlp.fc_in.*": "column",
    "blocks.*.mlp.fc_out.*": "row",
    "head.*": "column",               # vocab-parallel logits
}
MLP_RULES = {
    "blocks.*.fc_in.*": "column",
    "blocks.*.fc_out.*": "row",
    "head.*": "column",
}
# MindFormers naming (llama and friends); a user's model.tp_rules come first and can override these.
MINDFORMERS_RULES = {
    "*attention.wq.*": "column",
    "*attention.wk.*": "column",
    "*attention.wv.*": "column",
    "*attention.w_qkv.*": "column",
    "*attention.wo.*": "row",
    "*feed_forward.w1.*": "column",
    "*feed_forward.w3.*": "column",
    "*feed_forward.w2.*": "row",
    "*tok_embeddings.*": "column",
    "*lm_head.*": "column",
}
BUILTIN_RULES = {"transformer": TRANSFORMER_RULES, "mlp": MLP_RULES}

_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|blocks|layer|h)\.(\d+)\.")


@dataclass(frozen=True)
class ParamLayout:
    """One parameter: full shape, pipeline stage, and the dimension split across tp (or None)."""

    name: str
    shape: tuple[int, ...]
    stage: int
    split_dim: int | None

    def tensor_map(self) -> list[int]:
        # Entries index the device matrix [dp, tp] from the right: 0 is the tp axis, -1 = whole.
        return [0 if i == self.split_dim else -1 for i in range(len(self.shape))]


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
    return None


def _stages(names: list[str], pp: int) -> tuple[dict, list[str]]:
    """Stage of every name, and the reasons stages cannot be assigned."""
    index = {n: int(m.group(1)) for n in names if (m := _LAYER_INDEX.search(n))}
    if pp == 1:
        return dict.fromkeys(names, 0), []
    if not index:
        return {}, [f"pp = {pp}: no parameter name carries a layer index "
                    "(layers.N. / blocks.N. / layer.N. / h.N.), so stages cannot be assigned"]
    layers = max(index.values()) + 1
    if layers % pp:
        return {}, [f"pp = {pp} does not divide the model's {layers} layers"]
    per_stage = layers // pp
    first_layer = next(i for i, n in enumerate(names) if n in index)
    stages = {}
    for position, name in enumerate(names):
        if name in index:
            stages[name] = index[name] // per_stage
        else:
            stages[name] = 0 if position < first_layer else pp - 1
    return stages, []


def plan_layout(shapes: dict, tp: int, pp: int, rules: dict) -> tuple[dict, list[str]]:
    """``({name: ParamLayout}, reasons)``; ``shapes`` must be in the network's parameter order."""
    names = list(shapes)
    reasons = [f"parameter name {n!r} contains '-', which MindSpore's merged pipeline strategy "
               "format reserves for '<stage>-<name>'" for n in names if "-" in n]
    stages, stage_reasons = _stages(names, pp)
    reasons += stage_reasons
    layouts = {}
    for name in names:
        shape = tuple(int(d) for d in shapes[name])
        split = _split_dim(split_kind(name, rules), len(shape)) if tp > 1 else None
        if split is not None and shape[split] % tp:
            reasons.append(f"tp = {tp} does not divide {name} dim {split} ({shape[split]})")
        layouts[name] = ParamLayout(name, shape, stages.get(name, 0), split)
    return layouts, reasons


def rank_coords(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """``(stage, dp_index, tp_index)`` of a global rank (MindSpore's pipeline rank order)."""
    stage, local = divmod(rank, dp * tp)
    return (stage, *divmod(local, tp))
