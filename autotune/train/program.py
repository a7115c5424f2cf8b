"""The trial program: train ``trial.steps`` optimizer steps with every knob applied, write metrics.

``run(config)`` is what ``python -m autotune.train CONFIG_JSON`` (one process, dp = 1) or
``msrun … autotune/train/__main__.py CONFIG_JSON`` (dp processes) executes; the config format is
the driver's (see the package docstring). Knobs as applied here:

- ``dp`` > 1: ``communication.init()`` and DATA_PARALLEL with ``gradients_mean`` and
  ``comm_fusion`` allreduce by size = ``fusion_mb``; each rank trains on its shard of every
  global batch. dp = 1 runs stand-alone (no init).
- ``grad_accum``: true accumulation (`autotune.train.step`): one all-reduce and one update
  per K micro-batches.
- ``model.dtype`` float16: float16 compute, float32 parameters, dynamic loss scaling from
  ``loss_scale`` (factor 2, window `SCALE_WINDOW`); float32: no loss scaling.
- ``warmup_steps``: warmup + cosine compressed onto the trial (`autotune.train.schedule`).
- ``jit_level``: GRAPH_MODE with that JitConfig, or PYNATIVE_MODE for ``pynative``.
- ``recompute``: ``network.apply_recompute(mode)``.
- ``tp``/``pp`` > 1 are refused: this program runs data parallelism only (MindSpore cannot run
  operator or pipeline sharding on CPU); ``micro_batches`` only matters with pp > 1.

Outputs in ``out_dir``: ``steps.jsonl`` and ``metrics.json`` (rank 0; see
`autotune.train.metrics`), and on every rank ``metrics.rank<r>.json`` with that rank's peak
memory and a sha256 of its final weights (DP ranks must agree).
"""

import hashlib
import os
import sys
import time

import numpy as np

from autotune.train import metrics as metrics_mod

SCALE_WINDOW = 1000  # MindFormers' default scale_window for DynamicLossScaleUpdateCell
JIT_LEVELS = ("O0", "O1", "O2", "pynative")
RECOMPUTE = ("none", "selective", "full")
DEVICE_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


class ConfigError(ValueError):
    """The config cannot be run by this program (exit code 2)."""


REQUIRED = {
    "model": ("family",),
    "train": ("global_batch_size", "learning_rate", "total_steps"),
    "trial": ("steps", "measure_after"),
    "knobs": ("dp", "fusion_mb", "grad_accum", "loss_scale", "warmup_steps", "jit_level", "recompute"),
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
    if cfg.get("backend", "cpu") not in DEVICE_TARGETS:
        raise ConfigError(f"backend: {cfg.get('backend')!r} cannot run a training program")
    if knobs.get("tp", 1) != 1 or knobs.get("pp", 1) != 1:
        raise ConfigError("knobs.tp/pp: the trial program runs data parallelism only (tp = pp = 1)")
    if knobs["jit_level"] not in JIT_LEVELS:
        raise ConfigError(f"knobs.jit_level: {knobs['jit_level']!r} is not one of {', '.join(JIT_LEVELS)}")
    if knobs["recompute"] not in RECOMPUTE:
        raise ConfigError(f"knobs.recompute: {knobs['recompute']!r} is not one of {', '.join(RECOMPUTE)}")
    if model.get("dtype", "float32") not in ("float16", "float32"):
        raise ConfigError(f"model.dtype: {model.get('dtype')!r} is not float16 or float32")
    if train["global_batch_size"] % (knobs["dp"] * knobs["grad_accum"]):
        raise ConfigError("train.global_batch_size: must be a multiple of dp * grad_accum")
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
    """Context, parallel context and communication; returns (rank, dp)."""
    knobs = cfg["knobs"]
    ms.set_device(DEVICE_TARGETS[cfg.get("backend", "cpu")])
    ms.set_context(mode=ms.PYNATIVE_MODE if knobs["jit_level"] == "pynative" else ms.GRAPH_MODE)
    numpy2_workaround(ms)
    dp = knobs["dp"]
    if dp == 1:
        return 0, 1
    from mindspore import communication
    communication.init()
    size = communication.get_group_size()
    if size != dp:
        raise ConfigError(f"knobs.dp: {dp} but the launcher started {size} processes")
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, device_num=dp,
                                 comm_fusion={"allreduce": {"mode": "size", "config": int(knobs["fusion_mb"])}})
    return communication.get_rank(), dp


