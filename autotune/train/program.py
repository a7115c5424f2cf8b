"""The trial program: train ``trial.steps`` optimizer updates with every knob applied, write metrics.

A trial (the compressed schedule) runs until ``trial.steps`` updates were *applied*: a step the
loss scaler skips (an overflow) does not count, so every candidate's ``final_loss`` is taken
after the same number of updates and the same compressed schedule (whose step is the
optimizer's, which a skipped step does not advance). A scale that keeps overflowing stops at
``UPDATE_CAP`` × ``trial.steps`` steps, however many updates it applied. An exported run
(``trial.schedule`` ``"full"``) and a resumed one count steps, as MindSpore's trainers do.

``run(config)`` is what ``python -m autotune.train CONFIG_JSON`` (one process) or ``msrun …
autotune/train/__main__.py CONFIG_JSON`` (dp·tp·pp processes) executes; the config format is the
driver's (see the package docstring). Knobs as applied here:

- the launch, in this order (each call announced on stderr, `autotune.train.device.launch_step`):
  ``set_device`` (no id: msrun hands each worker its device), the context's mode, on GPU/Ascend
  ``runtime.set_memory(max_size=…)`` from the config's ``device_memory`` section, then
  ``communication.init()`` before any op — except on CPU, where the numpy-2 throw-away op
  (:func:`numpy2_workaround`) comes before init (`autotune.spec.backends.Backend.first_op_before_init`
  says why). msrun's scheduler role runs none of this (`autotune.train.__main__`).
- the layout (``dp``, ``tp``, ``pp``): ``communication.init()`` (a failure there is the launch's,
  :class:`LaunchError`, not the candidate's), then each rank builds its part of the model (`autotune.train.parallel.Placement`, `autotune.layout`): tensor parallelism on
  explicit collectives in its tp group (`autotune.train.tp_layers`), pipeline stages driven by a
  1F1B schedule over ``micro_batches`` (`autotune.train.pipeline`). Each dp replica trains on its
  shard of every global batch. One process runs stand-alone (no init).
- ``fusion_mb``: the parallel context's ``comm_fusion`` allreduce size threshold, which buckets
  the DP gradient all-reduce (`autotune.train.step`).
- ``grad_accum`` (pp = 1) / ``micro_batches`` (pp > 1): true accumulation, one DP all-reduce and
  one update per step.
- ``model.dtype`` float16: float16 compute, float32 parameters, dynamic loss scaling from
  ``loss_scale`` (factor 2, window `autotune.spec.knobs.SCALE_WINDOW`); float32 and bfloat16: no loss scaling.
- ``warmup_steps``: warmup + cosine (`autotune.train.schedule`), compressed onto the trial unless
  ``trial.schedule`` is ``"full"`` (an exported run).
- ``jit_level``: GRAPH_MODE with that JitConfig, or PYNATIVE_MODE for ``pynative``.
- ``recompute``: ``network.apply_recompute(mode)`` on each rank's stage.

Once the launch is done (communication and groups; at once for one process) each rank prints
``autotune.train.CANDIDATE_STARTED`` on stderr: from there on a failure is the candidate's own.

Optional ``checkpoint`` section (exported runs; trials save nothing): ``dir`` (per-rank folders,
`autotune.train.checkpoint`), ``save_every`` (steps; null = only at the end), ``resume`` (continue
from the latest checkpoint in ``dir``), ``init_from`` (a folder of per-rank checkpoints whose
weights a fresh run starts from).

After the last step (untimed, outside every step, the training state left as it is), a float16
run measures ``underflow_share`` by `autotune.train.probe`'s rule on the last step's batch at the
final loss scale: a bound from the last step's own gradients, and the probe only when the bound
is above `autotune.train.probe.SKIP_BELOW` (or the config's ``trial.underflow_probe`` is
``"always"``); each rank counts its part and an all-reduce sums the counts.

Outputs in ``out_dir``: ``steps.jsonl`` and ``metrics.json`` (rank 0; see
`autotune.train.metrics`), and on every rank ``metrics.rank<r>.json`` with that rank's peak
memory (read before the probe; on GPU/Ascend also ``device_reserved_mb``, ``device_allocated_mb``
and ``device_smi_mb``, `autotune.train.device.device_peak_mb`), a sha256 of its final weights (the ranks of a dp group must
agree) and ``probe_s``, the wall time of that measurement (bound, and probe where it ran).
"""

