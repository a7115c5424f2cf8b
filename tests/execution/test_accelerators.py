"""The accelerator path: what cannot run on this CPU is checked as the
calls the trial program makes and the values it passes; what can (the CPU launch order, the
refusals, the exports) is checked for real. docs/accelerators.md says which is which."""

from pathlib import Path

import pytest

from autotune.execution.classify import classify
from autotune.spec.backends import BACKENDS
from autotune.train import CANDIDATE_STARTED, LAUNCH_FAILED

# device out-of-memory lines of MindSpore 2.10 (docs/accelerators.md names where each
# string is printed)
DEVICE_OOM_LINES = [
    ("ascend", "#umsg#Framework Error Message:#umsg#Malloc device memory failed, size[4294967296]"),
    (
        "ascend",
        "[EXCEPTION] DEVICE(1,ff,python) MallocAlign32 device memory failed, size[2147483648]",
    ),
    ("ascend", "[EXCEPTION] PRE_ACT(1,ff,python) Somas allocate failed for graph 3"),
    ("gpu", "[EXCEPTION] PRE_ACT(1,7f,python) Somas allocate failed for graph 3"),
    (
        "gpu",
        "CUBLAS_STATUS_ALLOC_FAILED: Resource allocation failed inside the cuBLAS library. "
        "This is usually caused by a cudaMalloc() failure.",
    ),
]


@pytest.mark.parametrize("backend,line", DEVICE_OOM_LINES)
def test_device_oom_lines_are_oom(backend, line):
    assert BACKENDS[backend].oom_in(line), line


def _logs(tmp_path: Path, worker0: str) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text(worker0)
    (logs / "scheduler.log").write_text("scheduler\n")
    return logs


def test_an_oom_before_the_candidate_ran_is_the_launchs(tmp_path):
    """Out of device memory while joining the cluster (another process holds the device): the
    candidate never ran, so the failure is not remembered against it."""
    line = "Malloc device memory failed, size[1073741824]"
    logs = _logs(tmp_path, f"{line}\n{LAUNCH_FAILED} communication init failed: RuntimeError: x\n")
    result = classify(3, tmp_path, logs, 1.0, BACKENDS["ascend"])
    assert result.outcome == "error" and result.infrastructure, result
    assert line in result.detail


def test_an_oom_after_the_candidate_started_is_the_candidates(tmp_path):
    logs = _logs(
        tmp_path,
        f"{CANDIDATE_STARTED}: rank 0 of 2\nSomas allocate failed for graph 1\n"
        "autotune.train: RuntimeError: Somas allocate failed for graph 1\n",
    )
    result = classify(1, tmp_path, logs, 1.0, BACKENDS["ascend"])
    assert result.outcome == "oom", result


# threads of accelerator workers, msrun's cluster timeout in exports


def test_accelerator_workers_get_their_share_of_host_threads_not_rays_one(monkeypatch):
    from autotune.execution import environment as trial_env

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in a num_cpus=1 task
    monkeypatch.setattr(trial_env.os, "sched_getaffinity", lambda pid: set(range(16)))
    config = {"backend": "gpu", "model": {}}
    assert trial_env.environment({}, config, local_workers=4)["OMP_NUM_THREADS"] == "4"
    ascend = {**config, "backend": "ascend"}
    assert trial_env.environment({}, ascend, 8)["OMP_NUM_THREADS"] == "2"
    assert trial_env.environment({}, ascend, 32)["OMP_NUM_THREADS"] == "1"
    # CPU trials keep what they had (their workers are pinned to cores by msrun)
    assert trial_env.environment({}, {**config, "backend": "cpu"}, 2)["OMP_NUM_THREADS"] == "1"


def test_exported_launch_uses_msruns_default_cluster_timeout_trials_a_shorter_one():
    from autotune.train.msrun import (
        CLUSTER_TIME_OUT_S,
        MSRUN_DEFAULT_CLUSTER_TIME_OUT_S,
        msrun_args,
    )

    assert MSRUN_DEFAULT_CLUSTER_TIME_OUT_S == 600 and CLUSTER_TIME_OUT_S == 120
    assert "--cluster_time_out=120" in msrun_args(2, 2, master_port=1, log_dir="d")


# the order of a worker's first calls, the memory cap (call/value: a recording
# stand-in for the mindspore module; the CPU order runs for real in test_launch_order_msrun.py)


