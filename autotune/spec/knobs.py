"""The one place that defines each tuning knob.

A :class:`Knob` states the knob's name (as stored in the study), its value type, what it means,
how MindSpore and MindFormers apply it, and whether the cost model can tell its values apart.
Everything else (search-space parsing, sampling, constraints, the trial program, export) reads
these definitions instead of repeating them. Which values a backend executes is the backend's
to say (`autotune.spec.backends`). So do the rules between knobs: which knobs act on a layout
(:func:`is_active`) and how the global batch splits over replicas and micro-batches
(:func:`micro_steps`, :func:`batch_split_problems`: the spec's constraints and the trial
program's config check apply the same one).
"""

from __future__ import annotations

from dataclasses import dataclass

JIT_LEVELS = ("O0", "O1", "O2", "pynative")
RECOMPUTE_MODES = ("none", "selective", "full")
DTYPES = ("float16", "bfloat16", "float32")
# Only float16 is loss-scaled: float32 and bfloat16 have float32's exponent range.
LOSS_SCALED_DTYPES = ("float16",)
# Steps without an overflow before the dynamic loss scaler doubles the scale: MindFormers'
# default scale_window for DynamicLossScaleUpdateCell, which the trial program and every export
# apply alike.
SCALE_WINDOW = 1000


@dataclass(frozen=True)
class Knob:
    """A tuning knob."""

    name: str
    kind: type
    meaning: str
    mindspore: str
    mindformers: str
    default: object = None
    # Whether the cost model's effect of the knob's values is known: where it is not, the
    # simulate backend fixes the knob (a "finding" there would be fixed in advance) and the
    # prior of sampler auto leaves it to the sampler. unestimated_because says why, in notes.
    estimable: bool = True
    unestimated_because: str = ""
    # A knob added after studies were first stored: a study that predates it ran at its default,
    # and neither its fingerprint nor its trials name it (`autotune.study.opening`,
    # `autotune.storage.schema.knobs_of`).
    added_later: bool = False
    # Which compiled graphs of a trial hold the knob's value (`autotune.train.compile_cache`
    # reuses a graph across the values of a knob it does not hold): "all"; "update", the
    # optimizer update's only (a forward and backward that accumulates, a pipeline stage's
    # cells are the same graph for every value); "none", no graph MindSpore caches (a
    # Parameter's value, or applied by MindSpore's backend after a cached graph loads).
    # docs/mindspore-cpu.md, "Compile cache", has the measurements.
    graphs: str = "all"


_NUMERICS = "the cost model cannot tell its values apart (they change numerics, not work)"

KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("dp", int, "data-parallel replicas (devices / (tp·pp) when 'auto')",
             "set_auto_parallel_context(parallel_mode=DATA_PARALLEL|SEMI_AUTO_PARALLEL, device_num)",
             "parallel_config.data_parallel", default=1),
        Knob("tp", int, "tensor parallel ways (Megatron-style: column/row-parallel layers, "
             "vocab-parallel embedding and head)",
             "explicit collectives in the tp group (trial program); operator shard strategies "
             "under SEMI_AUTO_PARALLEL",
             "parallel_config.model_parallel", default=1),
        Knob("pp", int, "pipeline stages",
             "layers split into stages, 1F1B over micro-batches (trial program); "
             "set_auto_parallel_context(pipeline_stages=pp)",
             "parallel_config.pipeline_stage", default=1),
        Knob("micro_batches", int, "pipeline micro-batches (used when pp > 1)",
             "1F1B micro-batches per step (trial program); nn.PipelineCell(net, micro_size=micro_batches)",
             "parallel_config.micro_batch_num", default=1),
        Knob("fusion_mb", int, "AllReduce fusion bucket threshold in MB",
             'set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": MB}})',
             "parallel.comm_fusion", default=64, graphs="none"),
        Knob("grad_accum", int, "gradient accumulation steps (used when pp == 1)",
             "accumulate grads/K over K micro-steps, one AllReduce and one update per step",
             "runner_config.gradient_accumulation_steps", default=1),
        Knob("loss_scale", int, "initial value of the dynamic loss scaler (power of two)",
             "DynamicLossScaleUpdateCell(loss_scale_value, scale_factor=2, scale_window)",
             "runner_wrapper.scale_sense.loss_scale_value", default=2**16, estimable=False,
             unestimated_because=_NUMERICS, graphs="none"),
        Knob("warmup_steps", int, "linear warmup steps before cosine decay",
             "LearningRateSchedule: linear warmup then cosine over train.total_steps",
             "lr_schedule.warmup_steps (CosineWithWarmUpLR)", default=0, estimable=False,
             unestimated_because=_NUMERICS, graphs="none"),
        Knob("jit_level", str, "graph compile level, or PyNative execution",
             "set_context(mode=GRAPH_MODE) and cell.set_jit_config(JitConfig(jit_level=L)), "
             "or set_context(mode=PYNATIVE_MODE)",
             "context.jit_config.jit_level", default="O1",
             estimable=False, unestimated_because="the cost model's jit-level factors on "
             "accelerators are guesses, not measurements (autotune/costmodel/profiles.py)"),
        Knob("recompute", str, "activation recomputation",
             "Cell.recompute() on each block (full); selective per family: llama — MindFormers' "
             "select_recompute patterns (the SwiGLU's SiLU and product; the attention core when "
             "not fused), transformer — the attention core, mlp — the GeLU; on the layers "
             "model.recompute_layers marks where it marks some",
             "recompute_config.recompute / select_recompute", default="none"),
        Knob("parallel_optimizer", bool,
             "shard the optimizer over the data-parallel group (MindSpore's parallel optimizer, "
             "level1: weights and optimizer states; acts with dp > 1)",
             "set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config="
             "{'parallel_optimizer_threshold': 64}); the trial program updates each rank's dim-0 "
             "shard of every parameter of 64 KB or more and gathers the shards back with explicit "
             "collectives (docs/parallel.md)",
             "parallel.enable_parallel_optimizer (+ parallel_optimizer_config)", default=False,
             added_later=True, graphs="update"),
    )
}

