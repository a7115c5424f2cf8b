"""Step time of one candidate, by part, in seconds.

Contract: :func:`step_time` returns ``(breakdown, flops)``: breakdown keys ``compute``,
``recompute``, ``tp_comm``, ``pp_comm``, ``dp_comm``, ``bubble``, ``optimizer``, ``host``
(seconds per training step; their sum is the step time), and ``flops`` with ``model`` (without
recompute) and ``executed`` (with it), per step for the whole job.

Model:

- Compute: FLOPs (``workload.py``, Narayanan et al. 2021) at ``peak × achievable``, plus the
  memory-bound kernels (norms, activations, softmax, dropout, residual adds) at
  ``hbm × hbm_efficiency``: forward traffic ≈ reading and writing each kept activation once
  (2 × the un-recomputed activation bytes), backward twice that. The memory-bound share is what
  makes narrow models less efficient than wide ones. Both scale by the jit level's factor.
  The last pipeline stage (it also runs the head) sets the pace.
- Recompute: full repeats each layer's forward (×4/3 of the layer compute, Narayanan et al.);
  selective repeats only QKᵀ·V and the softmax (Korthikanti et al. 2022 §5).
- Tensor parallel: Megatron's 2 all-reduces per layer forward and 2 backward (+2 under full
  recompute) of the s·b·h hidden state, not overlapped (Shoeybi et al. 2019).
- Ring all-reduce of S bytes over n ranks: 2(n−1)/n · S/B + 2(n−1)·α_hop + α_launch (Patarasuk &
  Yuan 2009; Thakur et al. 2005). B is the intra-node link when the group fits in a node and the
  per-device inter-node link when it spans nodes. Rank order is TP innermost, then DP, then PP
  (Megatron/MindSpore device matrix), so a TP group crosses nodes when tp > devices_per_node and
  a DP group when tp·dp > devices_per_node.
- Pipeline (1F1B, Narayanan et al. 2021 §2.2): m micro-batches take (m + p − 1) micro-batch
  times; the bubble is the (p − 1) extra, i.e. a fraction (p − 1)/(m + p − 1) of the step. Each
  micro-batch sends its activation forward and its gradient back (point-to-point).
- Gradient accumulation (pp = 1): m = grad_accum micro-steps of compute, one DP all-reduce.
- Data-parallel all-reduce: grads in buckets of ``fusion_mb × FUSION_FILL``; each bucket pays the
  α terms, all pay the bandwidth term once. Buckets are reduced while the last micro-batch's
  backward (⅔ of its compute) still runs: with k buckets, (k−1)/k of that window hides
  communication, the last bucket never hides. One bucket hides nothing; many pay latency.
- Optimizer: Adam is memory-bound: ≈ 32 bytes per local parameter moved (read and write its
  16 bytes of ZeRO state) at device memory bandwidth.
- Host: the profile's per-step overhead. Loss scale and warmup steps have no effect on step time
  or memory (they change numerics, not work), so the model ignores them.
"""

from __future__ import annotations

from autotune.costmodel.memory import FUSION_FILL, MIB, state_bytes
from autotune.costmodel.profiles import DeviceProfile
from autotune.costmodel.workload import DTYPE_BYTES, Workload

OPTIMIZER_BYTES_PER_PARAM = 32  # read + write of the 16 bytes/param of Adam state (ZeRO §3.1)
BACKWARD_SHARE = 2 / 3          # backward = 2 × forward FLOPs (Narayanan et al. 2021)


