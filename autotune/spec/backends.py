"""Backends: where a trial runs — one :class:`Backend` object each, the one place that says so.

Contract: :data:`BACKENDS` maps ``cluster.backend`` names to their :class:`Backend`. A backend
states how its trials are answered (``kind``: a real MindSpore ``program``, the cost model's
``estimate``, a replay ``table``), which knob values and compute dtypes it executes (the knobs
themselves are defined in `autotune.spec.knobs`), and, for the real ones, the Ray resource a device
is, the ``ray start`` flag that provides it, the variable through which Ray hands a task its
devices, MindSpore's device target, how a trial's peak memory is read (host RSS of a worker on
CPU, MindSpore's memory-pool statistics on a device: host RSS says nothing about device memory)
and which log lines of a failed worker mean out-of-memory; for the accelerators also what their
first real run needs (docs/accelerators.md): the vendor tool that reads a process's device memory,
how MindSpore's memory pool grows and whether it can be emptied, whether a warm pool runs one
layout (communicators outside the pool), the driver's kernel JIT cache and a warm-up per node,
the chips whose overflow check isfinite can see, and the host ports the device's collectives take.
Every per-backend rule elsewhere reads one of these facts; no module outside this one names a
backend (tests/spec/test_backends.py checks it). Adding a backend is one entry here, or
:func:`register` from outside the package (a test's toy backend): the trial program is another
process, which knows only the entries here, so a ``program`` backend that runs trials must be one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.spec.knobs import DTYPES

# Lines of a failed run that mean it ran out of memory, matched case-insensitively. Host:
# Python's MemoryError, C++'s bad_alloc. MindSpore's device memory pool (2.10's libraries,
# `strings mindspore/lib/*.so`): "Device(id:0) memory isn't enough and alloc failed",
# "Memory not enough", "Allocate memory failed", "Out of Memory!!! Request memory size", and
# "... plus alloc size : N is more than total mem size : M"; CUDA's "out of memory"; Ascend's
# CANN error code EL0004 ("Failed to allocate memory"); the static memory planner's "Somas
# allocate failed for graph" (both device plugins), cuBLAS's "CUBLAS_STATUS_ALLOC_FAILED" (the
# GPU plugin), Ascend's allocator "Malloc device memory failed, size[" and "MallocAlign32 device
# memory failed, size[" (plugin/ascend/libmindspore_ascend_res_manager.so; docs/accelerators.md). Recorded lines: tests/fixtures/oom_lines.txt,
# tests/execution/test_accelerators.py.
HOST_OOM = (
    "memoryerror",
    "std::bad_alloc",
    "out of memory",
    "memory not enough",
    "memory is not enough",
    "allocate memory failed",
)
DEVICE_OOM = HOST_OOM + (
    "memory isn't enough",
    "alloc device mem failed",
    "allocate device memory failed",
    "failed to allocate memory",
    "more than total mem size",
    "somas allocate failed",
    "cublas_status_alloc_failed",
)
ASCEND_OOM = DEVICE_OOM + (
    "el0004",
    "malloc device memory failed",
    "mallocalign32 device memory failed",
)
# The vendor tools' per-process readings of device memory (`autotune.train.runtime.device_smi`).
NVIDIA_SMI = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
NPU_SMI = ("npu-smi", "info")
# set_memory's increase_size on an accelerator: the pool grows in blocks this large, so what it
# reserves stays within this of what a trial allocates (MindSpore's default is 2GB).
POOL_INCREASE = "0.25GB"
# How a backend's trials are answered (``Backend.kind``): a real MindSpore program, the cost
# model's estimate, a replayed table of measured candidates.
KINDS = ("program", "estimate", "table")


# cluster.backend when model.yaml leaves it out, and a trial config's when it does not say.
DEFAULT_BACKEND = "cpu"
# What executes a training step, as the cost model prices it (`autotune.costmodel.estimate`):
# autotune's trainer, MindSpore's own engine (MindFormers' runs), Megatron-LM.
ENGINES = ("trainer", "mindspore", "megatron")


@dataclass(frozen=True)
class Backend:
    """One backend (see the module doc). ``limits`` maps a knob to the values this backend
    executes (knobs not listed: every value) and the reason printed when others are dropped."""

    name: str
    kind: str  # "program", "estimate" or "table"
    compute_dtypes: tuple = DTYPES
    limits: dict = field(default_factory=dict)
    device_target: str | None = None  # MindSpore's set_device
    ray_resource: str | None = None  # what one device is to Ray
    ray_start_flag: str = ""  # how a Ray node advertises N of them
    visible_devices: str | None = None  # the variable Ray sets to a task's devices
    device_memory: bool = False  # peak memory from MindSpore's pool, not host RSS
    oom_markers: tuple = HOST_OOM
    # msrun pins each worker to its own cores: on CPU a trial has its node's cores to itself;
    # on a GPU/Ascend node several trials may share the host's cores, and pinning would collide.
    pins_cores: bool = False
    default_profile: str = "a100-80g"  # the cost model's device when cluster.device is unset
    fused_attention: bool = False  # runs flash_attention_score (`autotune.spec.attention`)
    # Whether a worker makes its first MindSpore op before communication.init(). MindSpore asks
    # for init() before any Tensor or op (its init() doc, Ascend; on GPU an op opens the device's
    # context and pool first): accelerators do. On CPU the first eager op is numpy 2's throw-away
    # (`autotune.train.runtime.session.numpy2_workaround`), and made after init() it leaves the worker
    # judged timed out by msrun's scheduler, which exits 1 (measured: docs/accelerators.md).
    first_op_before_init: bool = False
    # Environment variables every run of this backend sets (trials and exported launch.sh).
    environment: tuple = ()
    # Why MindFormers cannot run this backend's export ("" when it can).
    no_mindformers: str = ""
    # A device other than the host's cores: its workers get their share of the host's threads
    # (`autotune.execution.environment.host_threads`), its memory pool a cap (`set_memory`).
    accelerator: bool = False
    # The vendor tool that lists each process's device memory, and how its output reads
    # (`autotune.train.runtime.device_smi`: "csv" nvidia-smi's query, "table" npu-smi's process table).
    memory_tool: tuple = ()
    memory_tool_format: str = ""
    # set_memory's increase_size: how much the pool grows by when it runs short (MindSpore's
    # default, 2 GB blocks, rounds every trial's reserved memory up to the next 2 GB).
    pool_increase: str | None = None
    # Whether runtime.empty_cache gives the pool's cached blocks back (its doc lists Ascend only;
    # on GPU the pool keeps every block it took until the process ends).
    empties_pool: bool = False
    # Whether a warm pool runs one layout: each layout's process groups are communicators whose
    # buffers live outside the memory pool and its cap (HCCL: HCCL_BUFFSIZE, 200 MB each by
    # default), and communication.destroy_group does not run on GPU (its doc): a pool that ran
    # several layouts would hold them all (`autotune.execution.warm`).
    pool_per_layout: bool = False
    # The driver's kernel JIT cache: the variable naming its folder (kept per node, under the
    # user's cache folder, `jit_cache_folder`) and settings for it; with ``warm_up_per_node`` one
    # process per node makes the first op before the node's first trial, outside every trial's
    # clock (`autotune.execution.warmup`).
    jit_cache: str | None = None
    jit_settings: tuple = ()
    warm_up_per_node: bool = False
    # The chips this backend runs (MindSpore's ascend_soc_version; empty: any) and why others are
    # refused at the launch (`autotune.train.runtime.session`).
    chips: tuple = ()
    chip_refusal: str = ""
    # What a host needs beside autotune's own install (benchmarks/device_check.sh installs or
    # checks it): Python packages that carry the libraries the device plugin links against, and
    # what a user must have done that no package can (a vendor toolkit's environment).
    packages: tuple = ()
    host_setup: str = ""
    # Host ports the device's collectives take (first, last): never handed to msrun
    # (`autotune.execution.runner.free_port`; docs/cluster.md says how to reserve them).
    host_ports: tuple = ()
    # Per trial slot of a node (its lowest device) a block of ``slot_ports`` host ports, each
    # (variable, offset, form) set from it; the collective library's timeouts (variable, floor,
    # ceiling: set to the trial's timeout within them); lowered words of its log saying a peer
    # never answered, the cluster's failure (`autotune.execution.environment`, `.classify`).
    slot_ports: int = 0
    slot_variables: tuple = ()
    collective_timeouts: tuple = ()
    link_failures: tuple = ()
    # Whether the device has MindSpore's graph engine (GE), which jit_level O2 selects: the
    # cost model prices O2 only on a device profile of such a backend's kind.
    graph_engine: bool = False
    # Whether MindFormers runs this backend's export in its CPU form (data parallel, autotune's
    # CPU training step: `autotune.spec.mindformers_trial.cpu_refusals` says when it cannot).
    mindformers_cpu_form: bool = False

    @property
    def host_devices(self) -> bool:
        """Whether a device is one of the host's cores (a worker process), as on CPU."""
        return self.ray_resource == "CPU"

    @property
    def runs_program(self) -> bool:
        return self.kind == "program"

    def executes(self, knob: str, value) -> bool:
        """Whether a trial of this backend can run ``knob`` = ``value``."""
        return knob not in self.limits or value in self.limits[knob][0]

    def why_not(self, knob: str) -> str:
        """Why some values of ``knob`` do not run here ("" when all do)."""
        return self.limits[knob][1] if knob in self.limits else ""

    def resources(self, devices: int) -> dict:
        """Ray resources of ``devices`` devices of this backend on one node, as a placement
        bundle: on CPU a device is a core (a worker process); an accelerator's trial also
        holds one CPU for its launcher."""
        if self.host_devices:
            return {"CPU": devices}
        return {self.ray_resource: devices, "CPU": 1}

    def task_options(self, devices: int) -> dict:
        """``ray.remote(...).options`` asking for :meth:`resources` of ``devices``."""
        wanted = self.resources(devices)
        options = {"num_cpus": wanted.pop("CPU")}
        if "GPU" in wanted:
            options["num_gpus"] = wanted.pop("GPU")
        if wanted:
            options["resources"] = wanted
        return options

    def jit_environment(self, cache_home: str) -> dict:
        """The driver's JIT cache variables of this backend: its folder under ``cache_home``
        (the user's cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``) and its settings; none
        for a backend without one."""
        if not self.jit_cache:
            return {}
        return {self.jit_cache: f"{cache_home}/autotune/{self.name}-jit", **dict(self.jit_settings)}

    def oom_in(self, text: str) -> bool:
        """Whether ``text`` (a failed run's log lines) says it ran out of memory."""
        lowered = text.lower()
        return any(marker in lowered for marker in self.oom_markers)

    def link_failure_in(self, text: str) -> bool:
        """Whether ``text`` (a log line) says the collective library lost a peer."""
        lowered = text.lower()
        return any(marker in lowered for marker in self.link_failures)