import os
import sys
import time

import numpy as np

from autotune import layout
from autotune.spec.backends import BACKENDS
from autotune.spec.knobs import JIT_LEVELS, RECOMPUTE_MODES, SCALE_WINDOW
from autotune.train import CANDIDATE_STARTED
from autotune.train import metrics as metrics_mod
from autotune.train.config import ConfigError, micro_steps
from autotune.train.device import (device_peak_mb, device_total_bytes, launch_step, memory_cap,
                                   reported_memory_warning, reset_device_peak)


UPDATE_CAP = 2  # a trial's steps, applied or skipped, stop at UPDATE_CAP × trial.steps


class LaunchError(RuntimeError):
    """This process could not join the launch (``communication.init``: the cluster, the
    launcher's environment): nothing of the candidate ran. Exit code 3."""


REQUIRED = {
    "model": ("family",),
    "train": ("global_batch_size", "learning_rate", "total_steps"),
    "trial": ("steps", "measure_after"),
    "knobs": ("dp", "tp", "pp", "micro_batches", "fusion_mb", "grad_accum", "loss_scale", "warmup_steps",
              "jit_level", "recompute"),
}


def check_config(cfg: dict) -> None:
    """Raise ConfigError for what the driver should have prevented; messages name the field."""
    if "out_dir" not in cfg:
        raise ConfigError("out_dir: missing")
    for section, keys in REQUIRED.items():
        if not isinstance(cfg.get(section), dict):
            raise ConfigError(f"{section}: missing")
        for key in keys:
            if key not in cfg[section]:
                raise ConfigError(f"{section}.{key}: missing")
    knobs, model, train, trial = cfg["knobs"], cfg["model"], cfg["train"], cfg["trial"]
    backend = cfg.get("backend", "cpu")
    if backend not in BACKENDS or not BACKENDS[backend].runs_program:
        raise ConfigError(f"backend: {backend!r} cannot run a training program")
    if knobs["jit_level"] not in JIT_LEVELS:
        raise ConfigError(f"knobs.jit_level: {knobs['jit_level']!r} is not one of {', '.join(JIT_LEVELS)}")
    if knobs["recompute"] not in RECOMPUTE_MODES:
        raise ConfigError(f"knobs.recompute: {knobs['recompute']!r} is not one of "
                          f"{', '.join(RECOMPUTE_MODES)}")
    dtype = model.get("dtype", "float32")
    if dtype not in BACKENDS[backend].compute_dtypes:
        raise ConfigError(f"model.dtype: {dtype!r} does not run on backend {backend!r} "
                          f"(it runs {', '.join(BACKENDS[backend].compute_dtypes)})")
    if (knobs["tp"] > 1 or knobs["pp"] > 1) and model.get("entry"):
        raise ConfigError("knobs.tp/pp: a model.entry network runs with tp = pp = 1")
    if model.get("entry") is None:
        reasons = layout.builtin_layout_reasons(model, knobs["tp"], knobs["pp"])
        if reasons:
            raise ConfigError(f"knobs: {reasons[0]}")
    split = knobs["dp"] * micro_steps(knobs)
    if train["global_batch_size"] % split:
        raise ConfigError(f"train.global_batch_size: must be a multiple of dp × micro-batches = {split}")
    if knobs["pp"] > 1 and knobs["micro_batches"] < knobs["pp"]:
        raise ConfigError("knobs.micro_batches: must be ≥ pp")
    if not 0 <= trial["measure_after"] < trial["steps"]:
        raise ConfigError("trial.measure_after: must be >= 0 and < trial.steps")


