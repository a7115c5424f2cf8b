"""The hard constraints a candidate must meet before any device time is spent on it.

Contract: :func:`violations` lists, as readable reasons, every constraint a candidate breaks
(empty: structurally valid). It needs the model's dimensions, the global batch and the
cluster's devices from the spec, and the candidate's knobs; nothing is run or estimated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.layout import builtin_layout_reasons
from autotune.spec.knobs import batch_split_problems
from autotune.spec.mindformers_layers import pipeline_interleave
from autotune.spec.programs import program_of

if TYPE_CHECKING:
    from autotune.spec.candidate import Candidate
    from autotune.spec.specs import Spec


def violations(spec: Spec, c: Candidate) -> list[str]:
    """The hard constraints (docs/model-yaml.md, "Search spaces") that ``c`` breaks, as readable reasons:
    dp·tp·pp = cluster.devices; tp divides num_heads, num_kv_heads (llama) and hidden_size; pp
    divides num_layers — pp · pp_interleave_num where a MindFormers base
    (``export.mindformers_base``) interleaves its pipeline, which MindFormers refuses otherwise
    (`autotune.spec.mindformers_layers.pipeline_interleave`); the global batch divides by dp·grad_accum (pp = 1) or by
    dp·micro_batches with micro_batches ≥ pp (pp > 1); and for a built-in family split by tp or
    pp, what its layout needs besides; and what the study's trial program refuses
    (`autotune.spec.programs.TrialProgram.refusals`: MindFormers on CPU, data parallel only)."""
    reasons = []
    m, batch = spec.model, spec.train.global_batch_size
    if c.devices != spec.cluster.devices:
        reasons.append(f"dp·tp·pp = {c.devices} ≠ cluster.devices = {spec.cluster.devices}")
    if c.tp > 1 and m.num_heads is not None and m.num_heads % c.tp:
        reasons.append(f"tp = {c.tp} does not divide num_heads = {m.num_heads}")
    if c.tp > 1 and m.num_kv_heads and m.num_kv_heads % c.tp:
        # a rank holds whole key/value heads; MindFormers' llama refuses it too
        reasons.append(f"tp = {c.tp} does not divide num_kv_heads = {m.num_kv_heads}")
    if c.tp > 1 and m.hidden_size is not None and m.hidden_size % c.tp:
        reasons.append(f"tp = {c.tp} does not divide hidden_size = {m.hidden_size}")
    # MindFormers splits the layers into pp · its base's interleave chunks, offset 0
    interleave = pipeline_interleave(spec.mindformers_base) if spec.mindformers_base else 1
    if c.pp * interleave > 1 and m.num_layers is not None and m.num_layers % (c.pp * interleave):
        reasons.append(
            f"pp = {c.pp} does not divide num_layers = {m.num_layers}"
            if interleave == 1
            else f"pp · pp_interleave_num = {c.pp} · {interleave} does not divide num_layers = "
            f"{m.num_layers} (MindFormers' LayerSetting, the base's pipeline interleave)"
        )
    reasons += [
        reason
        for _, reason in batch_split_problems(
            global_batch_size=batch,
            dp=c.dp,
            pp=c.pp,
            micro_batches=c.micro_batches,
            grad_accum=c.grad_accum,
        )
    ]
    if not reasons and m.family is not None and (c.tp > 1 or c.pp > 1):
        # the rest of what the layout needs: the vocabulary and the FFN width split too
        reasons += builtin_layout_reasons(m.as_config(), c.tp, c.pp)
    return reasons + program_of(spec).refusals(spec, c)