class _Recorder:
    """The parts of the ``mindspore`` module a trial's launch calls
    (`autotune.train.runtime.session`), recording each call in order."""

    GRAPH_MODE, PYNATIVE_MODE = 0, 1

    def __init__(self, world=2, total_gib=80.0, chip="ascend910b", fail=None):
        from types import SimpleNamespace

        self.calls = []
        record = self.calls.append
        recorder = self

        class Tensor:
            def __init__(self, *args, **kwargs):
                pass

            def reshape(self, shape):
                record(("first op",))

        self.Tensor = Tensor

        def set_device(target, *a):
            record(("set_device", target, *a))
            if fail:  # what MindSpore 2.10 says when the device's plugin cannot load
                raise RuntimeError(fail)

        self.set_device = set_device
        self.set_context = lambda **kw: record(("set_context",))
        self.runtime = SimpleNamespace(set_memory=lambda **kw: record(("set_memory", kw)))
        self.communication = SimpleNamespace(
            init=lambda *a: record(("init",)), get_group_size=lambda: world, get_rank=lambda: 0
        )
        self.get_current_device = lambda: SimpleNamespace(device_id=0)
        self.hal = SimpleNamespace(
            get_device_properties=lambda i: SimpleNamespace(total_memory=int(total_gib * 2**30))
        )
        context = SimpleNamespace(get_ascend_soc_version=lambda: chip)
        self._c_expression = SimpleNamespace(
            MSContext=SimpleNamespace(get_instance=lambda: context)
        )
        self.ParallelMode = SimpleNamespace(DATA_PARALLEL="data_parallel")
        self.set_auto_parallel_context = lambda **kw: record(("set_auto_parallel_context",))
        self.reset_auto_parallel_context = lambda: record(("reset_auto_parallel_context",))
        del recorder

    def names(self):
        return [call[0] for call in self.calls]


def _setup(cfg, ms):
    """A trial's launch as a fresh process makes it: the session, then the trial's place."""
    from autotune.train.runtime.session import open_session

    knobs = cfg["knobs"]
    open_session(cfg, knobs["dp"] * knobs["tp"] * knobs["pp"], ms).place(knobs)


def _setup_config(backend, dp=2, device_memory=None):
    cfg = {
        "backend": backend,
        "knobs": {"dp": dp, "tp": 1, "pp": 1, "jit_level": "O1", "fusion_mb": 64},
    }
    if device_memory:
        cfg["device_memory"] = device_memory
    return cfg


@pytest.mark.parametrize("backend,target", [("gpu", "GPU"), ("ascend", "Ascend")])
def test_accelerator_workers_cap_memory_and_init_before_any_op(
    backend, target, monkeypatch, capsys
):
    from autotune.train.parallel import groups as parallel

    monkeypatch.setattr(parallel, "create_groups", lambda placement, made: None)
    ms = _Recorder()
    _setup(_setup_config(backend, device_memory={"size_gb": 80.0, "max_size_gb": 72.0}), ms)
    assert ms.names()[:5] == ["set_device", "set_context", "set_memory", "init", "first op"]
    assert ms.calls[0] == ("set_device", target)  # no id: msrun hands each worker its own
    # the pool grows in 0.25 GB blocks, not MindSpore's default 2 GB
    assert ms.calls[2] == ("set_memory", {"max_size": "72GB", "increase_size": "0.25GB"})
    err = capsys.readouterr().err
    order = [
        line.split(": ", 1)[1]
        for line in err.splitlines()
        if line.startswith("autotune.train launch:")
    ]
    assert order == [
        f"set_device({target})",
        "runtime.set_memory(max_size=72GB, increase_size=0.25GB)",
        "communication.init()",
        "first op",
    ]
    assert "warning" not in err  # the device reports the profile's 80 GiB


def test_a_device_reporting_another_size_than_the_profile_is_warned(monkeypatch, capsys):
    from autotune.train.parallel import groups as parallel

    monkeypatch.setattr(parallel, "create_groups", lambda placement, made: None)
    _setup(
        _setup_config("gpu", device_memory={"size_gb": 80.0, "max_size_gb": 72.0}),
        _Recorder(total_gib=40.0),
    )
    err = capsys.readouterr().err
    assert "the device reports 40.0 GiB, the profile says 80 GiB" in err


