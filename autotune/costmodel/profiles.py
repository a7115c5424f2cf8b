"""Device profiles: the hardware numbers the cost model prices work with.

Contract: :func:`resolve_profile` maps a spec's ``cluster`` section to one :class:`DeviceProfile`.

- ``cluster.device`` a name (``a100-80g``, ``h100-80g``, ``h200``, ``h800``, ``ascend-910b``,
  ``cpu``),
  on any backend: that profile as listed, datasheet memory included.
- ``cluster.device`` a mapping of numbers: overrides of the fields of ``base`` (a profile name),
  or, without ``base``, a whole profile (every numeric field given).
- no ``device``: the backend's ``default_profile`` (`autotune.spec.backends`) — ``gpu``, ``simulate``
  and ``replay`` → ``a100-80g``, ``ascend``
  → ``ascend-910b``, ``cpu`` → ``cpu``.
- an explicit ``cluster.device_memory_gb`` replaces the profile's memory in every case above.
- ``cpu`` (named, or the backend's default): the CPU profile, memory =
  ``cluster.device_memory_gb`` or 16 GB (a "device" is one MindSpore worker process; its memory
  is that process's RSS), compute shared by the workers of a node. On backend ``cpu`` a
  ``device`` mapping overrides CPU fields (no ``base``).

An unknown name or field is a :class:`~autotune.spec.errors.SpecError` naming ``cluster.device``.

Units: memory in GiB (what ``nvidia-smi`` and VmHWM report as GB/MB), bandwidth in decimal GB/s
per device and per direction (datasheet convention), peak in dense TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from autotune.spec.backends import backend_of, device_backends
from autotune.spec.errors import SpecError


@dataclass(frozen=True)
class DeviceProfile:
    """Hardware of one device and its links. Every number is documented where it is set."""

    name: str
    kind: str  # its device backend's name (`autotune.spec.backends`)
    memory_gb: float  # device memory (GiB)
    peak_tflops: float  # dense FP16/BF16 matrix peak
    peak_tflops_fp32: float  # dense FP32 peak (compute dtype float32)
    hbm_gbps: float  # device memory bandwidth (prices memory-bound kernels)
    intra_node_gbps: float  # per device, per direction, inside a node
    inter_node_gbps: float  # per device, per direction, between nodes
    collective_latency_us: float  # fixed cost of launching one collective
    hop_latency_us: float  # per ring step (the α of the α–β model)
    framework_gb: float  # runtime baseline per device (context, workspaces, comm buffers)
    achievable: float  # fraction of peak that large GEMMs sustain
    hbm_efficiency: float  # fraction of hbm_gbps that memory-bound kernels sustain
    link_efficiency: float  # fraction of link bandwidth collectives sustain
    step_overhead_ms: float  # host work per training step (launch, data, bookkeeping)
    comm_overlap: float  # share of the backward window that hides the DP all-reduce
    half_collective_factor: float  # time of a 16-bit all-reduce over the α–β price (float32's)
    jit_o0: float  # compute-time factor per jit level, relative to O1
    jit_o1: float
    jit_o2: float
    jit_pynative: float
    # A full mesh inside the node (Ascend HCCS): the per-direction rate of the one link between
    # two devices. A group of n devices of a node then has n − 1 links each: min(intra_node_gbps,
    # (n − 1) × mesh_link_gbps). 0: a switch (NVLink/NVSwitch), every group at intra_node_gbps.
    mesh_link_gbps: float = 0.0
    # Dense FP8 matrix peak (TFLOP/s) where the device has FP8 tensor cores (Hopper); 0: none,
    # and a model's ``fp8_linear`` is priced in its compute dtype (the estimate says so).
    peak_tflops_fp8: float = 0.0
    # Why this profile's numbers should be calibrated on a few real trials before its estimates
    # rank anything ("" when none); `autotune estimate` prints it.
    caveat: str = field(default="", compare=False)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s (not TFLOP/s) for a compute dtype."""
        return (self.peak_tflops_fp32 if dtype == "float32" else self.peak_tflops) * 1e12

    def group_gbps(self, size: int) -> float:
        """Per-device, per-direction bandwidth of a collective among ``size`` devices of one
        node (see ``mesh_link_gbps``)."""
        if self.mesh_link_gbps <= 0:
            return self.intra_node_gbps
        return min(self.intra_node_gbps, max(1, size - 1) * self.mesh_link_gbps)

    def jit_factor(self, level: str) -> float:
        return {
            "O0": self.jit_o0,
            "O1": self.jit_o1,
            "O2": self.jit_o2,
            "pynative": self.jit_pynative,
        }[level]


