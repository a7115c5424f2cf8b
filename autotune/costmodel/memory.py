"""Peak memory per device of one candidate, by part, in GiB.

Contract: :func:`memory_per_stage` returns, for every pipeline stage, the memory one device of
that stage needs; the estimate reports the largest. Parts (the breakdown keys): ``params``,
``grads``, ``accumulators``, ``optimizer_states``, ``activations``, ``overhead``.
:func:`rank_params` is the parameter count per stage, cached;
:func:`state_bytes` the bytes per parameter by part. ``engine`` (one of `autotune.spec.backends.ENGINES`) names
what executes the step: ``"trainer"``, autotune's trainer (every real trial); ``"mindspore"``,
MindSpore's own semi-auto parallel run of the export (what MindFormers runs; the ``simulate``
backend's trials stand for it): its pipeline, its gradient accumulation and its parallel
optimizer, below; or ``"megatron"``, Megatron-LM as the published runs that
``benchmarks/costmodel_validation.py`` prices used it.

Model (sources in the docstrings below and in ``workload.py``):

- Parameters per device: :func:`autotune.layout.rank_elements` of
  :func:`autotune.layout.builtin_layout` — the layout the trainer builds and the export writes
  (Megatron-style TP splits; the first stage holds the embeddings, the last the final norm and
  head). An ``entry`` model with transformer dimensions is laid out as the built-in transformer.
- Model states, as the trainer keeps them: parameters and their gradients in ``param_dtype``
  (``model.param_dtype``, MindFormers' ``param_init_type``; float32 unless given, whatever the
  compute dtype) and Adam's two moments in ``optimizer_dtype`` (float32 unless given, as
  MindFormers' ``FP32StateAdamWeightDecay`` keeps them): 4 + 4 + 8 = 16 bytes per local
  parameter in float32, 2 + 2 + 8 = 12 with float16 parameters. When a step has more than one
  micro-batch (``grad_accum`` > 1, or pp > 1 with ``micro_batches`` > 1) the trainer adds one
  accumulator per parameter, in ``param_dtype``.
  Megatron-LM in 16-bit mixed precision keeps what Rajbhandari et al. 2020 ("ZeRO", §3.1)
  count: 16-bit parameters and gradients (accumulated in place) and fp32 master weights,
  momentum and variance = 2 + 2 + 12 (the moments in ``optimizer_dtype``: DeepSeek-V3 keeps
  them in BF16, 2 + 2 + 8); its distributed optimizer (``--use-distributed-optimizer``, ZeRO-1;
  the ``parallel_optimizer`` knob) shards the master weights and moments of every parameter
  evenly over its data-parallel replicas (:func:`distributed_elements`), parameters and
  gradients whole — sharded too under Megatron-FSDP (``model.fsdp``: `autotune.costmodel.fsdp`).
  MindSpore's pipeline and gradient accumulation (``"mindspore"``: MindFormers'
  ``MFPipelineWithLossScaleCell`` clones every weight into ``accu_grads``, and MindSpore's
  micro-step operators add each micro-batch's gradient into them in the backward graph) keep the
  accumulators and no separate gradients.
- The parallel optimizer (knob ``parallel_optimizer``, dp > 1; which parameters are sharded and
  over how many ranks is :func:`autotune.layout.with_optimizer_shards`, MindFormers' llama
  leaving its norms and, by default, its token table whole), as the trainer runs it
  (`autotune.train.parallel.sharding`): Adam's moments only for the rows a device owns, plus a copy of
  those rows of each sharded parameter (what the optimizer updates before the rows are gathered
  back), in ``param_dtype``, counted under ``params`` (:func:`optimizer_elements`). Gradients
  and accumulators stay whole. MindSpore's own at its default level, ``level1``
  (``"mindspore"``; docs/parallel.md): a device keeps the owned rows of each sharded parameter
  and of its moments; the parameter is all-gathered for its forward use — in the compute dtype
  when the run casts it (``InsertAllGatherAfterCast``) — and the gathered copy lives until the
  backward has used it (MindFormers' ``parallel_optimizer_comm_recompute``, off by default,
  would gather it again), so at the peak a stage holds its sharded parameters whole once more;
  the gradients of the sharded rows are reduce-scattered (owned rows only) and accumulators
  stay whole (``gradient_accumulation_shard`` is ``level2``). Megatron runs are priced
  without it.
- Activations per layer and sample by recompute mode, layer by layer
  (:meth:`~autotune.costmodel.workload.Workload.stage_modes`): Korthikanti et al. 2022
  (``workload.py``). Under full recompute the layer being back-propagated is rebuilt whole, so
  one layer of un-recomputed activations comes on top (gradient buffers reuse the memory of
  freed activations). Against the 8 residual MLP blocks of docs/mindspore-cpu.md ("Activation
  recompute"; 64×256 rows) this predicts 1,973 → 981 MB: first measured 1,938 → 1,019 MB (−47%;
  model +2% / −4%), on 2026-11-29 2,139 → 1,104 MB (−48%; model −8% / −11%). Without pipelining
  one micro-batch is alive at a time.
- Pipelines, 1F1B (Narayanan et al. 2021 §2.2): stage i has up to ``pp − i`` micro-batches
  between their forward and their backward. What each of them keeps depends on the engine.
  The trainer (MindSpore compiles forward and backward as one graph, so a stage other than the
  last runs a forward-only graph to send its activation and later a forward+backward graph fed
  the received gradient) keeps only the stage's input per waiting micro-batch — the hidden
  state; the first stage's input is token ids, counted as nothing — and one micro-batch's full
  activations during a backward; its last stage runs each micro-batch's forward and backward
  back to back (one in flight). Megatron-LM's non-interleaved 1F1B and MindSpore's pipeline
  (``pipeline_scheduler`` 1f1b, one forward per micro-batch) keep every in-flight micro-batch's
  activations.
- Mixtures of experts (`autotune.families.moe`): a device holds its ``ep``-th of each MoE
  layer's experts (MindFormers' expert weights are split over ep only, never over tp) and their
  gradients and optimizer states, counted in ``params``, ``grads`` and ``optimizer_states`` with
  the rest; under the parallel optimizer they are sharded over the dp·tp / ep ranks that hold
  the same experts. Context parallelism (``cp``) splits every token-proportional activation, the
  s² scores included, over its ranks.
- Overhead: the device profile's runtime baseline, plus one AllReduce fusion buffer when data
  parallel (a bigger ``fusion_mb`` costs memory).
"""

