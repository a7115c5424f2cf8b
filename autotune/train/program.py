"""The trial program: train ``trial.steps`` optimizer updates with every knob applied, write metrics.

A trial (the compressed schedule) runs until ``trial.steps`` updates were *applied*: a step the
loss scaler skips (an overflow) does not count, so every candidate's ``final_loss`` is taken
after the same number of updates and the same compressed schedule (whose step is the
optimizer's, which a skipped step does not advance). A scale that keeps overflowing stops at
``UPDATE_CAP`` × ``trial.steps`` steps, however many updates it applied. An exported run
(``trial.schedule`` ``"full"``) and a resumed one count steps, as MindSpore's trainers do.

A config whose ``trial`` has ``precision`` and ``min_steps`` (the driver gives them to studies
without ``final_loss``, whose values a shorter trial does not change) may stop earlier, by the
stop rule of `autotune.train.metrics.StepLog`: the measured steps up to the one at which
``min_steps`` of them came after the scaler's initial back-off are a pilot, from whose spread
the steps still to measure are planned so that the estimate of the mean step time (``step_time_ci``)
is within ``precision``; the trial stops after them (or ends as before, when the plan needs
every step left). Rank 0's pilot decides and every rank stops at that step: at the pilot's end
(a count of steps and overflows, the same on every rank) one eager one-element all-reduce
carries rank 0's plan.

:func:`run_trial` is what ``python -m autotune.train CONFIG_JSON`` (one process) or ``msrun …
autotune/train/__main__.py CONFIG_JSON`` (dp·tp·pp processes) executes after
:func:`open_trial_session`, and what workers that stay up between trials execute for each
trial (`autotune.train.runtime.serve`); the config format is the driver's (see the package docstring).
Knobs as applied here:

- the launch (`autotune.train.runtime.session`: set_device, the memory cap, ``communication.init()``, a
  failure there being the launch's, :class:`LaunchError`), once per process; then, per trial,
  the context's mode, the layout's process groups and parallel context.
- the layout (``dp``, ``tp``, ``pp``, ``ep``; ``cp`` above 1 is refused: the trainer splits no
  sequences): each rank builds its part of the model
  (`autotune.train.parallel.groups.Placement`, `autotune.layout`): tensor parallelism on
  explicit collectives in its tp group (`autotune.train.parallel.tp_layers`), pipeline stages driven by a
  1F1B schedule over ``micro_batches`` (`autotune.train.parallel.pipeline`), routed experts
  split over ep groups with an all-gather token dispatcher (`autotune.train.models.moe`). Each dp replica trains on its
  shard of every global batch. One process runs stand-alone (no init).
- ``fusion_mb``: the parallel context's ``comm_fusion`` allreduce size threshold, which buckets
  the DP gradient all-reduce (`autotune.train.step.train_step`).
- ``grad_accum`` (pp = 1) / ``micro_batches`` (pp > 1): true accumulation, one DP all-reduce and
  one update per step.
- ``model.dtype`` float16: float16 compute, float32 parameters, dynamic loss scaling from
  ``loss_scale`` (factor 2, window `autotune.spec.knobs.SCALE_WINDOW`); float32 and bfloat16: no loss scaling.
- ``warmup_steps``: warmup + cosine (`autotune.train.step.schedule`), compressed onto the trial unless
  ``trial.schedule`` is ``"full"`` (an exported run).
- ``jit_level``: GRAPH_MODE with that JitConfig, or PYNATIVE_MODE for ``pynative``.
- ``recompute``: ``network.apply_recompute(mode)`` on each rank's stage.

Once the launch is done (communication and groups; at once for one process) each rank prints
``autotune.train.CANDIDATE_STARTED`` on stderr: from there on a failure is the candidate's own.
With the config's ``compile_cache`` folder, graphs compiled by an earlier trial of the same
graph are loaded (`autotune.train.runtime.compile_cache`); one line on stderr says how many.

Optional ``checkpoint`` section (exported runs; trials save nothing): ``dir`` (per-rank folders,
`autotune.train.checkpoint`), ``save_every`` (steps; null = only at the end), ``resume`` (continue
from the latest checkpoint in ``dir``), ``init_from`` (a folder of per-rank checkpoints whose
weights a fresh run starts from).

After the last step (untimed, outside every step, the training state left as it is), a float16
run measures ``underflow_share`` by `autotune.train.step.probe`'s rule on the last step's batch at the
final loss scale: a bound from the last step's own gradients, and the probe only when the bound
is above `autotune.train.step.probe.SKIP_BELOW` (or the config's ``trial.underflow_probe`` is
``"always"``); each rank counts its part and an all-reduce sums the counts. Before the probe
runs, rank 0 writes the training's metrics (``underflow_note``
`autotune.train.metrics.PROBE_UNFINISHED`); the probe out of memory, or the trial stopped by
its launcher while it probes, leaves ``underflow_share`` null with the reason and the trial
``ok`` — the probe never fails a trial that trained.

Outputs in ``out_dir``: ``steps.jsonl`` and ``metrics.json`` (rank 0; see
`autotune.train.metrics`), and on every rank ``metrics.rank<r>.json`` with that rank's peak
memory (read before the probe; on GPU/Ascend the trial's allocated peak plus the session's
overhead, with ``device_allocated_mb``, ``device_overhead_mb`` (``device_overhead_seen``: whether
the vendor tool saw the process when it was measured), ``device_reserved_mb``, ``device_smi_mb``
and ``device_smi_seen``, `autotune.train.runtime.device.DeviceMemory`; ``leftover_mb``, what earlier
trials of a warm worker left resident, taken off the CPU peak), a sha256 of its final weights
(the ranks of a dp group must agree), ``probe_s``, the wall time of the underflow
measurement (bound, and probe where it ran), and ``routed_slots``
(`autotune.train.step.routing.routed_slots`).
"""