def test_cpu_workers_keep_the_first_op_before_init_and_set_no_device_memory(monkeypatch):
    """The one exception, measured (docs/accelerators.md): on CPU an eager op after init()
    makes msrun's scheduler judge the worker timed out."""
    from autotune.spec.backends import BACKENDS
    from autotune.train.parallel import groups as parallel

    monkeypatch.setattr(parallel, "create_groups", lambda placement, made: None)
    ms = _Recorder()
    _setup(_setup_config("cpu", device_memory={"size_gb": 16, "max_size_gb": 14.4}), ms)
    assert ms.names()[:4] == ["set_device", "set_context", "first op", "init"]
    assert BACKENDS["cpu"].first_op_before_init
    assert not BACKENDS["gpu"].first_op_before_init and not BACKENDS["ascend"].first_op_before_init


def test_the_scheduler_role_serves_without_reading_the_config_or_opening_the_device(
    monkeypatch, capsys
):
    import mindspore

    from autotune.train import __main__ as entry

    ms = _Recorder()
    monkeypatch.setattr(mindspore, "set_device", ms.set_device)
    monkeypatch.setattr(mindspore, "communication", ms.communication)
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    monkeypatch.delenv("AUTOTUNE_NODE", raising=False)
    assert entry.main(["/nonexistent/config.json"]) == 0
    assert ms.calls == [("set_device", "CPU"), ("init",)]


def test_device_memory_cap_is_the_screens_budget():
    from dataclasses import replace

    from autotune.costmodel import SAFETY_MARGIN, device_memory_cap
    from autotune.spec.model_yaml import parse_spec

    spec = parse_spec(
        {
            "model": {
                "family": "transformer",
                "num_layers": 2,
                "hidden_size": 64,
                "num_heads": 4,
                "seq_length": 32,
                "vocab_size": 256,
            },
            "train": {"global_batch_size": 8},
            "cluster": {
                "backend": "gpu",
                "devices": 8,
                "devices_per_node": 8,
                "device_memory_gb": 40,
            },
        },
        Path("t.yaml"),
    )
    assert device_memory_cap(spec.cluster) == {"size_gb": 40, "max_size_gb": 40 * SAFETY_MARGIN}
    ascend = replace(spec.cluster, backend="ascend", device_memory_gb=None)
    assert device_memory_cap(ascend) == {"size_gb": 64.0, "max_size_gb": 57.6}
    assert device_memory_cap(replace(spec.cluster, backend="cpu")) is None
    # MindSpore's max_device_memory, where given, is the screen's cap: the trial's too
    capped = replace(ascend, max_device_memory_gb=58.0)
    assert device_memory_cap(capped) == {"size_gb": 64.0, "max_size_gb": 58.0}


# what a trial's memory on a device is, read per trial (a warm pool's earlier trials do not count)


class _Pool:
    """The parts of ``mindspore.runtime`` a device's memory readings call, as a GPU pool behaves:
    the reserved peak never falls back (empty_cache does nothing there), a reset restarts it at
    the pool's size."""

    def __init__(self):
        self.allocated = self.max_allocated = 0
        self.reserved = self.max_reserved = 0

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.max_allocated

    def memory_reserved(self):
        return self.reserved

    def max_memory_reserved(self):
        return self.max_reserved

    def reset_max_memory_allocated(self):
        self.max_allocated = self.allocated

    def reset_max_memory_reserved(self):
        self.max_reserved = self.reserved

    def run(self, gib):
        """A trial that allocates ``gib`` at its peak, then frees it (the pool keeps the blocks)."""
        self.max_allocated = max(self.max_allocated, self.allocated + gib * 2**30)
        self.reserved = max(self.reserved, self.allocated + gib * 2**30)
        self.max_reserved = max(self.max_reserved, self.reserved)


def _device_session(monkeypatch, tool):
    """A GPU session of one process whose runtime is a :class:`_Pool`; ``tool(pool)`` is the
    vendor tool's reading for this process (a `device_smi.Reading`)."""
    from autotune.train.parallel import groups as parallel
    from autotune.train.runtime import device_smi

    monkeypatch.setattr(parallel, "create_groups", lambda placement, made: None)
    ms = _Recorder(world=1)
    pool = ms.runtime = _Pool()
    ms.runtime.set_memory = lambda **kw: None
    monkeypatch.setattr(device_smi, "process_memory", lambda backend, pid: tool(pool))
    from autotune.train.runtime.session import open_session

    session = open_session(
        _setup_config("gpu", dp=1, device_memory={"size_gb": 80, "max_size_gb": 72}), 1, ms
    )
    return session, pool