def make_optimizer(network, learning_rate):
    """AdamW (β 0.9/0.95, GPT-style), weight decay 0.1 on matrices only (not norms, biases)."""
    from mindspore import nn
    params = network.trainable_params()
    groups = [{"params": [p for p in params if len(p.shape) > 1], "weight_decay": 0.1},
              {"params": [p for p in params if len(p.shape) <= 1], "weight_decay": 0.0}]
    return nn.AdamWeightDecay([g for g in groups if g["params"]], learning_rate=learning_rate, beta1=0.9,
                              beta2=0.95, eps=1e-8)


def weights_digest(network) -> str:
    """sha256 over the parameters' names and bytes (bit-identical weights ⇔ equal digests)."""
    digest = hashlib.sha256()
    for name, param in network.parameters_and_names():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(param.asnumpy()).tobytes())
    return digest.hexdigest()


def _max_over_ranks(ms, value: float, rank: int, dp: int) -> float:
    """Max of ``value`` across DP ranks: one tiny compiled AllReduce at the end of the trial.

    CPU AllReduce only sums, so each rank contributes its value at its own index of a zero vector.
    """
    from mindspore import nn, ops

    class AllSum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.AllReduce()

        def construct(self, x):
            return self.op(x)

    mine = np.zeros(dp, np.float32)
    mine[rank] = value
    return float(AllSum()(ms.Tensor(mine)).asnumpy().max())


def _build(cfg, ms, dp):
    """``(network, dataset, accumulate_cell, apply_cell)`` with the model's knobs applied."""
    from autotune.train import entry, schedule, step
    knobs, model, train, trial = cfg["knobs"], cfg["model"], cfg["train"], cfg["trial"]
    ms.set_seed(cfg.get("seed", 0))  # every rank builds identical initial weights
    network, loss_fn, dataset = entry.build(cfg)
    fp16 = model.get("dtype", "float32") == "float16"
    if fp16:
        step.set_compute_dtype(network, ms.float16)
    if knobs["recompute"] != "none":
        if not hasattr(network, "apply_recompute"):
            raise ConfigError("knobs.recompute: the network has no apply_recompute(mode) method")
        network.apply_recompute(knobs["recompute"])
    warmup, total = schedule.trial_schedule(knobs["warmup_steps"], train["total_steps"], trial["steps"])
    optimizer = make_optimizer(network, schedule.WarmupCosineLR(train["learning_rate"], warmup, total))
    accumulate, apply = step.build_steps(
        network, loss_fn, optimizer, accum_steps=knobs["grad_accum"], dp=dp, scaling=fp16,
        loss_scale=knobs["loss_scale"], scale_window=SCALE_WINDOW,
        jit_level=None if knobs["jit_level"] == "pynative" else knobs["jit_level"])
    return network, dataset, accumulate, apply


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

    rank, dp = _setup(cfg, ms)
    metrics_mod.reset_peak_memory()
    network, dataset, accumulate, apply = _build(cfg, ms, dp)
    train, trial, accum = cfg["train"], cfg["trial"], cfg["knobs"]["grad_accum"]
    out_dir = cfg["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    log = metrics_mod.StepLog(os.path.join(out_dir, "steps.jsonl") if rank == 0 else None,
                              trial["measure_after"], train["global_batch_size"])
    shard_size = train["global_batch_size"] // dp
    micro = shard_size // accum
    compile_s = None
    for i in range(trial["steps"]):
        inputs, labels = dataset(i, rank, dp)
        if len(inputs) != shard_size or len(labels) != shard_size:
            raise ValueError(f"dataset({i}, {rank}, {dp}) returned {len(inputs)} samples, expected {shard_size}")
        # timed: the K micro-steps and the host sync, not the dataset call (a real input pipeline overlaps it)
        t0 = time.perf_counter()
        for j in range(accum):
            x, y = ms.Tensor(inputs[j * micro:(j + 1) * micro]), ms.Tensor(labels[j * micro:(j + 1) * micro])
            out = accumulate(x, y) if j < accum - 1 else apply(x, y)
        loss, overflow, scale = (o.asnumpy() for o in out)
        seconds = time.perf_counter() - t0
        if compile_s is None:
            compile_s = time.time() - started
        log.add(i, seconds, float(loss), bool(overflow), float(scale))
    log.close()

    own_peak = metrics_mod.peak_memory_mb()
    peak = _max_over_ranks(ms, own_peak, rank, dp) if dp > 1 else own_peak
    result = log.summary(compile_s, peak, float(apply.state.scale.asnumpy()))
    metrics_mod.write_json_atomic(os.path.join(out_dir, f"metrics.rank{rank}.json"), {
        "rank": rank, "peak_memory_mb": own_peak, "weights_sha256": weights_digest(network),
        "loss_last": result["loss_last"], "overflow_steps": result["overflow_steps"]})
    if rank == 0:
        metrics_mod.write_json_atomic(os.path.join(out_dir, "metrics.json"), result)
    return result