# Assumptions shared by the accelerator profiles (no per-device source; calibrate per study):
# - achievable 0.74 (fraction of peak that GEMMs sustain): the least-squares fit on the 4
#   "tune" rows of benchmarks/costmodel_validation.py (Narayanan et al. 2021, Table 1); its 17
#   other rows are held out. The Hopper GPUs' and the 910B's are their own (below).
# - hbm_efficiency 0.7 and link_efficiency 0.8: memory-bound kernels and NCCL/HCCL collectives
#   typically sustain 70–90% of the nominal figure (nccl-tests all-reduce bus bandwidth on
#   DGX A100 ≈ 230 of 300 GB/s).
# - collective latency 20 µs, 2 µs per ring hop: order of nccl-tests small-message all-reduce.
# - framework 2 GiB: CUDA/CANN context, library workspaces, communicator buffers.
# - step overhead 2 ms: host-side launch and bookkeeping per step in graph mode.
# - jit factors (MindSpore publishes no ratios): O1 (kernel fusion) is the reference;
#   O0 (kernel by kernel, no fusion) 1.15×; O2 (whole graph sunk by CANN, Ascend) 0.92×;
#   PyNative 1.5× on an accelerator (host dispatch per op; on this CPU, where host overhead is
#   a larger share, docs/mindspore-cpu.md "PyNative vs GRAPH_MODE" measures several times more
#   for a small model).
# - comm_overlap 0.5: collectives run on their own streams, but how much of the backward they hide
#   depends on stream scheduling and on contention for HBM and SMs/cores, which no datasheet
#   gives; half is a start between the CPU's measured 0 and the ideal 1. The per-study
#   calibration's time factor corrects the step time it prices (docs/accelerators.md).
_ACCEL = dict(
    collective_latency_us=20.0,
    hop_latency_us=2.0,
    framework_gb=2.0,
    achievable=0.74,
    hbm_efficiency=0.7,
    link_efficiency=0.8,
    step_overhead_ms=2.0,
    comm_overlap=0.5,
    half_collective_factor=1.0,
    jit_o0=1.15,
    jit_o1=1.0,
    jit_o2=0.92,
    jit_pynative=1.5,
)

# Hopper's compute efficiency (H100, H200, H800 alike: the same SMs): achievable 0.40, the
# least-squares fit (log space, steps of 0.01) on the five Qwen3-235B-A22B layouts on 256 H100
# of docs/costmodel.md's table 5 (benchmarks/moe_layouts.py prints the fit beside this
# constant); held out: table 4's DeepSeek-V3 on 2,048 H800. The A100's 0.74 over-predicted
# those runs by up to 82 %. Fitted on mixture-of-experts runs under Megatron-Core: a dense
# model's large GEMMs may sustain more (no published dense Hopper run is priced here).
HOPPER_ACHIEVABLE = 0.40
# MindSpore 2.10's GPU plugin is built for CUDA 11 (plugin/libmindspore_gpu.so.11.1/.11.6): no
# Hopper kernels (FP8, TMA/wgmma GEMMs), so the datasheet's peak is not what its kernels reach.
_HOPPER = (
    "calibrate first: the datasheet peak assumes Hopper kernels that MindSpore 2.10's "
    "CUDA 11 GPU plugin does not have; run a few trials before trusting its ranking"
)

# The 910B's compute efficiency: achievable 0.65, the least-squares fit (log space, steps of
# 0.01) on the three runs of docs/costmodel.md's table 3 that state their jit level
# (benchmarks/mindformers_runs.yaml's "tune" rows; benchmarks/costmodel_validation.py prints
# the fit beside this constant). Held out: that table's fourth run and table 4's Ascend
# mixture-of-experts runs. The A100's 0.74 over-predicted every table 3 run by 10-21 %.
ASCEND_910B_ACHIEVABLE = 0.65
_ASCEND_FIT = (
    "calibrate first: its compute efficiency is fitted on three published MindFormers Llama 2 "
    "runs, not on your model; run a few trials before trusting its ranking"
)