def _trial(session, pool, gib):
    memory = session.memory
    memory.trial_starts()
    memory.reset_peak()
    pool.run(gib)
    return memory.peak()


def test_a_small_trial_after_a_big_one_in_a_warm_pool_reads_its_own_memory(monkeypatch):
    from autotune.train.runtime.device_smi import READ, Reading

    # the device holds the pool and 1 GiB outside it (the CUDA context, communicators)
    session, pool = _device_session(
        monkeypatch, lambda pool: Reading(pool.reserved / 2**20 + 1024, READ)
    )
    big = _trial(session, pool, 6)
    small = _trial(session, pool, 1)
    assert big["peak"] == 6 * 1024 + 1024 and big["overhead"] == 1024
    # the reserved peak and the tool still read the big trial's 6 GiB (+1): the small trial's
    # own figure is its 1 GiB and the session's overhead, measured at the first trial
    assert small["reserved"] == 6 * 1024 and small["smi"] == 7 * 1024
    assert small["peak"] == 1024 + 1024, small
    assert small["overhead_seen"] == READ


def test_a_process_the_vendor_tool_does_not_list_is_recorded_as_not_seen(monkeypatch):
    from autotune.train.runtime.device_smi import NOT_LISTED, Reading

    session, pool = _device_session(monkeypatch, lambda pool: Reading(None, NOT_LISTED))
    held = _trial(session, pool, 2)
    assert held["peak"] == 2048 and held["overhead"] == 0.0
    assert held["smi"] is None and held["smi_seen"] == NOT_LISTED == held["overhead_seen"]


def test_the_vendor_tool_listing_host_pids_only_is_not_listed_not_missing(tmp_path, monkeypatch):
    """In a container nvidia-smi lists the host's PIDs: the worker's own pid is never among them.
    The reading says so (``not listed``) instead of reading like a host without the tool."""
    import os
    import stat

    from autotune.train.runtime import device_smi

    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho '777001, 30912'\necho '777002, 1000'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpu = BACKENDS["gpu"]
    assert device_smi.process_memory(gpu, 777001) == device_smi.Reading(30912.0, device_smi.READ)
    assert device_smi.process_memory(gpu, os.getpid()).seen == device_smi.NOT_LISTED
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert device_smi.process_memory(gpu, 777001) == device_smi.Reading(None, device_smi.NO_TOOL)


def test_vendor_tools_per_process_readings_are_parsed():
    from autotune.train.runtime.device_smi import parse_npu_smi, parse_nvidia_smi

    assert parse_nvidia_smi("4242, 10240\n77, 5\n4242, 100\n", 4242) == 10340.0
    assert parse_nvidia_smi("No running processes found\n", 4242) is None
    npu = (
        "+---------------------------+---------------+----------------------------------------------------+\n"
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n"
        "+===========================+===============+====================================================+\n"
        "| 0       0                 | 4242          | python                   | 30912                   |\n"
        "| 1       0                 | 99            | python                   | 1000                    |\n"
    )
    assert parse_npu_smi(npu, 4242) == 30912.0
    assert parse_npu_smi(npu, 5) is None


# bfloat16 is refused on gpu as on cpu


def _gpu_spec_text(dtype):
    return {
        "model": {
            "family": "transformer",
            "num_layers": 2,
            "hidden_size": 64,
            "num_heads": 4,
            "seq_length": 32,
            "vocab_size": 256,
            "dtype": dtype,
            "param_dtype": "float32",
        },
        "train": {"global_batch_size": 8},
        "cluster": {"backend": "gpu", "devices": 8, "devices_per_node": 8},
    }


def test_bfloat16_on_gpu_is_refused_at_validation_naming_the_field():
    from autotune.spec.errors import SpecError
    from autotune.spec.model_yaml import parse_spec

    with pytest.raises(SpecError, match=r"model\.dtype: bfloat16 does not run on backend gpu"):
        parse_spec(_gpu_spec_text("bfloat16"), Path("m.yaml"))
    parse_spec(_gpu_spec_text("float16"), Path("m.yaml"))  # float16 still runs
    assert "bfloat16" in BACKENDS["ascend"].compute_dtypes


