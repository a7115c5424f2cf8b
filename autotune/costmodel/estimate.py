"""The cost model's verdict on one candidate: :func:`estimate`, :class:`Estimate`, and
:func:`format_estimate` for people.

Contract:

- ``estimate(spec, candidate, calibration=None, engine=None, refuse=True) -> Estimate`` never
  runs anything. It is infeasible (``feasible=False``, ``reason`` says why) when the candidate
  breaks a hard constraint (:func:`autotune.spec.constraints.violations`, the layout's included;
  numbers NaN; ``refuse=False`` prices it anyway: a published run of a release that accepted
  what today's MindFormers refuses, as ``benchmarks/moe_validation.py`` prices one),
  asks for ``O2`` on a device that is not Ascend, or needs more than ``device memory ×
  SAFETY_MARGIN`` per device — or than ``cluster.max_device_memory_gb`` where given (MindSpore's
  ``max_device_memory``, a cap already: no margin on top) — (the reason carries the predicted
  memory). A model without
  dimensions (an ``entry`` that gives none) is ``feasible=True`` with reason ``"no dimensions
  given: not estimated"`` and NaN numbers: nothing is known against it, so the real trial
  decides. Bad ``cluster.device`` input raises :class:`~autotune.spec.errors.SpecError`.
- ``engine`` says what executes the step: ``"trainer"`` is autotune's trainer
  (parameters, gradients and accumulators in ``model.param_dtype``, Adam's moments in
  ``model.optimizer_dtype``; pipeline stages that run each forward twice; the parallel
  optimizer as `autotune.train.parallel.sharding` runs it), the engine of its own trial
  program (``trial.program: autotune``);
  ``"mindspore"`` is the export run by MindSpore itself — MindFormers' — (its pipeline: one
  forward per micro-batch, 1F1B retention; gradients accumulated in place; its parallel
  optimizer at the default level; sequence parallelism when ``model.sequence_parallel``:
  ``memory.py``, ``timing.py``), the default for the ``simulate`` backend, whose trials stand
  for that run, for a study whose trial program runs on it (``trial.program: mindformers``),
  and for a ``replay`` table whose rows it ran (:func:`default_engine`);
  ``"megatron"`` is Megatron-LM in 16-bit mixed precision (ZeRO's 2 + 2 + 12 bytes per
  parameter, a 16-bit gradient all-reduce, a 1F1B that keeps activations instead; with
  ``model.sequence_parallel`` a llama's norms on its tp share of the tokens, each linear
  layer's gathered input kept as its shard and gathered again in the backward) — for pricing
  published Megatron runs. Details in ``memory.py`` and ``timing.py``; anything else is a
  ValueError.
- ``Estimate.as_dict()`` has exactly the keys ``feasible, reason, memory_gb_per_device,
  step_time_s, samples_per_s, tflops_per_device, mfu, breakdown, not_modelled``; NaN becomes
  ``None`` so the dict is strict JSON. ``not_modelled`` lists, one sentence each, what the
  model.yaml says of the run that this engine does not price (:func:`not_modelled`: sequence
  parallelism under ``"trainer"``, the norms' communication recompute outside ``"mindspore"``
  (``"megatron"`` recomputes every layer's: its sequence parallelism gathers again); FP8 linear
  layers under the trainer or on a device without FP8; the expert all-to-alls' overlap under
  the trainer). ``breakdown`` is ``{"time_s": {compute, recompute, tp_comm, pp_comm,
  experts, imbalance, mla, mtp, ep_comm, ep_comm_inter, cp_comm, dp_comm, bubble, optimizer,
  host}, "memory_gb": {params, grads, accumulators, optimizer_states, activations,
  overhead}}`` for the device with the most memory (the parts sum to the totals; the parts of
  experts, latent attention, MTP modules and expert and context parallelism,
  `autotune.costmodel.moe_time`, are zero for a model or layout without them).
- ``tflops_per_device`` counts executed FLOPs (recompute and repeated forwards included, as
  Megatron-LM reports); ``mfu`` counts model FLOPs only, over the device's peak for the compute
  dtype.
- ``loss_scale`` and ``warmup_steps`` change numerics, not work: they never change an estimate.
- A knob priced by a hook (`autotune.costmodel.knob_pricing`) adds its effect to the breakdown's
  parts before the calibration applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.costmodel import schedules
from autotune.costmodel.calibration import Calibration
from autotune.costmodel.knob_pricing import PRICES
from autotune.costmodel.memory import memory_per_stage, rank_params
from autotune.costmodel.profiles import resolve_profile
from autotune.costmodel.step_time import step_time
from autotune.costmodel.workload import workload_for
from autotune.spec.attention import fused_refusal
from autotune.spec.backends import ENGINES, backend_of
from autotune.spec.constraints import violations
from autotune.spec.knobs import micro_steps
from autotune.spec.programs import program_of

# Headroom left on every device for allocator fragmentation and transient buffers the model
# does not price (an assumption; the calibration corrects the memory estimate, not this margin).
SAFETY_MARGIN = 0.9
NOT_ESTIMATED = "no dimensions given: not estimated"


def device_memory_cap(cluster) -> dict | None:
    """What a GPU/Ascend run of ``cluster`` caps its memory pool at, as the trial config's
    ``device_memory`` section (`autotune.train.runtime.device`): ``size_gb`` the profile's memory
    (``cluster.device_memory_gb`` when given), ``max_size_gb`` the budget the memory screen
    judges a candidate against — ``cluster.max_device_memory_gb`` where given, else the size ×
    `SAFETY_MARGIN` (:func:`estimate`). None on the other backends."""
    if not backend_of(cluster.backend).accelerator:
        return None
    size = resolve_profile(cluster).memory_gb
    cap = cluster.max_device_memory_gb
    return {
        "size_gb": size,
        "max_size_gb": cap if cap is not None else round(size * SAFETY_MARGIN, 2),
    }


NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    feasible: bool
    reason: str
    memory_gb_per_device: float
    step_time_s: float
    samples_per_s: float
    tflops_per_device: float
    mfu: float
    breakdown: dict
    not_modelled: tuple[str, ...] = ()
    # The correction applied (None: raw model). Not part of as_dict(); Calibration reads it.
    calibration: Calibration | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        def clean(value):
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, tuple):
                return list(value)
            return None if isinstance(value, float) and math.isnan(value) else value

        return {
            k: clean(getattr(self, k))
            for k in (
                "feasible",
                "reason",
                "memory_gb_per_device",
                "step_time_s",
                "samples_per_s",
                "tflops_per_device",
                "mfu",
                "breakdown",
                "not_modelled",
            )
        }


def fused_attention(model, profile, engine: str) -> bool:
    """Whether the run computes ``model``'s attention fused: asked for (``flash_attention``) and,
    MindSpore's (engines ``trainer`` and ``mindspore``), on a device that has the fused operator
    (its backend's ``fused_attention``: Ascend) for a model it accepts
    (`autotune.spec.attention`); Megatron's on any device (``--use-flash-attn``: FlashAttention on
    GPUs, MindSpeed's on Ascend). Elsewhere the scores are stored, and priced so."""
    if engine == "megatron":
        return model.flash_attention
    return (
        model.flash_attention
        and backend_of(profile.kind).fused_attention
        and not fused_refusal(model)
    )


def _unknown(feasible: bool, reason: str) -> Estimate:
    return Estimate(feasible, reason, NAN, NAN, NAN, NAN, NAN, {})


def not_modelled(model, engine: str, profile=None) -> tuple[str, ...]:
    """What ``model`` (a spec's ``model`` section) says of the run that ``engine`` (on device
    ``profile``) does not price, one sentence each."""
    notes = []
    if model.fp8_linear and (engine == "trainer" or profile and profile.peak_tflops_fp8 <= 0):
        where = "autotune's trainer" if engine == "trainer" else f"device {profile.name}"
        notes.append(f"model.fp8_linear: {where} has no FP8 GEMMs; priced in the compute dtype")
    if model.pipeline_schedule == "dualpipe" and engine != "megatron":
        notes.append(
            f"model.pipeline_schedule: the {engine} engine runs no DualPipe; priced as 1F1B"
        )
    if (model.pipeline_interleave or 1) > 1 and engine != "megatron":
        notes.append(
            f"model.pipeline_interleave: the {engine} engine's pipeline is priced as 1F1B, "
            "not interleaved"
        )
    if model.fsdp and engine != "megatron":
        notes.append(
            f"model.fsdp: Megatron-FSDP; the {engine} engine's parameters and gradients are "
            "priced whole"
        )
    if model.recompute_modules and engine != "megatron":
        notes.append(
            f"model.recompute_modules: Megatron's; the {engine} engine's selective recompute "
            "is priced with its own patterns"
        )
    if model.moe_comm_overlap and engine == "trainer":
        notes.append("model.moe_comm_overlap: autotune's trainer does not overlap; priced exposed")
    if model.sequence_parallel and engine == "trainer":
        notes.append(
            "model.sequence_parallel: autotune's trainer runs no sequence parallelism; priced "
            "with activations whole between layers"
        )
    if model.recompute_layers.get("select_comm_recompute") and not (
        model.sequence_parallel and engine == "mindspore"
    ):
        notes.append(
            "model.recompute_layers.select_comm_recompute: recomputes the all-gather "
            "after the norms, which only MindSpore's sequence parallelism has; no effect "
            "priced"
        )
    return tuple(notes)


def _rank_params(work, c, engine: str) -> int:
    """Parameters of the device with the most: one stage's, or under DualPipe its two."""
    per_stage = rank_params(work, c.tp, c.pp, c.ep)
    if schedules.dualpipe(work, c, engine):
        return max(per_stage[r] + per_stage[-1 - r] for r in range(c.pp // 2))
    return max(per_stage)


def default_engine(spec) -> str:
    """What executes ``spec``'s trials (see the module doc): on a backend that runs them, the
    trial program's engine (`autotune.spec.programs.TrialProgram.engine`: autotune's trainer,
    MindSpore's for MindFormers runs); on a backend whose trials are estimates, MindSpore's (they
    stand for the export's run); on a replay table, the engine its rows ran
    (``cluster.replay_engine``, or the table's ``engine`` column; the program's when neither
    says)."""
    kind = backend_of(spec.cluster.backend).kind
    if kind == "estimate":
        return "mindspore"
    if kind == "table" and spec.cluster.replay_engine:
        return spec.cluster.replay_engine
    return program_of(spec).engine


def estimate(
    spec,
    candidate,
    calibration: Calibration | None = None,
    engine: str | None = None,
    refuse: bool = True,
) -> Estimate:
    """The verdict on ``candidate`` for ``spec`` (see the module doc)."""
    engine = engine or default_engine(spec)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    profile = resolve_profile(spec.cluster)
    broken = violations(spec, candidate) if refuse else []
    if broken:
        return _unknown(False, "; ".join(broken))
    if candidate.jit_level == "O2" and not backend_of(profile.kind).graph_engine:
        return _unknown(
            False,
            f"jit_level O2 sinks the graph through CANN: Ascend only "
            f"(device profile {profile.name} is {profile.kind})",
        )
    work = workload_for(
        spec.model,
        fused_attention(spec.model, profile, engine),
        sequence_parallel=spec.model.sequence_parallel and engine != "trainer",
    )
    if work is None:
        return _unknown(True, NOT_ESTIMATED)
    work = work.executed_by(engine)  # Megatron's sequence parallelism: Llama.executed_by

    dtype, batch = spec.model.dtype, spec.train.global_batch_size
    n_micro = micro_steps(
        pp=candidate.pp, micro_batches=candidate.micro_batches, grad_accum=candidate.grad_accum
    )
    micro_batch = max(1, batch // (candidate.dp * n_micro))
    model = spec.model
    stages = memory_per_stage(
        work,
        candidate,
        micro_batch,
        n_micro,
        dtype,
        profile.framework_gb,
        engine,
        model.param_dtype,
        model.optimizer_dtype,
    )
    memory = max(stages, key=lambda parts: sum(parts.values()))
    times, flops = step_time(
        work,
        candidate,
        profile,
        spec.cluster,
        micro_batch,
        n_micro,
        dtype,
        _rank_params(work, candidate, engine),
        engine,
        model.param_dtype,
    )
    times, memory = dict(times), dict(memory)
    PRICES.call(candidate.as_dict(), spec, candidate, times, memory)  # knobs priced by a hook
    if calibration is not None:
        memory = {k: v * calibration.memory_factor for k, v in memory.items()}
        times = {k: v * calibration.time_factor for k, v in times.items()}

    memory_gb, seconds = sum(memory.values()), sum(times.values())
    devices = candidate.devices
    cap = spec.cluster.max_device_memory_gb
    reason = ""
    if cap is not None and memory_gb > cap:  # MindSpore's max_device_memory: a cap already
        reason = f"predicted {memory_gb:.1f} GB/device > max_device_memory {cap:g} GB"
    elif cap is None and memory_gb > profile.memory_gb * SAFETY_MARGIN:
        reason = (
            f"predicted {memory_gb:.1f} GB/device > {profile.memory_gb:g} GB × "
            f"{SAFETY_MARGIN} safety margin"
        )
    return Estimate(
        feasible=not reason,
        reason=reason,
        memory_gb_per_device=memory_gb,
        step_time_s=seconds,
        samples_per_s=batch / seconds,
        tflops_per_device=flops["executed"] / devices / seconds / 1e12,
        mfu=flops["model"] / devices / seconds / profile.peak(dtype),
        breakdown={"time_s": times, "memory_gb": memory},
        not_modelled=not_modelled(spec.model, engine, profile),
        calibration=calibration,
    )


def format_estimate(est: Estimate) -> str:
    """A readable table of an estimate (what ``autotune estimate`` prints without --json)."""
    lines = [f"{'feasible':<22}{'yes' if est.feasible else 'no'}"]
    if est.reason:
        lines.append(f"{'reason':<22}{est.reason}")
    rows = [
        ("memory / device", est.memory_gb_per_device, "GB", "{:.2f}"),
        ("step time", est.step_time_s, "s", "{:.4g}"),
        ("samples / s", est.samples_per_s, "", "{:.4g}"),
        ("TFLOP/s / device", est.tflops_per_device, "", "{:.4g}"),
        ("MFU", est.mfu * 100, "%", "{:.1f}"),
    ]
    for label, value, unit, fmt in rows:
        text = "n/a" if math.isnan(value) else f"{fmt.format(value)} {unit}".rstrip()
        lines.append(f"{label:<22}{text}")
    if est.breakdown:
        times, memory = est.breakdown["time_s"], est.breakdown["memory_gb"]
        total_t, total_m = sum(times.values()) or 1.0, sum(memory.values()) or 1.0
        lines.append("")
        lines.append(f"{'time (s)':<39}    memory (GB)")
        left = [(k, v, v / total_t) for k, v in times.items()]
        right = [(k, v, v / total_m) for k, v in memory.items()]
        for i in range(max(len(left), len(right))):
            a = (
                f"  {left[i][0]:<20}{left[i][1]:>10.4g}{left[i][2]:>7.1%}"
                if i < len(left)
                else " " * 39
            )
            b = (
                f"    {right[i][0]:<18}{right[i][1]:>8.2f}{right[i][2]:>7.1%}"
                if i < len(right)
                else ""
            )
            lines.append((a + b).rstrip())
    for note in est.not_modelled:
        lines.append(f"{'not modelled':<22}{note}")
    if est.calibration is not None:
        c = est.calibration
        lines.append(
            f"\ncalibrated: memory ×{c.memory_factor:.3g} ({c.n_memory} trials), "
            f"time ×{c.time_factor:.3g} ({c.n_time} trials)"
        )
    return "\n".join(lines)