def numpy2_workaround(ms) -> None:
    """Absorb MindSpore's failure on the first eager op that parses a Python sequence.

    MindSpore 2.10's C++ side was built against numpy 1.x: under numpy 2.x the first such op in a
    process raises ``SystemError: numpy.core.multiarray failed to import`` (and prints a long
    warning); later ops work and compiled graphs are unaffected. One throw-away reshape at start
    takes the hit, with stderr silenced so worker logs stay readable.
    """
    if int(np.__version__.split(".")[0]) < 2:
        return
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                ms.Tensor(np.zeros(1, np.float32)).reshape((1,))
            except SystemError:
                pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _setup(cfg, ms):
    """Context, memory cap, communication, process groups and parallel context, in the order
    `launch_order` states; returns this rank's Placement."""
    from autotune.train import parallel

    knobs, backend = cfg["knobs"], BACKENDS[cfg.get("backend", "cpu")]
    dp, tp, pp = knobs["dp"], knobs["tp"], knobs["pp"]
    # no device id: msrun hands each worker its own (MindSpore's set_device doc)
    launch_step(f"set_device({backend.device_target})")
    ms.set_device(backend.device_target)
    ms.set_context(mode=ms.PYNATIVE_MODE if knobs["jit_level"] == "pynative" else ms.GRAPH_MODE)
    cap = memory_cap(cfg, backend.device_target)
    if cap:
        launch_step(f"runtime.set_memory(max_size={cap})")
        ms.runtime.set_memory(max_size=cap)
    early = dp * tp * pp == 1 or backend.first_op_before_init
    if early:
        launch_step("first op")
        numpy2_workaround(ms)
    if dp * tp * pp == 1:
        return parallel.Placement.of(0, 1, 1, 1)
    try:
        launch_step("communication.init()")
        ms.communication.init()
        size, rank = ms.communication.get_group_size(), ms.communication.get_rank()
    except Exception as exc:  # noqa: BLE001  (whatever the cluster says, it is the launch's)
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise LaunchError(f"communication init failed: {type(exc).__name__}: {first}") from exc
    if not early:
        launch_step("first op")
        numpy2_workaround(ms)
    if backend.device_memory:
        warning = reported_memory_warning(cfg, device_total_bytes(ms))
        if warning:
            print(warning, file=sys.stderr, flush=True)
    if size != dp * tp * pp:
        raise ConfigError(f"knobs: dp·tp·pp = {dp * tp * pp} but the launcher started {size} processes")
    placement = parallel.Placement.of(rank, dp, tp, pp)
    parallel.create_groups(placement)
    if dp > 1:
        # The DP gradient reducer buckets its all-reduces by this threshold, over any group.
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=size,
                                     comm_fusion={"allreduce": {"mode": "size", "config": int(knobs["fusion_mb"])}})
    return placement


def _sum_over_ranks(ms, values) -> np.ndarray:
    """Element-wise sum of ``values`` (float32: the CPU AllReduce has no integer or float64
    kernel) across all ranks: one tiny compiled AllReduce."""
    from mindspore import nn, ops

    class AllSum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.AllReduce()

        def construct(self, x):
            return self.op(x)

    return AllSum()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()


def _max_over_ranks(ms, value: float, rank: int, world: int) -> float:
    """Max of ``value`` across all ranks: each rank contributes its value at its own index of a
    zero vector, which the all-reduce sums."""
    mine = np.zeros(world, np.float32)
    mine[rank] = value
    return float(_sum_over_ranks(ms, mine).max())


def _underflow_share(engine, placement, step: int, scale: float) -> dict:
    """The world's underflow metrics (``underflow_share``, ``underflow_bound``,
    ``underflow_probed``) on step ``step``'s global batch at loss scale ``scale`` by
    `autotune.train.probe`'s rule; none when the compute dtype is not float16."""
    from autotune.train.parallel import world_sum

    if not engine.scaled:
        return {}
    inputs, labels = engine.dataset(step, placement.dp_index, placement.dp)

    def world_share(part, whole):
        if placement.world > 1:
            part, whole = world_sum([part, whole])
        return float(part) / float(whole)

    return engine.underflow(inputs, labels, scale, world_share)


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
            raise ConfigError(f"checkpoint.resume: no checkpoint in {checkpoint.rank_dir(folder, rank)}")
        checkpoint.restore(path, tensors)
        if engine.sharding is not None:  # the shards were restored: rebuild the whole weights
            engine.sharding.rebuild()
        return tensors, folder, section.get("save_every"), int(counter.asnumpy())
    if section.get("init_from"):
        path = checkpoint.latest(section["init_from"], rank)
        if path is None:
            raise ConfigError(f"checkpoint.init_from: no checkpoint in "
                              f"{checkpoint.rank_dir(section['init_from'], rank)}")
        checkpoint.restore(path, {p.name: p for p in engine.network.get_parameters()})
        if engine.sharding is not None:  # whole weights were loaded: cut this rank's shards
            engine.sharding.refresh_shards()
    return tensors, folder, section.get("save_every"), 0