def test_the_gpu_plugin_has_no_bfloat16_kernel():
    """What keeps the gpu entry honest: the installed wheel's CUDA kernels (read as bytes)."""
    import mindspore

    plugin = Path(mindspore.__file__).parent / "lib" / "plugin"
    libraries = sorted(plugin.glob("gpu/libcuda_ops.so*"))  # the GPU plugin's CUDA kernels
    if not libraries:
        pytest.skip("this MindSpore wheel carries no GPU plugin")
    data = libraries[0].read_bytes()
    assert b"nv_bfloat16" not in data and b"6__half" in data  # float16 kernels, no bfloat16


# jit_level O2 (deprecated since 2.9) leaves the search and the exports


def _spec(backend="ascend", dtype="float32", **cluster):
    from autotune.spec.model_yaml import parse_spec

    return parse_spec(
        {
            "model": {
                "family": "transformer",
                "num_layers": 2,
                "hidden_size": 64,
                "num_heads": 4,
                "seq_length": 32,
                "vocab_size": 256,
                "dtype": dtype,
            },
            "train": {"global_batch_size": 8},
            "cluster": {"backend": backend, "devices": 8, "devices_per_node": 8, **cluster},
        },
        Path("t.yaml"),
    )


def test_o2_is_not_searched_even_on_ascend_and_a_space_asking_for_it_is_told_why():
    from autotune.spec.space import build_space

    space = build_space(_spec("ascend"))
    assert "O2" not in space.domains["jit_level"] and "O1" in space.domains["jit_level"]
    asked = build_space(_spec("ascend"), {"jit_level": ["O1", "O2"]})
    assert list(asked.domains["jit_level"]) == ["O1"]
    assert any("O2" in note and "deprecated since MindSpore 2.9" in note for note in asked.notes)


def test_an_o2_trial_of_an_old_study_is_not_exported(tmp_path):
    from autotune.export import write_export
    from autotune.spec.candidate import Candidate
    from autotune.spec.errors import SpecError

    spec = _spec("simulate", device="ascend-910b")
    trial = {"number": 3, "study": "old", "metrics": {}}
    with pytest.raises(
        SpecError, match="jit_level = O2 on ascend: O2 is deprecated since MindSpore 2.9"
    ):
        write_export(
            spec, Candidate(8, 1, 1, 1, 64, 1, 2**16, 0, "O2", "none"), trial, tmp_path / "o"
        )


# no MindFormers export for gpu; Ascend's overflow mode is the one isfinite sees

_TRIAL = {"number": 1, "study": "s", "metrics": {}}


def _candidate(jit="O1"):
    from autotune.spec.candidate import Candidate

    return Candidate(8, 1, 1, 1, 64, 1, 2**16, 0, jit, "none")


