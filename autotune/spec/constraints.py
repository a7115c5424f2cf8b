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
    dp·tp·cp·pp = cluster.devices; ep and cp as MindFormers checks them (:func:`expert_reasons`,
    :func:`context_reasons`); tp divides num_heads, num_kv_heads (llama) and hidden_size; pp
    ≤ num_layers (uneven stages: `autotune.families.layers.stage_layers`) — and pp ·
    pp_interleave_num divides them where a MindFormers base (``export.mindformers_base``)
    interleaves its pipeline, which MindFormers refuses otherwise
    (`autotune.spec.mindformers_layers.pipeline_interleave`); the global batch divides by dp·grad_accum (pp = 1) or by
    dp·micro_batches with micro_batches ≥ pp (pp > 1); and for a built-in family split by tp or
    pp, what its layout needs besides; and what the study's trial program refuses
    (`autotune.spec.programs.TrialProgram.refusals`: MindFormers on CPU, data parallel only)."""
    reasons = []
    m, batch = spec.model, spec.train.global_batch_size
    if c.devices != spec.cluster.devices:
        product = "dp·tp·cp·pp" if c.cp > 1 else "dp·tp·pp"
        reasons.append(f"{product} = {c.devices} ≠ cluster.devices = {spec.cluster.devices}")
    reasons += expert_reasons(m, c) + context_reasons(m, c)
    if c.tp > 1 and m.num_heads is not None and m.num_heads % c.tp:
        reasons.append(f"tp = {c.tp} does not divide num_heads = {m.num_heads}")
    if c.tp > 1 and m.num_kv_heads and m.num_kv_heads % c.tp:
        # a rank holds whole key/value heads; MindFormers' llama refuses it too
        reasons.append(f"tp = {c.tp} does not divide num_kv_heads = {m.num_kv_heads}")
    if c.tp > 1 and m.hidden_size is not None and m.hidden_size % c.tp:
        reasons.append(f"tp = {c.tp} does not divide hidden_size = {m.hidden_size}")
    # MindFormers splits the layers into pp · its base's interleave chunks: unevenly only
    # without interleave (the export writes the offsets, `autotune.families.layers`)
    interleave = pipeline_interleave(spec.mindformers_base) if spec.mindformers_base else 1
    if m.num_layers is not None and c.pp > m.num_layers:
        reasons.append(f"pp = {c.pp} exceeds num_layers = {m.num_layers}")
    elif interleave > 1 and m.num_layers is not None and m.num_layers % (c.pp * interleave):
        reasons.append(
            f"pp · pp_interleave_num = {c.pp} · {interleave} does not divide num_layers = "
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
        reasons += builtin_layout_reasons(m.as_config(), c.tp, c.pp, c.ep)
    return reasons + program_of(spec).refusals(spec, c)


def expert_reasons(m, c: Candidate) -> list[str]:
    """What MindFormers refuses of ``c``'s expert parallelism for model section ``m``
    (mindformers 1.9, ``parallel_core/training_graph/transformer/moe``): ep > 1 on a model
    without experts (``TransformerConfig``: "num_moe_experts must be non None to use
    expert-parallel"), an ep that does not divide the experts (``BaseMoELayer``) or dp·tp
    (``FFNGroupedGEMM.shard``: the experts' device matrix is (dp·tp·cp / ep, ep)), and tensor
    parallelism in an MoE model without sequence parallelism (``MoELayer``: "performance may
    degrade if MoE and tensor parallelism are enabled without also enabling sequence
    parallelism", a ValueError)."""
    experts = m.num_experts or 0
    if c.ep > 1 and experts < 2:
        return [f"ep = {c.ep}: the model has no experts to split"]
    reasons = []
    if c.ep > 1 and experts % c.ep:
        reasons.append(f"ep = {c.ep} does not divide num_experts = {experts}")
    if c.ep > 1 and (c.dp * c.tp) % c.ep:
        reasons.append(
            f"ep = {c.ep} does not divide dp·tp = {c.dp * c.tp} (MindFormers carves the expert "
            "groups out of them)"
        )
    if experts > 1 and c.tp > 1 and not m.sequence_parallel:
        reasons.append(
            f"tp = {c.tp} in a model with experts needs model.sequence_parallel (MindFormers "
            "refuses MoE with tensor parallelism and no sequence parallelism)"
        )
    return reasons


def context_reasons(m, c: Candidate) -> list[str]:
    """What MindFormers refuses of ``c``'s context parallelism: cp > 1 without flash attention
    (``check_rules._check_parallel``, ``TransformerConfig``: "context_parallel is only available
    for flash attention"), and a sequence the cp ranks cannot split evenly."""
    if c.cp == 1:
        return []
    reasons = []
    if not m.flash_attention:
        reasons.append(f"cp = {c.cp} needs model.flash_attention (MindFormers' rule)")
    if m.seq_length is not None and m.seq_length % c.cp:
        reasons.append(f"cp = {c.cp} does not divide seq_length = {m.seq_length}")
    return reasons + ulysses_reasons(m, c)


def ulysses_reasons(m, c: Candidate) -> list[str]:
    """What MindFormers refuses of ``c``'s Ulysses group inside cp: a degree that does not
    divide cp (``TransformerOpParallelConfig._check_context_parallel``), and attention heads —
    queries and keys/values alike, as its legacy llama checks them — that tp·ulysses ranks
    cannot split evenly (``MultiHeadAttention``; mcore's ``ParallelAttention`` the same for the
    queries)."""
    if c.ulysses == 1 or c.cp == 1:
        return []
    reasons = []
    if c.cp % c.ulysses:
        reasons.append(f"ulysses = {c.ulysses} does not divide cp = {c.cp}")
    split = c.tp * c.ulysses
    for field in ("num_heads", "num_kv_heads"):
        heads = getattr(m, field) or (m.num_heads if field == "num_kv_heads" else None)
        if heads is not None and heads % split:
            reasons.append(
                f"tp·ulysses = {split} does not divide model.{field} = {heads} (MindFormers "
                "splits the heads over them)"
            )
    return reasons