def run(cfg: dict, started: float) -> dict:
    """Train the trial and write the outputs; returns this rank's metrics (rank 0's are metrics.json).

    ``started``: when the process started (epoch s), the origin of ``compile_s``.
    """
    check_config(cfg)
    # MindSpore's compile cache keys graphs on the source files only: measured, a cached graph is
    # silently reused after a knob change (recompute=full ran the recompute=none graph) or crashes
    # (grad_accum changed). Every trial must compile its own candidate.
    os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)
    import mindspore as ms
    from autotune.train import checkpoint
    from autotune.train.engine import build_engine

    placement = _setup(cfg, ms)
    print(f"{CANDIDATE_STARTED}: rank {placement.rank} of {placement.world}", file=sys.stderr,
          flush=True)
    engine = build_engine(cfg, placement, SCALE_WINDOW)
    tensors, folder, save_every, first_step = _checkpoints(cfg, engine, placement, ms)
    train, trial, rank, dp = cfg["train"], cfg["trial"], placement.rank, placement.dp
    if first_step >= trial["steps"]:
        raise ConfigError(f"trial.steps: the checkpoint is at step {first_step}, nothing left of "
                          f"{trial['steps']} steps")
    # the peak counts what training adds to the built model, not the full tensors drawn to slice
    # it (on a device the pool keeps what it reserved: its reserved peak includes the model)
    backend = BACKENDS[cfg.get("backend", "cpu")]
    if backend.device_memory:
        reset_device_peak(ms)
    else:
        metrics_mod.reset_peak_memory()
    out_dir = cfg["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    log = metrics_mod.StepLog(os.path.join(out_dir, "steps.jsonl") if rank == 0 else None,
                              trial["measure_after"], train["global_batch_size"], train["total_steps"],
                              append=first_step > 0)
    shard_size = train["global_batch_size"] // dp
    compile_s = None
    # a trial counts applied updates (see the module doc); a full or resumed run, steps
    updates = trial.get("schedule", "compressed") != "full" and first_step == 0
    last_step = UPDATE_CAP * trial["steps"] if updates else trial["steps"]
    applied, i = 0, first_step

    def more() -> bool:
        return i < last_step and (applied if updates else i) < trial["steps"]

    while more():
        inputs, labels = engine.dataset(i, placement.dp_index, dp)
        if len(inputs) != shard_size or len(labels) != shard_size:
            raise ValueError(f"dataset({i}, {placement.dp_index}, {dp}) returned {len(inputs)} samples, "
                             f"expected {shard_size}")
        # timed: the step's micro-batches and the host sync, not the dataset call (a real input
        # pipeline overlaps it)
        t0 = time.perf_counter()
        loss, overflow, scale = engine.step(inputs, labels)
        seconds = time.perf_counter() - t0
        if compile_s is None:
            compile_s = time.time() - started
        log.add(i, seconds, float(loss), bool(overflow), float(scale))
        applied += not bool(overflow)
        i += 1
        if folder and (not more() or (save_every and i % save_every == 0)):
            tensors["step"].set_data(ms.Tensor(i, ms.int32))
            checkpoint.save(folder, rank, i, tensors)
    log.close()

    # training's peak: before the probe builds anything
    held = device_peak_mb(ms, backend.device_target, os.getpid()) if backend.device_memory else {}
    own_peak = held["peak"] if held else metrics_mod.peak_memory_mb()
    world = placement.world
    peak = _max_over_ranks(ms, own_peak, rank, world) if world > 1 else own_peak
    final_scale = float(engine.state.scale.asnumpy())
    probe_started = time.perf_counter()
    underflow = _underflow_share(engine, placement, i - 1, final_scale)
    probe_s = time.perf_counter() - probe_started
    result = log.summary(compile_s, peak, final_scale, **underflow)
    from autotune.train.weights import digest
    metrics_mod.write_json_atomic(os.path.join(out_dir, f"metrics.rank{rank}.json"), {
        "rank": rank, "stage": placement.stage, "dp_index": placement.dp_index, "tp_index": placement.tp_index,
        "peak_memory_mb": own_peak, "weights_sha256": digest(engine.network),
        **{f"device_{k}_mb": v for k, v in held.items() if k != "peak"},
        "loss_last": result["loss_last"], "overflow_steps": result["overflow_steps"], "probe_s": probe_s})
    if rank == 0:
        metrics_mod.write_json_atomic(os.path.join(out_dir, "metrics.json"), result)
    return result