def test_a_mindformers_export_for_gpu_is_refused_naming_the_reason(tmp_path):
    import subprocess

    from autotune.export import write_export
    from autotune.spec.errors import SpecError

    spec = _spec("simulate", dtype="float16", device="a100-80g")
    base = Path(__file__).parents[1] / "fixtures" / "mindformers" / "pretrain_llama2_7b.yaml"
    with pytest.raises(SpecError, match=r"--mindformers-base: MindFormers supports Atlas 800T A2"):
        write_export(spec, _candidate(), _TRIAL, tmp_path / "refused", mindformers_base=str(base))
    out = tmp_path / "gpu"
    write_export(spec, _candidate(), _TRIAL, out)
    assert not (out / "mindformers.yaml").exists() and (out / "launch.sh").exists()
    (tmp_path / "mf").mkdir()
    (tmp_path / "mf" / "run_mindformer.py").write_text("")
    run = subprocess.run(
        ["bash", str(out / "launch.sh"), "--mindformers", str(tmp_path / "mf")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "MindFormers supports Atlas 800T A2 (Ascend) only" in run.stderr


def test_ascend_trials_and_exports_run_in_infnan_overflow_mode(tmp_path, monkeypatch):
    from autotune.execution.environment import environment
    from autotune.export import write_export

    monkeypatch.setenv("MS_ASCEND_CHECK_OVERFLOW_MODE", "SATURATION_MODE")  # a cluster's profile
    env = environment({}, {"backend": "ascend", "model": {}}, 8)
    assert env["MS_ASCEND_CHECK_OVERFLOW_MODE"] == "INFNAN_MODE"
    out = tmp_path / "ascend"
    write_export(_spec("simulate", device="ascend-910b"), _candidate(), _TRIAL, out)
    assert "\nexport MS_ASCEND_CHECK_OVERFLOW_MODE=INFNAN_MODE\n" in (out / "launch.sh").read_text()
    assert (out / "mindformers.yaml").exists()
    gpu = tmp_path / "gpu"
    write_export(_spec("simulate", device="a100-80g"), _candidate(), _TRIAL, gpu)
    assert "MS_ASCEND_CHECK_OVERFLOW_MODE" not in (gpu / "launch.sh").read_text()


# Ascend 910B links by group size, comm_overlap below 1, Hopper profiles flagged


def test_ascend_910b_groups_are_priced_by_the_links_they_have():
    from autotune.costmodel.profiles import PROFILES

    ascend = PROFILES["ascend-910b"]
    assert [ascend.group_gbps(n) for n in (2, 4, 8)] == [28.0, 84.0, 196.0]
    assert PROFILES["a100-80g"].group_gbps(2) == PROFILES["a100-80g"].intra_node_gbps  # a switch


def test_a_two_npu_data_parallel_all_reduce_costs_more_than_the_eight_npu_rate_says():
    from dataclasses import replace

    from autotune import costmodel
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import parse_spec

    spec = parse_spec(
        {
            "model": {
                "family": "transformer",
                "num_layers": 8,
                "hidden_size": 2048,
                "num_heads": 16,
                "seq_length": 512,
                "vocab_size": 32000,
            },
            "train": {"global_batch_size": 8},
            "cluster": {
                "backend": "simulate",
                "devices": 2,
                "devices_per_node": 8,
                "device": "ascend-910b",
            },
        },
        Path("t.yaml"),
    )
    c = Candidate(2, 1, 1, 1, 64, 1, 2**16, 0, "O1", "none")
    priced = costmodel.estimate(spec, c).breakdown["time_s"]["dp_comm"]
    flat = replace(
        spec, cluster=replace(spec.cluster, device={"base": "ascend-910b", "mesh_link_gbps": 0})
    )
    assert priced > 5 * costmodel.estimate(flat, c).breakdown["time_s"]["dp_comm"]  # 196 / 28 = 7


def test_accelerators_start_from_half_overlap_and_hopper_profiles_say_calibrate_first():
    from autotune.costmodel.profiles import PROFILES

    assert {p.comm_overlap for p in PROFILES.values()} == {0.5}
    # Hopper's kernels that MindSpore's GPU plugin lacks; the 910B's efficiency, fitted on three
    # published runs of other models
    for name in ("h100-80g", "h200", "ascend-910b"):
        assert PROFILES[name].caveat.startswith("calibrate first")
    assert "three published MindFormers Llama 2 runs" in PROFILES["ascend-910b"].caveat
    assert PROFILES["a100-80g"].caveat == ""


def test_estimate_on_a_hopper_profile_says_calibrate_first(tmp_path, capsys):
    from autotune.cli import main

    model = tmp_path / "m.yaml"
    model.write_text(
        "model: {family: transformer, num_layers: 2, hidden_size: 64, num_heads: 4,\n"
        "        seq_length: 32, vocab_size: 256}\n"
        "train: {global_batch_size: 8}\n"
        "cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: h100-80g}\n"
    )
    assert main(["estimate", str(model)]) == 0
    assert "note: calibrate first" in capsys.readouterr().out


def test_the_memory_settings_are_sizes_mindspore_accepts():
    import re

    from mindspore.runtime import memory

    from autotune.train.runtime.device_memory import memory_settings

    for size in (57.6, 72.0, 14.4, 0.5):
        settings = memory_settings(
            {"device_memory": {"size_gb": size / 0.9, "max_size_gb": size}}, BACKENDS["ascend"]
        )
        for value in settings.values():  # max_size and increase_size
            assert re.fullmatch(memory._MEMORY_PATTERN, value), value
    assert (
        memory_settings({"device_memory": {"size_gb": 16, "max_size_gb": 14.4}}, BACKENDS["cpu"])
        is None
    )