import os
import sys
import time

import numpy as np

from autotune.files import write_json
from autotune.spec.knobs import SCALE_WINDOW
from autotune.train import CANDIDATE_STARTED
from autotune.train import metrics as metrics_mod
from autotune.train.config import UPDATE_CAP, ConfigError
from autotune.train.config_check import check_config
from autotune.train.runtime import compile_cache
from autotune.train.runtime.session import LaunchError, Session, open_session  # noqa: F401  (LaunchError: __main__)
from autotune.train.step.routing import routed_slots, router_imbalance


def _max_over_ranks(value: float, rank: int, world: int) -> float:
    """Max of ``value`` across all ranks: each rank contributes its value at its own index of a
    zero vector, which the all-reduce sums."""
    from autotune.train.parallel.groups import world_sum

    mine = np.zeros(world, np.float32)
    mine[rank] = value
    return float(world_sum(mine).max())


def _rank_zero_value(placement, value: int) -> int:
    """Rank 0's ``value`` on every rank: an eager one-element all-reduce to which the other
    ranks add 0 (measured on 2 CPU workers: ~3 ms a call; a compiled cell costs about as much
    a call but ~300 ms to compile)."""
    if placement.world == 1:
        return value
    from autotune.train.parallel.groups import world_sum

    return int(round(float(world_sum([float(value if placement.rank == 0 else 0)])[0])))


def _underflow_share(engine, placement, step: int, scale: float, backend, before_probe) -> dict:
    """The world's underflow metrics (``underflow_share``, ``underflow_bound``,
    ``underflow_probed``, ``underflow_note``) on step ``step``'s global batch at loss scale
    ``scale`` by `autotune.train.step.probe`'s rule; none when the compute dtype is not float16. An
    out-of-memory failure in the probe, in ``backend``'s words or a MemoryError, leaves the
    share unmeasured (the rule's ``before_probe``: called first)."""
    from autotune.train.parallel.groups import world_sum

    if not engine.scaled:
        return {}
    inputs, labels = engine.dataset(step, placement.dp_index, placement.dp)

    def summed(values):
        return [float(v) for v in world_sum(values)] if placement.world > 1 else values

    def out_of_memory(exc: BaseException) -> bool:
        return isinstance(exc, MemoryError) or backend.oom_in(f"{type(exc).__name__}: {exc}")

    return engine.underflow(
        inputs, labels, scale, summed, out_of_memory=out_of_memory, before_probe=before_probe
    )


def _checkpoints(cfg, engine, placement, ms):
    """``(tensors, folder, save_every, first step)``: what a checkpoint holds, where it goes, and
    the step this run starts at (after resuming, or loading given weights)."""
    from autotune.train import checkpoint

    section = cfg.get("checkpoint") or {}
    counter = ms.Parameter(ms.Tensor(0, ms.int32), name="step", requires_grad=False)
    tensors = checkpoint.state_tensors(engine.network, engine.optimizer, engine.state, counter)
    folder, rank = section.get("dir"), placement.rank
    if section.get("resume"):
        path = checkpoint.latest(folder, rank) if folder else None
        if path is None:
            raise ConfigError(
                f"checkpoint.resume: no checkpoint in {checkpoint.rank_dir(folder, rank)}"
            )
        checkpoint.restore(path, tensors)
        if engine.sharding is not None:  # the shards were restored: rebuild the whole weights
            engine.sharding.rebuild()
        return tensors, folder, section.get("save_every"), int(counter.asnumpy())
    if section.get("init_from"):
        path = checkpoint.latest(section["init_from"], rank)
        if path is None:
            raise ConfigError(
                f"checkpoint.init_from: no checkpoint in "
                f"{checkpoint.rank_dir(section['init_from'], rank)}"
            )
        checkpoint.restore(path, {p.name: p for p in engine.network.get_parameters()})
        if engine.sharding is not None:  # whole weights were loaded: cut this rank's shards
            engine.sharding.refresh_shards()
    return tensors, folder, section.get("save_every"), 0