from __future__ import annotations

import math
from functools import lru_cache

from autotune.costmodel import fsdp, schedules
from autotune.families.workload import Workload
from autotune.layout import (
    DTYPE_BYTES,
    builtin_layout,
    optimizer_whole,
    rank_elements,
    with_optimizer_shards,
)

GIB = 2**30
MIB = 2**20

STATE_PARTS = ("params", "grads", "accumulators", "optimizer_states")

# docs/mindspore-cpu.md, "Fusion buckets": with comm_fusion mode "size", a bucket closes once it
# holds more than a quarter of the configured threshold (graph_build IR of 2 msrun workers: full
# buckets 0.38 / 0.28 / 0.26 × the threshold at 1 / 4 / 16 MB, 128 KB gradients).
FUSION_FILL = 0.25


def state_bytes(
    engine: str,
    dtype: str,
    n_micro: int,
    param_dtype: str = "float32",
    optimizer_dtype: str = "float32",
) -> dict:
    """Bytes per local parameter of each model-state part (see the module doc)."""
    if engine == "megatron":  # float32 master weights beside the moments when 16-bit
        moments = 2 * DTYPE_BYTES[optimizer_dtype]
        half = dtype != "float32"
        return dict(zip(STATE_PARTS, (2, 2, 0, 4 + moments) if half else (4, 4, 0, moments)))
    param = DTYPE_BYTES[param_dtype]
    accumulates = n_micro > 1
    # MindSpore adds each micro-batch's gradient into its accumulators: no separate gradients
    grads = 0 if engine == "mindspore" and accumulates else param
    return dict(
        zip(
            STATE_PARTS,
            (param, grads, param if accumulates else 0, 2 * DTYPE_BYTES[optimizer_dtype]),
        )
    )


def gradient_bytes(engine: str, dtype: str, param_dtype: str = "float32") -> int:
    """Bytes per parameter the data-parallel reduction moves: the gradients' dtype."""
    return state_bytes(engine, dtype, 1, param_dtype)["grads"]


def gathered_bytes(dtype: str, param_dtype: str) -> int:
    """Bytes per element of a parameter MindSpore's parallel optimizer all-gathers: the compute
    dtype when a 16-bit run casts the parameter (the all-gather moves after the cast), else the
    parameter's own."""
    return DTYPE_BYTES[dtype] if dtype != "float32" else DTYPE_BYTES[param_dtype]