KNOB_NAMES = tuple(KNOBS)


def trial_warmup(warmup_steps: int, total_steps: int, trial_steps: int) -> int:
    """The warmup of a ``train.total_steps`` run's schedule compressed onto a ``trial_steps``
    trial, in trial steps (`autotune.train.schedule`): warmups that give the same number here
    train alike in a trial."""
    warmup = round(warmup_steps * trial_steps / total_steps) if total_steps > 0 else 0
    return min(warmup, trial_steps)


def is_active(name: str, dp: int, pp: int) -> bool:
    """Whether knob ``name`` acts on a candidate of data-parallel size ``dp`` and ``pp`` stages:
    micro_batches only with pipeline stages, grad_accum only without, fusion_mb and
    parallel_optimizer only with a data-parallel group (gradients to all-reduce, states to
    shard). A knob that does not act takes its default, so candidates that differ only in
    knobs that cannot act on them are one candidate, for every sampler."""
    if name == "micro_batches":
        return pp > 1
    if name == "grad_accum":
        return pp == 1
    if name in ("fusion_mb", "parallel_optimizer"):
        return dp > 1
    return True


def micro_steps(*, pp: int, micro_batches: int, grad_accum: int) -> int:
    """Micro-batches per optimizer step: ``micro_batches`` with pipeline stages, else
    ``grad_accum`` (whichever of the two acts: :func:`is_active`)."""
    return micro_batches if pp > 1 else grad_accum


def batch_split_problems(*, global_batch_size: int, dp: int, pp: int, micro_batches: int,
                         grad_accum: int) -> list[tuple[str, str]]:
    """Why a global batch of ``global_batch_size`` cannot be split into equal micro-batches over
    ``dp`` replicas and the :func:`micro_steps` of one optimizer step, as (field, reason) pairs
    (empty: it can): the batch divides by dp·grad_accum (pp = 1) or dp·micro_batches (pp > 1),
    and with pipeline stages micro_batches ≥ pp. The one rule the spec's constraints and the
    trial program's config check both apply."""
    problems = []
    if pp == 1 and global_batch_size % (dp * grad_accum):
        problems.append(("train.global_batch_size", f"global_batch_size = {global_batch_size} "
                         f"is not divisible by dp·grad_accum = {dp * grad_accum}"))
    if pp > 1 and global_batch_size % (dp * micro_batches):
        problems.append(("train.global_batch_size", f"global_batch_size = {global_batch_size} "
                         f"is not divisible by dp·micro_batches = {dp * micro_batches}"))
    if pp > 1 and micro_batches < pp:
        problems.append(("knobs.micro_batches", f"micro_batches = {micro_batches} < pp = {pp}"))
    return problems