def allreduce_time(nbytes: float, n: int, gbps: float, profile: DeviceProfile) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks at ``gbps`` per direction (see doc)."""
    if n <= 1:
        return 0.0
    alpha = (profile.collective_latency_us + 2 * (n - 1) * profile.hop_latency_us) * 1e-6
    return alpha + 2 * (n - 1) / n * nbytes / (gbps * 1e9 * profile.link_efficiency)


def p2p_time(nbytes: float, gbps: float, profile: DeviceProfile) -> float:
    """One point-to-point send of ``nbytes``."""
    return (profile.collective_latency_us * 1e-6
            + nbytes / (gbps * 1e9 * profile.link_efficiency))


def group_gbps(span: int, devices: int, per_node: int, profile: DeviceProfile) -> float:
    """Link bandwidth of a communication group whose ranks span ``span`` consecutive ranks."""
    return profile.inter_node_gbps if span > per_node and devices > per_node \
        else profile.intra_node_gbps


def step_time(work: Workload, c, profile: DeviceProfile, cluster, micro_batch: int,
              n_micro: int, dtype: str, params_per_device: float) -> tuple[dict, dict]:
    """Seconds per step by part, and FLOPs per step (see module doc)."""
    nbytes = DTYPE_BYTES[dtype]
    devices, per_node = cluster.devices, cluster.devices_per_node
    rate = profile.peak(dtype) * profile.achievable / profile.jit_factor(c.jit_level)
    hbm = profile.hbm_gbps * 1e9 * profile.hbm_efficiency / profile.jit_factor(c.jit_level)
    layers = -(-work.layers // c.pp)

    def kernels(flops_per_sample: float, traffic_per_sample: float) -> float:
        return micro_batch * (flops_per_sample / c.tp / rate + traffic_per_sample / hbm)

    act_full = work.layer_activations(c.tp, "none", nbytes)
    forward_traffic = 2 * act_full
    compute_mb = kernels(layers * work.layer_flops() + work.last_stage_flops(),
                         3 * layers * forward_traffic)
    act_selective = work.layer_activations(c.tp, "selective", nbytes)
    redone_traffic = {"full": forward_traffic, "selective": 2 * (act_full - act_selective),
                      "none": 0.0}[c.recompute]
    recompute_mb = kernels(layers * work.recompute_flops(c.recompute), layers * redone_traffic)

    tp_gbps = group_gbps(c.tp, devices, per_node, profile)
    message = micro_batch * work.tp_message_bytes(nbytes)
    tp_mb = (layers * work.tp_allreduces(c.recompute)
             * allreduce_time(message, c.tp, tp_gbps, profile))
    pp_mb = 0.0
    if c.pp > 1:
        pp_mb = 2 * p2p_time(message, group_gbps(devices, devices, per_node, profile), profile)

    per_mb = compute_mb + recompute_mb + tp_mb + pp_mb
    breakdown = {
        "compute": n_micro * compute_mb,
        "recompute": n_micro * recompute_mb,
        "tp_comm": n_micro * tp_mb,
        "pp_comm": n_micro * pp_mb,
        "bubble": (c.pp - 1) * per_mb,
        "dp_comm": _dp_exposed(c, profile, cluster, params_per_device, dtype,
                               BACKWARD_SHARE * (compute_mb + recompute_mb)),
        "optimizer": params_per_device * OPTIMIZER_BYTES_PER_PARAM
                     / (profile.hbm_gbps * 1e9 * profile.hbm_efficiency),
        "host": profile.step_overhead_ms * 1e-3,
    }
    batch = micro_batch * n_micro * c.dp
    model = batch * (work.layers * work.layer_flops() + work.last_stage_flops())
    executed = model + batch * work.layers * work.recompute_flops(c.recompute)
    return breakdown, {"model": model, "executed": executed}


def _dp_exposed(c, profile: DeviceProfile, cluster, params: float, dtype: str,
                window: float) -> float:
    """Data-parallel gradient all-reduce time left after overlap with the last backward."""
    if c.dp <= 1:
        return 0.0
    grad_bytes = params * state_bytes(dtype)[1]
    bucket = max(1.0, c.fusion_mb * MIB * FUSION_FILL)
    buckets = max(1, -(-int(grad_bytes) // int(bucket)))
    gbps = group_gbps(c.tp * c.dp, cluster.devices, cluster.devices_per_node, profile)
    alpha = allreduce_time(0.0, c.dp, gbps, profile)
    total = buckets * alpha + allreduce_time(grad_bytes, c.dp, gbps, profile) - alpha
    return max(total - window * (buckets - 1) / buckets, total / buckets)