@lru_cache(maxsize=1024)
def rank_params(work: Workload, tp: int, pp: int, ep: int = 1) -> tuple[int, ...]:
    """Parameters one device of each stage holds (a mixture's experts split over ``ep``). The
    layout must be valid (the search space's constraints check it); cached per (model, tp, pp,
    ep): a simulated grid estimates thousands of candidates that share a handful of layouts,
    and laying out a model walks every parameter."""
    layouts, _ = builtin_layout(work.layout_config(), tp, pp, ep)
    return tuple(rank_elements(layouts, tp, stage, ep) for stage in range(pp))


@lru_cache(maxsize=1024)
def rank_expert_params(work: Workload, tp: int, pp: int, ep: int) -> tuple[int, ...]:
    """Of :func:`rank_params`: the routed experts' elements one device of each stage holds."""
    layouts, _ = builtin_layout(work.layout_config(), tp, pp, ep)
    return tuple(
        sum(
            math.prod(p.local_shape(tp, ep))
            for p in layouts.values()
            if p.ep_split and p.stage == s
        )
        for s in range(pp)
    )


def shards_optimizer(candidate, engine: str) -> bool:
    """Whether the parallel optimizer changes what ``engine`` runs for ``candidate``."""
    return engine != "megatron" and candidate.parallel_optimizer and candidate.dp > 1


def distributes_optimizer(candidate, engine: str) -> bool:
    """Whether Megatron's distributed optimizer (``--use-distributed-optimizer``, ZeRO-1: the
    parallel_optimizer knob under ``"megatron"``) shards ``candidate``'s optimizer states."""
    return engine == "megatron" and candidate.parallel_optimizer and candidate.dp > 1


@lru_cache(maxsize=1024)
def optimizer_elements(
    work: Workload, dp: int, tp: int, pp: int, param_bytes: int, ep: int = 1
) -> tuple:
    """Per stage, under the parallel optimizer: ``(owned, shard_rows, gathered_dp,
    gathered_stage)`` — the elements whose moments one device keeps, the elements of its shard
    copies, and the elements of its sharded parameters (tp slices) rebuilt after each update
    over the dp group (tp-split parameters) and over the stage's dp·tp ranks (replicated ones;
    the dp group too when tp = 1)."""
    model = work.layout_config()
    layouts, _ = builtin_layout(model, tp, pp, ep)
    layouts = with_optimizer_shards(
        layouts, dp, tp, param_bytes, whole=optimizer_whole(model), ep=ep
    )
    per_stage = []
    for stage in range(pp):
        owned = shard_rows = gathered_dp = gathered_stage = 0
        for p in layouts.values():
            if p.stage != stage:
                continue
            mine = math.prod(p.rank_shape(tp, ep))
            owned += mine
            if p.opt_shard is not None:
                shard_rows += mine
                whole = math.prod(p.local_shape(tp, ep))
                if p.shared_by_dp_group(tp) and not p.ep_split:
                    gathered_dp += whole
                else:
                    gathered_stage += whole
        per_stage.append((owned, shard_rows, gathered_dp, gathered_stage))
    return tuple(per_stage)


@lru_cache(maxsize=1024)
def distributed_elements(work: Workload, dp: int, tp: int, pp: int, ep: int = 1) -> tuple:
    """Per stage, the elements whose master weights and moments one device keeps under
    Megatron's distributed optimizer: each parameter's local slice split evenly over the ranks
    holding the same slice — the dp group, or for routed experts their dp·tp / ep
    expert-data-parallel ranks (over tp too when each expert is split over it). Megatron
    shards flat buffers "evenly across data parallel ranks" (Megatron-LM,
    docs/distrib_optimizer.md), so no parameter stays whole: no size threshold, no
    divisibility, no MindFormers exception."""
    layouts, _ = builtin_layout(work.layout_config(), tp, pp, ep)
    owned = [0.0] * pp
    for p in layouts.values():
        if p.ep_split:
            replicas = (dp * tp) // ep // (tp if p.split_dim is not None else 1)
        else:
            replicas = dp
        owned[p.stage] += math.prod(p.local_shape(tp, ep)) / replicas
    return tuple(owned)