PROFILES: dict[str, DeviceProfile] = {
    # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16/FP16 312 TFLOPS dense, FP32 19.5,
    # 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (both directions → 300 per direction).
    # NVIDIA DGX A100 datasheet: 8× 200 Gb/s HDR InfiniBand, one per GPU → 25 GB/s.
    "a100-80g": DeviceProfile("a100-80g", "gpu", 80.0, 312.0, 19.5, 2039.0, 300.0, 25.0, **_ACCEL),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16/FP16 1,979 TFLOPS with sparsity →
    # 989 dense, FP32 67, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (450 per direction).
    # NVIDIA DGX H100: 8× 400 Gb/s NDR InfiniBand (ConnectX-7), one per GPU → 50 GB/s.
    # FP8: 3,958 TFLOPS with sparsity → 1,979 dense (H100, H200 and H800 alike).
    "h100-80g": DeviceProfile(
        "h100-80g",
        "gpu",
        80.0,
        989.0,
        67.0,
        3350.0,
        450.0,
        50.0,
        **{**_ACCEL, "achievable": HOPPER_ACHIEVABLE},
        peak_tflops_fp8=1979.0,
        caveat=_HOPPER,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, same compute as
    # H100 SXM (989 dense FP16/BF16, 67 FP32), NVLink 900 GB/s; DGX H200: 400 Gb/s per GPU.
    "h200": DeviceProfile(
        "h200",
        "gpu",
        141.0,
        989.0,
        67.0,
        4800.0,
        450.0,
        50.0,
        **{**_ACCEL, "achievable": HOPPER_ACHIEVABLE},
        peak_tflops_fp8=1979.0,
        caveat=_HOPPER,
    ),
    # NVIDIA H800 SXM5 (the H100 SXM5's compute and HBM3 for the Chinese market): 989 dense
    # BF16/FP16 TFLOPS, 80 GB at 3.35 TB/s, NVLink cut to 400 GB/s (200 per direction: at the
    # 0.8 link efficiency the 160 GB/s DeepSeek-V3's report, §3.2.2, measures). Its cluster: 8
    # GPUs per node, one 400 Gb/s InfiniBand NIC each → 50 GB/s (the report's "IB (50 GB/s)").
    "h800": DeviceProfile(
        "h800",
        "gpu",
        80.0,
        989.0,
        67.0,
        3350.0,
        200.0,
        50.0,
        **{**_ACCEL, "achievable": HOPPER_ACHIEVABLE},
        peak_tflops_fp8=1979.0,
        caveat=_HOPPER,
    ),
    # Huawei Ascend 910B (Atlas 800T A2 server, 8 NPUs). Huawei publishes no full per-chip
    # datasheet; public figures: ≈313 TFLOPS FP16/BF16 (variants quoted 280–376), 64 GB HBM2e at
    # ≈1.6 TB/s, HCCS full mesh 7 links × 56 GB/s = 392 GB/s per NPU (196 per direction),
    # 8× 200 GbE RoCE per server, one per NPU → 25 GB/s. FP32 is not published: assumed ¼ of
    # FP16 (the cube units are FP16/BF16 native). Override with a device mapping if yours differs.
    # The mesh gives each pair of NPUs one link, 56 GB/s both ways = 28 per direction, so a group
    # of n NPUs in a server reaches min(196, (n − 1) × 28) GB/s per direction: 28 for two, 84 for
    # four, 196 only for all eight (docs/accelerators.md).
    "ascend-910b": DeviceProfile(
        "ascend-910b",
        "ascend",
        64.0,
        313.0,
        78.0,
        1600.0,
        196.0,
        25.0,
        **{**_ACCEL, "achievable": ASCEND_910B_ACHIEVABLE},
        mesh_link_gbps=28.0,
        caveat=_ASCEND_FIT,
    ),
}

# The CPU class this project runs on (docs/mindspore-cpu.md; lscpu here: 2 vCPUs of an AVX-512
# Intel Xeon at 2.6 GHz). Peak FP32 = 2 cores × 2.6 GHz × 64 FLOP/cycle (two 512-bit FMA units ×
# 16 lanes × 2) = 333 GFLOP/s for the machine, shared by the workers of a node (a 1024³ fp32
# MatMul reaches 271–278 GFLOP/s: the doc's "Half precision").
CPU_MACHINE_PEAK_TFLOPS_FP32 = 0.333
# Half precision ≈2.4× slower: set from fp16 steps of 23–34 ms vs 11–13 ms in fp32 (model not
# recorded). docs/mindspore-cpu.md "Half precision" re-measures it; on 2026-11-29 the fp16 MatMul
# kernel was 1.4–1.6× slower and MLP training steps 0.9–1.2× — see there before relying on 2.4.
CPU_HALF_SLOWDOWN = 2.4
CPU_BASE = DeviceProfile(
    "cpu",
    "cpu",
    memory_gb=16.0,  # replaced by cluster.device_memory_gb
    peak_tflops=CPU_MACHINE_PEAK_TFLOPS_FP32 / CPU_HALF_SLOWDOWN,
    peak_tflops_fp32=CPU_MACHINE_PEAK_TFLOPS_FP32,
    hbm_gbps=20.0,  # assumption: a 2-vCPU share of a server's DRAM bandwidth
    # All-reduce between the two pinned msrun workers of this machine, measured with
    # `.venv/bin/python benchmarks/records/collectives_cpu.py` (a 2-rank create_group group,
    # AllReduce inside a compiled Cell, 4 B – 64 MB) and fitted to allreduce_time's n = 2 form
    # α + S / (intra_node_gbps × link_efficiency) over 16 KB – 4 MB, the trainer's messages.
    # Four runs on a quieter machine: α = 301 / 173 / 222 / 207 µs, B_eff = 0.35 / 0.33 / 0.39 /
    # 0.37 GB/s; medians taken: α = 215 µs, B_eff = 0.36 GB/s → intra_node_gbps = 0.36 / 0.8 =
    # 0.45. Against the three cleaner runs these price every size from 16 B to 16 MB within
    # ±19% (but one 4 MB point measured 2× slow); 4 B measured 0.10–0.12 ms (α over-prices it
    # 2×, harmless: scalars), 64 MB ≈0.23 GB/s (priced ≈35% fast; only a fusion bucket that
    # large is). Two runs while a neighbour loaded the cores gave α = 605 / 546 µs,
    # B_eff = 0.21 / 0.16 GB/s: a busy machine doubles communication (the per-study calibration
    # absorbs that). Two ranks cannot separate the launch from the per-hop term: all of α is
    # taken as launch.
    intra_node_gbps=0.45,
    # Assumption: between machines the same collective library over 10 GbE (1.25 GB/s); the
    # library's own rate above is the lower bound, so it is taken for the wire too.
    inter_node_gbps=0.45,
    collective_latency_us=215.0,
    hop_latency_us=0.0,
    # MindSpore's runtime plus a small model: RSS 0.8/1.5/4.1/7.6 GB at batch 32/128/512/1024
    # extrapolated to ≈0.55 GB at batch 0. docs/mindspore-cpu.md "Peak memory and the runtime
    # baseline" (2026-11-29): runtime alone 0.51 GB, a small model's peak 0.55 GB.
    framework_gb=0.55,
    # Fitted to the 8 residual MLP blocks of docs/mindspore-cpu.md "Activation recompute" (d 256,
    # 64×256 rows, fp32, GRAPH_MODE) as first measured: 7.35 s per step (model 7.31 s; full
    # recompute 9.50 s, model 9.68 s), ffn 4·d and 256 classes assumed (the head is <1%). The
    # doc's re-measurement (2026-11-29) is slower: 9.38 s under load, and 2.50–2.55 s at 4,096
    # rows where the model says 1.84 s.
    achievable=0.19,
    hbm_efficiency=0.7,
    link_efficiency=0.8,
    # A small DP model steps in 7–12 ms in total (docs/mindspore-cpu.md "Step overhead and
    # fusing small gradients": 6 ms on 2026-11-29, gradients fused).
    step_overhead_ms=5.0,
    # MindSpore's CPU backend runs a graph's kernels in turn: the DP all-reduce does not overlap
    # the backward. Measured by `.venv/bin/python benchmarks/layouts_cpu.py
    # examples/memory_bound_cpu.yaml` (2026-11-29): dp2 1,700 ms per step against tp2 754 ms at
    # the same FLOPs per worker — the 200 MB of float32 gradients (≈0.55 s at the rate above)
    # fully exposed, plus dp2's double optimizer work. Accelerators reduce on their own streams.
    comm_overlap=0.0,
    # A float16 all-reduce inside a compute graph costs 3.3–3.8 ms per 256 KB where the α–β fit
    # above prices 0.94 ms (float32: 2.0–2.7 ms per 512 KB, priced 1.67): the CPU collective sums
    # half precision slowly. `.venv/bin/python benchmarks/records/allreduce_in_graph.py`
    # (2026-11-29, three runs). Tensor- and pipeline-parallel messages travel in the compute dtype.
    half_collective_factor=3.5,
    # docs/mindspore-cpu.md "Jit levels": O0/O1/O2 give the same CPU kernel graph. PyNative: set
    # from "6–8× slower"; the doc's "PyNative vs GRAPH_MODE" measured 3.4–3.6× on a small MLP and
    # ≈1–1.4× on a compute-bound one (2026-11-29).
    jit_o0=1.0,
    jit_o1=1.0,
    jit_o2=1.0,
    jit_pynative=7.0,
)

_NUMERIC = tuple(f.name for f in fields(DeviceProfile) if f.name not in ("name", "kind", "caveat"))
_OPTIONAL = (
    "mesh_link_gbps",
    "peak_tflops_fp8",
)  # a whole profile given as numbers may leave these out
_MAY_BE_ZERO = (
    "collective_latency_us",
    "hop_latency_us",
    "framework_gb",
    "step_overhead_ms",
    "comm_overlap",
    "mesh_link_gbps",
    "peak_tflops_fp8",
)


def resolve_profile(cluster) -> DeviceProfile:
    """The :class:`DeviceProfile` for a spec's ``cluster`` section (rules in the module doc)."""
    device = cluster.device
    name = device if isinstance(device, str) else backend_of(cluster.backend).default_profile
    if name == CPU_BASE.name:
        base = replace(CPU_BASE, memory_gb=cluster.device_memory_gb or CPU_BASE.memory_gb)
        per_node = max(1, cluster.devices_per_node)  # workers of a node share its cores
        base = replace(
            base,
            peak_tflops=base.peak_tflops / per_node,
            peak_tflops_fp32=base.peak_tflops_fp32 / per_node,
        )
        return _override(base, device, allow_base=False) if isinstance(device, dict) else base
    if device is None:
        profile = PROFILES[name]
    elif isinstance(device, str):
        profile = _named(device)
    else:
        profile = _override(None, device, allow_base=True)
    # An explicit cluster.device_memory_gb (e.g. a 64 GB part of a family) wins over the profile.
    if cluster.device_memory_gb is not None:
        profile = replace(profile, memory_gb=cluster.device_memory_gb)
    return profile


def _named(name) -> DeviceProfile:
    if name not in PROFILES:
        raise SpecError(
            f"cluster.device: unknown device profile {name!r} "
            f"(known: {', '.join(PROFILES)}, cpu, or a mapping of numbers)"
        )
    return PROFILES[name]


def _override(base: DeviceProfile | None, numbers: dict, allow_base: bool) -> DeviceProfile:
    numbers = dict(numbers)
    if "base" in numbers:
        if not allow_base:
            raise SpecError("cluster.device.base: the cpu backend always uses the CPU profile")
        base = _named(numbers.pop("base"))
    kind = numbers.pop("kind", base.kind if base else "gpu")
    kinds = [backend.name for backend in device_backends()]
    if kind not in kinds:
        raise SpecError(f"cluster.device.kind: must be one of {', '.join(kinds)}, got {kind!r}")
    for key, value in numbers.items():
        if key not in _NUMERIC:
            raise SpecError(
                f"cluster.device.{key}: unknown field (known: base, kind, {', '.join(_NUMERIC)})"
            )
        floor = 0 if key in _MAY_BE_ZERO else 1e-12
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= floor:
            raise SpecError(
                f"cluster.device.{key}: must be a number "
                f"{'≥' if floor == 0 else '>'} 0, got {value!r}"
            )
    if base is None:
        missing = [k for k in _NUMERIC if k not in numbers and k not in _OPTIONAL]
        if missing:
            raise SpecError(
                f"cluster.device: give base: <profile> or every field; missing {', '.join(missing)}"
            )
        return DeviceProfile(name="custom", kind=kind, **{k: float(v) for k, v in numbers.items()})
    return replace(
        base, name=f"{base.name}*", kind=kind, **{k: float(v) for k, v in numbers.items()}
    )