# O2 is deprecated since MindSpore 2.9 (graph/jit_config.py: "The value "O2" of `jit_level` is
# deprecated from version 2.9.0"; JitConfig lists O0/O1 and maps O2 to the GE backend, Ascend's
# graph engine): no real backend runs it, Ascend included. It stays a known value, so studies
# that hold O2 trials still load (docs/accelerators.md).
_O2 = (
    ("O0", "O1", "pynative"),
    "O2 is deprecated since MindSpore 2.9 (it selects the GE backend, Ascend only)",
)

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        # bfloat16 on CPU: MindSpore 2.10 has no bfloat16 MatMul kernel ("Select CPU operator[MatMul]
        # fail! Unsupported data type!"), measured by tests/train/test_program.py::
        # test_bfloat16_follows_the_backend_rule, which also keeps this entry honest.
        Backend(
            "cpu",
            "program",
            ("float16", "float32"),
            {"jit_level": _O2},
            device_target="CPU",
            ray_resource="CPU",
            ray_start_flag="--num-cpus=N",
            pins_cores=True,
            default_profile="cpu",
            first_op_before_init=True,
            mindformers_cpu_form=True,
        ),
        # bfloat16 on GPU: MindSpore 2.10's GPU plugin (CUDA 11) carries no bfloat16 kernel — its
        # kernel library plugin/gpu/libcuda_ops.so.11 names `__half` (float16) instantiations 115,727
        # times and `__nv_bfloat16` none, nor does plugin/libmindspore_gpu.so.11.* (docs/accelerators.md).
        Backend(
            "gpu",
            "program",
            ("float16", "float32"),
            limits={"jit_level": _O2},
            device_target="GPU",
            ray_resource="GPU",
            no_mindformers="MindFormers supports Atlas 800T A2 (Ascend) only (its README); on GPU "
            "run autotune's trainer (launch.sh without --mindformers)",
            ray_start_flag="--num-gpus=N",
            visible_devices="CUDA_VISIBLE_DEVICES",
            device_memory=True,
            oom_markers=DEVICE_OOM,
            accelerator=True,
            memory_tool=NVIDIA_SMI,
            memory_tool_format="csv",
            pool_increase=POOL_INCREASE,
            pool_per_layout=True,
            # The GPU plugin's kernels (plugin/gpu/libcuda_ops.so.11) carry SASS for sm_60-80 and
            # PTX for compute_60/86 only, under a static pre-11.7 CUDA runtime: on Hopper every
            # fresh process JIT-compiles all 407 kernel modules at context creation unless the
            # driver's cache holds them (docs/accelerators.md, "Kernel JIT on Hopper").
            jit_cache="CUDA_CACHE_PATH",
            jit_settings=(("CUDA_CACHE_MAXSIZE", "4294967296"),),
            warm_up_per_node=True,
            # the libraries plugin/libmindspore_gpu.so.11.6 needs (readelf -d: NEEDED) but the
            # wheel does not carry: CUDA 11's runtime, cuBLAS, cuRAND, cuFFT, cuSOLVER, cuSPARSE,
            # NVRTC and cuDNN 8 (MindSpore's run_check: CUDA 11.6 with cuDNN 8.5); libcuda.so.1
            # is the driver's
            packages=(
                "nvidia-cuda-runtime-cu11",
                "nvidia-cublas-cu11",
                "nvidia-curand-cu11",
                "nvidia-cufft-cu11",
                "nvidia-cusolver-cu11",
                "nvidia-cusparse-cu11",
                "nvidia-cuda-nvrtc-cu11",
                "nvidia-cudnn-cu11>=8.5,<9",
            ),
        ),
        # Ray's registered accelerator name for Ascend is NPU; Ray sets ASCEND_RT_VISIBLE_DEVICES.
        Backend(
            "ascend",
            "program",
            limits={"jit_level": _O2},
            device_target="Ascend",
            ray_resource="NPU",
            ray_start_flag="--resources '{\"NPU\": N}'",
            visible_devices="ASCEND_RT_VISIBLE_DEVICES",
            device_memory=True,
            oom_markers=ASCEND_OOM,
            default_profile="ascend-910b",
            # The loss scaler sees an overflow through isfinite, which only INF/NaN mode makes
            # visible (saturation mode clamps to the largest finite value; MindSpore then reads
            # the chip's float-status registers instead): docs/accelerators.md.
            environment=(("MS_ASCEND_CHECK_OVERFLOW_MODE", "INFNAN_MODE"),),
            fused_attention=True,
            graph_engine=True,
            accelerator=True,
            memory_tool=NPU_SMI,
            memory_tool_format="table",
            pool_increase=POOL_INCREASE,
            empties_pool=True,
            pool_per_layout=True,
            # Only 910B and 910_93 take INFNAN mode; other chips stay in saturation mode, where
            # isfinite never sees an overflow (MindSpore's amp._all_finite reads their
            # float-status registers instead): docs/accelerators.md.
            chips=("ascend910b", "ascend910_93"),
            chip_refusal="only Ascend 910B and 910_93 run the INFNAN overflow mode this trial "
            "program's loss scaler needs (isfinite); this chip stays in saturation "
            "mode, where an overflow is clamped and never seen",
            # HCCL's host ports (CANN 8.0, HCCL_IF_BASE_PORT: 16 from 60000 by default, which
            # the OS must reserve), per trial slot of a node a block of 32: HCCL's 16 and LCCL's
            # bootstrap port (LCAL_COMM_ID "<ipv4>:<port>", liblcal_ms.so), as MindFormers' own
            # multi-job test runner gives each job both (tests/st/test_multi_cards_cases/
            # test_run_multi_cards_cases.py); 16 slots (docs/cluster.md).
            host_ports=(60000, 60511),
            slot_ports=32,
            slot_variables=(
                ("HCCL_IF_BASE_PORT", 0, "{port}"),
                ("LCAL_COMM_ID", 16, "127.0.0.1:{port}"),
            ),
            # MindSpore sets HCCL_CONNECT_TIMEOUT to 600 s when unset (context.py,
            # _init_parallel_env; CANN's own default is 120 s, its range 120-7200);
            # HCCL_EXEC_TIMEOUT is CANN's 1836 s (Atlas A2: up to 2^31 - 1): pipeline stages
            # compile different graphs and reach their first collective minutes apart
            collective_timeouts=(
                ("HCCL_CONNECT_TIMEOUT", 600, 7200),
                ("HCCL_EXEC_TIMEOUT", 1836, 2**31 - 1),
            ),
            # CANN's EI0006 "wait socket establish timeout" (a link not established within
            # HCCL_CONNECT_TIMEOUT) and EI0002 "The wait execution of the Notify register times
            # out" (a peer did not reach a collective within HCCL_EXEC_TIMEOUT)
            link_failures=(
                "ei0006",
                "ei0002",
                "socket establish timeout",
                "notify register times out",
            ),
            # CANN (driver, firmware, toolkit) is installed by the host's administrator; its
            # set_env.sh puts its libraries and Python packages where MindSpore finds them
            host_setup="source /usr/local/Ascend/ascend-toolkit/set_env.sh",
        ),
        # simulate and replay run no graph: every value is theirs (the device profile decides, and
        # the cost model rejects O2 off Ascend).
        Backend("simulate", "estimate"),
        Backend("replay", "table"),
    )
}