def stage_activations(
    work: Workload,
    candidate,
    stage: int,
    micro_batch: int,
    n_micro: int,
    dtype: str,
    engine: str,
    in_flight: float | None = None,
) -> float:
    """Activation bytes one device of ``stage`` holds at its peak (see the module doc);
    ``micro_batch`` samples per micro-batch, ``n_micro`` micro-batches per step, ``in_flight``
    of them kept (None: 1F1B's)."""
    tp, pp = candidate.tp, candidate.pp
    nbytes = DTYPE_BYTES[dtype]
    modes = work.stage_modes(candidate.recompute, pp, stage)
    if in_flight is None:
        in_flight = max(1, min(pp - stage, n_micro))
    first, last = stage == 0, stage == pp - 1
    one = micro_batch * sum(
        layers * work.layer_activations(tp, mode, nbytes, comm) for (mode, comm), layers in modes
    )
    if first:  # the embedding's own activations, with the layers' of the same micro-batch
        one += micro_batch * work.first_stage_activations(tp, nbytes)
    # Under full recompute the layer being back-propagated is rebuilt whole for a moment.
    working = (
        micro_batch * work.layer_activations(tp, "none", nbytes)
        if any(mode == "full" for (mode, _), _ in modes)
        else 0.0
    )
    if last:
        working += micro_batch * work.last_stage_activations(tp, nbytes)
    if last or engine != "trainer":
        # Each in-flight micro-batch keeps its activations (the last stage has one in flight).
        kept = in_flight * one
    else:
        # The trainer's non-last stage: the waiting micro-batches keep their input (the
        # previous stage's hidden state), the one in its backward everything.
        waiting_input = 0.0 if first else micro_batch * work.hidden_state_bytes(nbytes)
        kept = (in_flight - 1) * waiting_input + one
    return (kept + working) / candidate.cp  # context parallelism splits every token's share


def memory_per_stage(
    work: Workload,
    candidate,
    micro_batch: int,
    n_micro: int,
    dtype: str,
    framework_gb: float,
    engine: str = "trainer",
    param_dtype: str = "float32",
    optimizer_dtype: str = "float32",
) -> list[dict]:
    """One breakdown dict (GiB by part) per pipeline stage — under DualPipe per rank, each
    holding two stages (`autotune.costmodel.schedules`)."""
    params_per_stage = rank_params(work, candidate.tp, candidate.pp, candidate.ep)
    dual = schedules.dualpipe(work, candidate, engine)
    interleave = schedules.chunks(work, candidate, engine)
    sharded_data = fsdp.applies(work, candidate, engine)  # parameters and gradients too
    per_param = state_bytes(engine, dtype, n_micro, param_dtype, optimizer_dtype)
    sharded = distributed = None
    if shards_optimizer(candidate, engine):
        sharded = optimizer_elements(
            work, candidate.dp, candidate.tp, candidate.pp, per_param["params"], candidate.ep
        )
    elif distributes_optimizer(candidate, engine) or sharded_data:  # ZeRO-1's states sharded
        distributed = distributed_elements(
            work, candidate.dp, candidate.tp, candidate.pp, candidate.ep
        )
    stages = []
    for stage, params in enumerate(params_per_stage):
        fusion = 0.0
        if candidate.dp > 1:
            fusion = min(
                candidate.fusion_mb * MIB * FUSION_FILL,
                params * gradient_bytes(engine, dtype, param_dtype),
            )
        parts = {part: params * nbytes / GIB for part, nbytes in per_param.items()}
        if distributed is not None:
            parts["optimizer_states"] = distributed[stage] * per_param["optimizer_states"] / GIB
        if sharded_data:
            layers = sum(n for _, n in work.stage_modes(candidate.recompute, candidate.pp, stage))
            parts = fsdp.stage_memory(parts, params, distributed[stage], layers)
        if sharded is not None:
            owned, shard_rows, on_dp, on_stage = sharded[stage]
            parts["optimizer_states"] = owned * per_param["optimizer_states"] / GIB
            if engine == "trainer":  # the shard copies the trainer's optimizer updates
                parts["params"] += shard_rows * per_param["params"] / GIB
            elif engine == "mindspore":  # the owned rows, and the gathered copy until backward
                unowned = on_dp + on_stage - shard_rows
                parts["params"] += (
                    (on_dp + on_stage) * gathered_bytes(dtype, param_dtype)
                    - unowned * per_param["params"]
                ) / GIB
                # reduce-scattered: the owned rows of the sharded gradients; the whole ones
                # are all-reduced into a buffer of their own
                whole_grads = params - (on_dp + on_stage)
                parts["grads"] = (shard_rows + whole_grads) * DTYPE_BYTES[param_dtype] / GIB
        kept = None  # 1F1B's
        if dual:
            kept = schedules.in_flight(candidate.pp)
        elif interleave > 1:
            kept = schedules.in_flight(candidate.pp, stage, interleave, n_micro)
        parts["activations"] = (
            stage_activations(work, candidate, stage, micro_batch, n_micro, dtype, engine, kept)
            / GIB
        )
        parts["overhead"] = framework_gb + fusion / GIB
        stages.append(parts)
    if dual:
        pp = candidate.pp
        return [schedules.rank_memory(stages[r], stages[pp - 1 - r]) for r in range(pp // 2)]
    return stages
