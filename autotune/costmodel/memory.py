"""Peak memory per device of one candidate, by part, in GiB.

Contract: :func:`memory_per_stage` returns, for every pipeline stage, the memory one device of
that stage needs; the estimate reports the largest. Parts (the breakdown keys): ``params``,
``grads``, ``optimizer_states``, ``activations``, ``overhead``.

Model (sources in the docstrings below and in ``workload.py``):

- Model states, Adam: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", §3.1: mixed precision keeps 2 bytes of 16-bit parameters, 2 of
  16-bit gradients and 12 of fp32 master weights, momentum and variance = 16 bytes/parameter.
  In float32 the same is 4 + 4 + 8 = 16. Tensor parallelism splits the weight matrices
  (layer norms and row-parallel biases stay whole); pipeline stages hold their layers, the first
  the embeddings, the last the head. Optimizer-state sharding (MindSpore
  ``enable_parallel_optimizer``) is not a knob here and is not modelled.
- Activations per layer and sample by recompute mode: Korthikanti et al. 2022 (``workload.py``).
  1F1B pipelining (Narayanan et al. 2021 §2.2): stage i keeps up to ``pp − i`` micro-batches in
  flight, so the first stage holds ``pp`` and the last one. Without pipelining, gradient
  accumulation keeps one micro-batch at a time. Under full recompute the layer being
  back-propagated is rebuilt whole, so one layer of un-recomputed activations comes on top
  (gradient buffers reuse the memory of freed activations). Against MINDSPORE_CPU.md's 8 MLP
  blocks (1,938 → 1,019 MB, −47%) this predicts 1,973 → 981 MB (+2% / −4%).
- Overhead: the device profile's runtime baseline, plus one AllReduce fusion buffer when data
  parallel (a bigger ``fusion_mb`` costs memory).
"""

from __future__ import annotations

from autotune.costmodel.workload import DTYPE_BYTES, Workload

GIB = 2**30
MIB = 2**20

# ZeRO §3.1 byte counts per parameter: (parameters, gradients, optimizer states).
STATE_BYTES = {"half": (2, 2, 12), "float32": (4, 4, 8)}

# MINDSPORE_CPU.md: with comm_fusion mode "size", buckets come out near a quarter of the
# configured threshold.
FUSION_FILL = 0.25


def state_bytes(dtype: str) -> tuple[int, int, int]:
    return STATE_BYTES["float32" if dtype == "float32" else "half"]


def stage_params(work: Workload, tp: int, pp: int, stage: int) -> float:
    """Parameters one device of pipeline stage ``stage`` holds."""
    split, whole = work.layer_params()
    layers = -(-work.layers // pp)  # ceil: an uneven split is a violation, priced pessimistically
    params = layers * (split / tp + whole)
    if stage == 0:
        first_split, first_whole = work.first_stage_params()
        params += first_split / tp + first_whole
    if stage == pp - 1:
        last_split, last_whole = work.last_stage_params()
        params += last_split / tp + last_whole
    return params


def stage_activations(work: Workload, tp: int, pp: int, stage: int, micro_batch: int,
                      n_micro: int, recompute: str, dtype: str) -> float:
    """Activation bytes one device of ``stage`` holds at its peak (1F1B, see module doc);
    ``micro_batch`` samples per micro-batch, ``n_micro`` micro-batches per step."""
    nbytes = DTYPE_BYTES[dtype]
    layers = -(-work.layers // pp)
    in_flight = max(1, min(pp - stage, n_micro))
    kept = in_flight * micro_batch * layers * work.layer_activations(tp, recompute, nbytes)
    # Under full recompute the layer being back-propagated is rebuilt whole for a moment.
    working = 0.0
    if recompute == "full":
        working = micro_batch * work.layer_activations(tp, "none", nbytes)
    extra = 0.0
    if stage == 0:
        extra += in_flight * micro_batch * work.first_stage_activations(tp, nbytes)
    if stage == pp - 1:
        extra += micro_batch * work.last_stage_activations(tp, nbytes)
    return kept + working + extra


def memory_per_stage(work: Workload, candidate, micro_batch: int, n_micro: int, dtype: str,
                     framework_gb: float) -> list[dict]:
    """One breakdown dict (GiB by part) per pipeline stage."""
    p_bytes, g_bytes, o_bytes = state_bytes(dtype)
    stages = []
    for stage in range(candidate.pp):
        params = stage_params(work, candidate.tp, candidate.pp, stage)
        fusion = 0.0
        if candidate.dp > 1:
            fusion = min(candidate.fusion_mb * MIB * FUSION_FILL, params * g_bytes)
        stages.append({
            "params": params * p_bytes / GIB,
            "grads": params * g_bytes / GIB,
            "optimizer_states": params * o_bytes / GIB,
            "activations": stage_activations(work, candidate.tp, candidate.pp, stage,
                                             micro_batch, n_micro, candidate.recompute,
                                             dtype) / GIB,
            "overhead": framework_gb + fusion / GIB,
        })
    return stages