def backend_of(name: str) -> Backend:
    """The backend called ``name`` (a name spec validation accepted)."""
    return BACKENDS[name]


def register(backend: Backend) -> Backend:
    """Add ``backend`` to :data:`BACKENDS` under its name, from then on a ``cluster.backend``
    like the built-in ones; returns it. A name already taken, a kind other than :data:`KINDS`
    or a ``program`` backend without its device target or Ray resource is a ``ValueError``
    naming the backend."""
    if not isinstance(backend, Backend):
        raise ValueError(f"register takes a Backend, got {type(backend).__name__}")
    if backend.name in BACKENDS:
        raise ValueError(f"backend {backend.name!r} is already registered; choose another name")
    if backend.kind not in KINDS:
        raise ValueError(
            f"backend {backend.name!r}: kind must be one of {', '.join(KINDS)}, "
            f"got {backend.kind!r}"
        )
    if backend.runs_program and not (backend.device_target and backend.ray_resource):
        raise ValueError(
            f"backend {backend.name!r}: a program backend needs device_target "
            "(MindSpore's set_device) and ray_resource (what a device is to Ray)"
        )
    BACKENDS[backend.name] = backend
    return backend


def device_backends() -> tuple[Backend, ...]:
    """The backends that run on a device of their own (``program``): a device profile's
    ``kind`` is one of their names, and a simulated study's export runs on it."""
    return tuple(b for b in BACKENDS.values() if b.runs_program)


def for_device_target(target: str) -> Backend | None:
    """The first device backend whose MindSpore device target is ``target`` (any case), None
    when there is none."""
    return next((b for b in device_backends() if b.device_target.lower() == target.lower()), None)


def reserved_ports() -> list[tuple[int, int]]:
    """The host ports (first, last) some backend's collectives take."""
    return [b.host_ports for b in BACKENDS.values() if b.host_ports]