def open_trial_session(cfg: dict) -> Session:
    """The process's session for trials like ``cfg`` (its backend, device memory and world
    size): `autotune.train.runtime.session.open_session`, after the config is checked; with the
    config's ``compile_cache`` folder, MindSpore's compile cache keyed by graph
    (`autotune.train.runtime.compile_cache`)."""
    check_config(cfg)
    # MindSpore's own compile cache keys graphs on the source files only: measured, a cached
    # graph is silently reused after a knob change (recompute=full ran the recompute=none graph)
    # or crashes (grad_accum changed). Only the graph-keyed cache may turn it on.
    os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)
    knobs = cfg["knobs"]
    session = open_session(cfg, knobs["dp"] * knobs["tp"] * knobs["pp"])
    if cfg.get("compile_cache"):
        session.cache = compile_cache.install(cfg["compile_cache"], session.rank)
    return session


def _reusable(cfg: dict) -> dict | None:
    """``cfg`` where its graphs may be reused, None where not: a model.entry network (its source
    is not in the graph key), PyNative (nothing compiled)."""
    if cfg["model"].get("entry") or cfg["knobs"]["jit_level"] == "pynative":
        return None
    return cfg


def run_trial(cfg: dict, session: Session, started: float, leftover_mb: float = 0.0) -> dict:
    """Train the trial in ``session`` and write the outputs; returns this rank's metrics (rank
    0's are metrics.json).

    ``started``: when this trial started (epoch s) — its process's start, or when a worker
    that stays up took it (`autotune.train.runtime.serve`): the origin of ``init_s`` and ``compile_s``.
    ``leftover_mb``: host memory earlier trials of this process left resident that this one
    does not use (`autotune.train.runtime.serve`), taken off its peak on CPU.
    """
    check_config(cfg)
    ms = session.ms
    from autotune.train import checkpoint
    from autotune.train.step.engine import build_engine

    if session.memory is not None:
        session.memory.trial_starts()
    placement = session.place(cfg["knobs"])
    print(
        f"{CANDIDATE_STARTED}: rank {placement.rank} of {placement.world}",
        file=sys.stderr,
        flush=True,
    )
    if session.cache is not None:
        session.cache.trial(_reusable(cfg))
    engine = build_engine(cfg, placement, SCALE_WINDOW)
    tensors, folder, save_every, first_step = _checkpoints(cfg, engine, placement, ms)
    train, trial, rank, dp = cfg["train"], cfg["trial"], placement.rank, placement.dp
    if first_step >= trial["steps"]:
        raise ConfigError(
            f"trial.steps: the checkpoint is at step {first_step}, nothing left of "
            f"{trial['steps']} steps"
        )
    # the peak counts what training adds to the built model, not the full tensors drawn to slice
    # it (on a device the pool keeps what it reserved: its reserved peak includes the model)
    backend = session.backend
    if session.memory is not None:
        session.memory.reset_peak()
    else:
        metrics_mod.reset_peak_memory()
    out_dir = cfg["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    precision, min_steps = trial.get("precision"), trial.get("min_steps")
    log = metrics_mod.StepLog(
        os.path.join(out_dir, "steps.jsonl") if rank == 0 else None,
        trial["measure_after"],
        train["global_batch_size"],
        train["total_steps"],
        append=first_step > 0,
        pilot_steps=min_steps,
    )
    shard_size = train["global_batch_size"] // dp
    built = time.time()
    first_done = None
    # a trial counts applied updates (see the module doc); a full or resumed run, steps
    updates = trial.get("schedule", "compressed") != "full" and first_step == 0
    last_step = UPDATE_CAP * trial["steps"] if updates else trial["steps"]
    applied, i = 0, first_step
    stop_at, planned_s = None, 0.0  # the stop rule's last step (all ranks agree), its cost

    def steps_left() -> int:  # at most, if no step from here on overflows
        return min(last_step - i, trial["steps"] - (applied if updates else i))

    loads = []  # per step, the rank's MoE layers' expert loads (engine.take_router_load)
    while steps_left() > 0 and (stop_at is None or i < stop_at):
        inputs, labels = engine.dataset(i, placement.dp_index, dp)
        if len(inputs) != shard_size or len(labels) != shard_size:
            raise ValueError(
                f"dataset({i}, {placement.dp_index}, {dp}) returned {len(inputs)} samples, "
                f"expected {shard_size}"
            )
        # timed: the step's micro-batches and the host sync, not the dataset call (a real input
        # pipeline overlaps it)
        t0 = time.perf_counter()
        loss, overflow, scale = engine.step(inputs, labels)
        seconds = time.perf_counter() - t0
        if first_done is None:
            first_done = time.time()
        log.add(i, seconds, float(loss), bool(overflow), float(scale))
        loads.append(engine.take_router_load())
        applied += not bool(overflow)
        i += 1
        if precision is not None and log.pilot_ended() and steps_left() > 0:
            asked = time.perf_counter()
            block = _rank_zero_value(placement, log.plan(precision, steps_left()))
            stop_at = i + block if block < steps_left() else None  # else: to the end, as before
            planned_s = time.perf_counter() - asked
        if folder and (
            steps_left() == 0
            or (stop_at is not None and i >= stop_at)
            or (save_every and i % save_every == 0)
        ):
            tensors["step"].set_data(ms.Tensor(i, ms.int32))
            checkpoint.save(folder, rank, i, tensors)
    log.close()

    # training's peak: before the probe builds anything
    held = session.memory.peak() if session.memory is not None else {}
    own_peak = held["peak"] if held else metrics_mod.peak_memory_mb() - leftover_mb
    world = placement.world
    peak = _max_over_ranks(own_peak, rank, world) if world > 1 else own_peak
    final_scale = float(engine.state.scale.asnumpy())
    imbalance = router_imbalance(cfg["model"], placement, loads, log.first_measured())
    timing = {"started_at": started, "init_s": built - started, "first_step_s": first_done - built}

    def before_probe(bound: float) -> None:
        """The training's metrics, written before the probe runs: a trial its launcher stops
        while it probes (over the memory budget, past its timeout) keeps them
        (`autotune.execution.classify.stopped_in_probe`)."""
        if rank == 0:
            pending = log.summary(
                {**timing, "probe_s": 0.0},
                peak,
                final_scale,
                underflow_share=None,
                underflow_bound=bound,
                underflow_note=metrics_mod.PROBE_UNFINISHED,
                router_imbalance=imbalance,
            )
            pending["finished_at"] = time.time()
            write_json(os.path.join(out_dir, "metrics.json"), pending, indent=1)

    probe_started = time.perf_counter()
    underflow = _underflow_share(engine, placement, i - 1, final_scale, backend, before_probe)
    probe_s = time.perf_counter() - probe_started
    result = log.summary(
        {**timing, "probe_s": probe_s},
        peak,
        final_scale,
        router_imbalance=imbalance,
        **underflow,
    )
    if log.weight is not None and rank == 0:  # what the rule did, and what agreeing on it cost
        pilot = log.pilot_end - trial["measure_after"]
        verdict = (
            f"stopped after {i} steps of {trial['steps']}"
            if stop_at is not None
            else f"needed every step: ran {i} steps"
        )
        print(
            f"autotune.train precision: a pilot of {pilot} measured steps planned "
            f"{(stop_at or i) - log.pilot_end} more; {verdict}, step_time_ci "
            f"{result['step_time_ci']:.2%} against {precision:.1%}; the plan took one "
            f"all-reduce, {planned_s * 1000:.1f} ms",
            file=sys.stderr,
            flush=True,
        )
    from autotune.train.models.weights import digest

    write_json(
        os.path.join(out_dir, f"metrics.rank{rank}.json"),
        indent=1,
        value={
            "rank": rank,
            "stage": placement.stage,
            "dp_index": placement.dp_index,
            "tp_index": placement.tp_index,
            "peak_memory_mb": own_peak,
            "leftover_mb": leftover_mb,
            "weights_sha256": digest(engine.network),
            **{
                f"device_{k}" + ("" if k.endswith("_seen") else "_mb"): v
                for k, v in held.items()
                if k != "peak"
            },
            "loss_last": result["loss_last"],
            "overflow_steps": result["overflow_steps"],
            "probe_s": probe_s,
            "routed_slots": routed_slots(loads, log.first_measured()),
        },
    )
    cache = session.cache
    if cache is not None and cache.key is not None:
        print(
            f"{compile_cache.SAY} graph {cache.key}: {cache.hits} of {cache.ordinal} graphs "
            f"loaded, {cache.stores} stored (for each graph not stored before, MindSpore "
            f"logs 'Load MindIR file failed': the slot's placeholder)",
            file=sys.stderr,
            flush=True,
        )
    if rank == 0:
        result["finished_at"] = time.time()
        write_json(os.path.join(out_dir, "metrics.json"), result, indent=1)
    return result
