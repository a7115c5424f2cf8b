"""What the first real GPU/Ascend run would hit, checked on this CPU as calls made, values
passed and how failures are classified, and for real where the CPU can run it: a trial whose
device plugin cannot load (this wheel's GPU plugin, without CUDA here) is the infrastructure's,
retried once, not remembered, and a study of nothing else stops in one line.
docs/accelerators.md, "The first real run", says what each check is and where MindSpore says so.
"""

import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.spec.backends import BACKENDS, reserved_ports
from tests.execution.test_accelerators import _Recorder, _setup_config  # noqa: E402
from tests.study.test_loop import study_files  # noqa: E402

UNSUPPORTED = (
    "Unsupported device target GPU. This process only supports one of the ['CPU']. "
    "Please check whether the GPU environment is installed and configured correctly"
)


# the device's bring-up is the launch's


@pytest.mark.parametrize("world", [1, 2])
def test_a_device_that_does_not_come_up_is_the_launchs_failure(world):
    from autotune.train.runtime.session import LaunchError, open_session

    cfg = _setup_config("gpu", dp=world, device_memory={"size_gb": 80, "max_size_gb": 72})
    with pytest.raises(LaunchError, match=r"set_device\(GPU\) failed: RuntimeError: Unsupported"):
        open_session(cfg, world, _Recorder(world=world, fail=UNSUPPORTED))


def test_a_process_group_that_cannot_be_made_is_the_launchs_failure(monkeypatch):
    from autotune.train.parallel import groups as parallel
    from autotune.train.runtime.session import LaunchError, open_session

    def refuse(placement, made):
        raise RuntimeError("HCCL create communicator failed")

    monkeypatch.setattr(parallel, "create_groups", refuse)
    cfg = _setup_config("ascend", dp=1)
    cfg["knobs"].update(tp=2)
    session = open_session(cfg, 2, _Recorder(world=2))
    with pytest.raises(LaunchError, match="create_group.*failed: RuntimeError: HCCL create"):
        session.place(cfg["knobs"])


def _gpu_config(tmp_path):
    cfg = {
        "study": "g",
        "trial_number": 0,
        "backend": "gpu",
        "seed": 0,
        "out_dir": str(tmp_path / "t"),
        "model": {
            "family": "mlp",
            "entry": None,
            "num_layers": 1,
            "hidden_size": 16,
            "num_heads": 1,
            "ffn_hidden_size": 32,
            "seq_length": 1,
            "vocab_size": 8,
            "dtype": "float32",
        },
        "train": {"global_batch_size": 4, "learning_rate": 0.01, "total_steps": 100},
        "trial": {"steps": 4, "measure_after": 1},
        "knobs": {
            "dp": 1,
            "tp": 1,
            "pp": 1,
            "micro_batches": 1,
            "fusion_mb": 64,
            "grad_accum": 1,
            "loss_scale": 1024,
            "warmup_steps": 0,
            "jit_level": "O1",
            "recompute": "none",
        },
    }
    return cfg


def test_a_trial_whose_gpu_plugin_cannot_load_is_the_infrastructures(tmp_path, monkeypatch):
    """The real trial program, backend gpu, on this wheel without CUDA: set_device fails."""
    from autotune.execution.runner import run_trial

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the JIT cache's folder
    result = run_trial(_gpu_config(tmp_path), tmp_path / "t", 120, None, 1)
    assert result.outcome == "error" and result.infrastructure, result.detail[:2000]
    first = result.detail.splitlines()[0]
    assert first.startswith(
        "infrastructure: exit code 3, before the candidate ran: "
        "autotune.train: LaunchError: set_device(GPU) failed: RuntimeError: "
        "Unsupported device target GPU"
    ), first
    log = (tmp_path / "t" / "logs" / "worker_0.log").read_text()
    assert "\nwarm-up: failed after" in log  # the node's warm-up ran first, and said so


def test_a_study_whose_every_trial_fails_by_infrastructure_stops_in_one_line(tmp_path, capsys):
    """Every candidate's launch fails (a replay table of infrastructure failures): the first
    trials (three side by side, as the pool holds them) fail, the first one's retry fails too,
    and the study stops there with one line instead of running its 6 trials' worth of identical
    failures; nothing is remembered against a candidate (the other two retries stay queued: a
    resume runs them)."""
    failing = [("error", True)] * 4
    path, storage = study_files(tmp_path, {1: failing, 2: failing, 4: failing})
    from autotune.cli import main

    assert main(["search", path, "--storage", storage, "--no-confirm", "--trials", "6"]) == 0
    out = capsys.readouterr().out
    stops = [line for line in out.splitlines() if "failed before their candidate ran" in line]
    assert len(stops) == 1, out
    assert "all 4 runs of this session" in stops[0] and "the last: replayed error" in stops[0]
    trials = optuna.load_study(study_name="loop", storage=storage).trials
    ran = [t for t in trials if t.state.is_finished()]
    assert len(ran) == 4 and ran[3].user_attrs["retry_of"] == 0
    assert all(t.user_attrs["infrastructure"] for t in ran)
    assert [t.user_attrs["retry_of"] for t in trials if not t.state.is_finished()] == [1, 2]
    assert "outcomes: error 4, queued to run again 2" in out


# a warm pool on an accelerator runs one layout


def _pool_config(backend, dp, tp, pp=1):
    return {"backend": backend, "knobs": {"dp": dp, "tp": tp, "pp": pp}}


@pytest.mark.parametrize("backend", ["gpu", "ascend"])
def test_a_warm_pool_on_an_accelerator_retires_before_another_layout(tmp_path, backend):
    from autotune.execution.warm import WarmPool

    pool = WarmPool(tmp_path, 8)
    pool.size_mb, pool.layout = 1000.0, (8, 1, 1)
    assert pool.retire_for(_pool_config(backend, 8, 1), 1000.0) == ""
    reason = pool.retire_for(_pool_config(backend, 1, 8), 1000.0)
    assert "dp·tp·pp = 8·1·1, this trial is 1·8·1" in reason and "outside the pool" in reason
    # on CPU the process groups are the host's: one pool runs every layout of a size
    assert pool.retire_for(_pool_config("cpu", 1, 8), 1000.0) == ""


# a trial's own device memory is checked in tests/execution/test_accelerators.py (the peaks
# per trial, the smi reading's visibility, the pool's increase size)

# the compile cache stores and places every file of a graph, Ascend's backend half too

ASCEND_FILES = {
    "MS_WORKERcompile_cache_{i}.mindir": b"front",
    "MS_WORKERbackend_compile_cache_{i}.mindir": b"kernel graph",
    "MS_WORKERbackend_compile_cache_{i}.json": b"{}",
    "MS_WORKERbackend_compile_cache_{i}_backinfo.json": b'{"ids": 1}',
}


def test_the_compile_cache_keeps_the_ascend_backends_files_of_a_graph(tmp_path, monkeypatch):
    """What MindSpore's Ascend backend writes for graph i beside the front end's MindIR
    (kernel_graph_mgr.cc, CacheKernelGraph) is stored with it and placed back with it: without
    ``_backinfo.json`` every hit logs an ERROR and compiles the backend again."""
    import os

    from autotune.train.runtime.compile_cache import GraphCache

    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    cfg = json.loads(json.dumps(_gpu_config(tmp_path)))

    class Cell:
        pass

    first = GraphCache(str(tmp_path / "cache"), 0)
    os.makedirs(first.slot_dir)
    first.trial(cfg)
    first.hold_next()
    entry, placed = first.before(Cell(), ())
    for name, data in ASCEND_FILES.items():  # the graph compiled: MindSpore wrote its files
        (Path(first.slot_dir) / name.format(i=0)).write_bytes(data)
    first.after(entry, placed)
    assert first.stores == 1
    assert sorted(os.listdir(entry)) == sorted(name.format(i="@") for name in ASCEND_FILES)

    later = GraphCache(str(tmp_path / "cache"), 0)  # another process, two graphs in already
    later.slot_dir = later.slot_dir.replace(later.slot_root, later.slot_root + "-later")
    os.makedirs(later.slot_dir)
    later.compiled = 2
    later.trial(cfg)
    later.hold_next()
    _, placed = later.before(Cell(), ())
    assert sorted(placed) == sorted(name.format(i=2) for name in ASCEND_FILES)
    assert (
        Path(later.slot_dir) / "MS_WORKERbackend_compile_cache_2_backinfo.json"
    ).read_bytes() == b'{"ids": 1}'
    later.after(entry, placed)
    assert later.hits == 1 and later.stores == 0


# the driver's JIT cache, one warm-up per node outside the trial's clock


def test_gpu_trials_get_a_persistent_jit_cache_large_enough_for_every_kernel(tmp_path, monkeypatch):
    from autotune.execution import environment as trial_env

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)
    monkeypatch.delenv("CUDA_CACHE_MAXSIZE", raising=False)
    env = trial_env.environment({}, {"backend": "gpu", "model": {}}, 8)
    assert env["CUDA_CACHE_PATH"] == f"{tmp_path}/cache/autotune/gpu-jit"
    assert Path(env["CUDA_CACHE_PATH"]).is_dir()
    assert env["CUDA_CACHE_MAXSIZE"] == "4294967296"  # the driver's maximum, 4 GiB
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "mine"))  # a user's own is kept
    assert trial_env.environment({}, {"backend": "gpu", "model": {}}, 8)["CUDA_CACHE_PATH"] == str(
        tmp_path / "mine"
    )
    monkeypatch.delenv("CUDA_CACHE_PATH")
    assert "CUDA_CACHE_PATH" not in trial_env.environment({}, {"backend": "ascend", "model": {}}, 8)


def test_a_node_warms_up_once_with_a_real_first_op(tmp_path, monkeypatch):
    """The warm-up is the real trial program's (``--warm-up``), here on CPU through a copy of the
    cpu backend that asks for it; a node whose marker is there is not warmed again."""
    from autotune.execution import environment as trial_env
    from autotune.execution import warmup

    cpu = replace(BACKENDS["cpu"], warm_up_per_node=True, jit_cache="AUTOTUNE_TEST_JIT")
    monkeypatch.setitem(BACKENDS, "cpu", cpu)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = trial_env.environment({}, {"backend": "cpu", "model": {}}, 1)
    said = warmup.warm_up(cpu, env, str(trial_env.PROJECT_ROOT))
    assert said.startswith("warm-up: autotune.train warm-up: first op on CPU in "), said
    assert list((tmp_path / "cache" / "autotune" / "cpu-jit").glob(f"{warmup.MARKER}*"))
    assert warmup.warm_up(cpu, env, str(trial_env.PROJECT_ROOT)).startswith(
        "warm-up: this node's JIT cache is warm"
    )


def test_the_gpu_plugin_carries_no_hopper_code():
    """What keeps the gpu entry's JIT cache and warm-up honest: the installed wheel's CUDA kernel
    modules (their fat binaries, read as the device check reads them) hold SASS for sm_60–80 and
    PTX for compute_60/86 only, so an H100 (sm_90) JIT-compiles every module."""
    import mindspore

    from autotune.execution.warmup import kernel_targets

    libraries = sorted(
        (Path(mindspore.__file__).parent / "lib" / "plugin").glob("gpu/libcuda_ops.so*")
    )
    if not libraries:
        pytest.skip("this MindSpore wheel carries no GPU plugin")
    modules, targets = kernel_targets(libraries[0])
    assert modules == 407
    assert targets == {"sass": [60, 61, 70, 75, 80], "ptx": [60, 86]}


# Ascend chips, HCCL's host ports, a world of one warned about its device size


def test_an_ascend_chip_that_stays_in_saturation_mode_is_refused_with_the_reason(monkeypatch):
    from autotune.train.parallel import groups as parallel
    from autotune.train.runtime.session import LaunchError, open_session

    monkeypatch.setattr(parallel, "create_groups", lambda placement, made: None)
    with pytest.raises(LaunchError, match="chip 'ascend910'.*saturation mode"):
        open_session(_setup_config("ascend"), 2, _Recorder(chip="ascend910"))
    for chip in ("ascend910b", "ascend910_93"):
        open_session(_setup_config("ascend"), 2, _Recorder(chip=chip))
    open_session(_setup_config("gpu"), 2, _Recorder(chip=""))  # no chip list: any


def test_msrun_is_never_handed_hccls_host_ports(monkeypatch):
    from autotune.execution import nodes

    offered = iter([60000, 60017, 60031, 60511, 45123])  # HCCL's and LCCL's slots (16 × 32)

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(nodes.socket, "socket", Socket)
    assert nodes.free_port() == 45123
    assert (60000, 60511) in reserved_ports()


def test_a_world_of_one_is_warned_about_a_device_of_another_size(monkeypatch, capsys):
    from autotune.train.runtime.session import open_session

    open_session(
        _setup_config("gpu", dp=1, device_memory={"size_gb": 80.0, "max_size_gb": 72.0}),
        1,
        _Recorder(world=1, total_gib=40.0),
    )
    assert "the device reports 40.0 GiB, the profile says 80 GiB" in capsys.readouterr().err


# the device check, as far as a CPU can take it (what it would install and run, in order)


def _dry_run(*args) -> list[tuple[str, str]]:
    import subprocess

    script = Path(__file__).parents[2] / "benchmarks" / "device_check.sh"
    done = subprocess.run(
        ["bash", str(script), *args, "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(line[1:].split("] ", 1)) for line in done.stdout.splitlines()]


def test_the_device_check_dry_run_says_what_it_would_do_in_order():
    steps = _dry_run("gpu", "--devices", "8")
    names = [name for name, _ in steps]
    assert names == [
        "0 autotune",
        "1 install",
        "2 kernels",
        "3 first op cold",
        "3 first op warm",
        "4 memory",
        "5 fresh 1/2",
        "5 fresh 2/2",
        "6 warm 1/4",
        "6 warm 2/4",
        "6 warm 3/4",
        "6 warm 4/4",
        "7 hidden",
        "8 mindformers",
        "9 mindformers mcore",
        "10 mindformers moe",
    ]
    said = dict(steps)
    assert said["0 autotune"].endswith(" install") and said["0 autotune"].startswith("make -C ")
    assert "-m pip install" in said["1 install"]
    for package in BACKENDS["gpu"].packages:  # the CUDA 11 libraries the GPU plugin links
        assert package in said["1 install"]
    assert said["2 kernels"].startswith("nvidia-smi --query-gpu=name,compute_cap")
    assert said["3 first op cold"].startswith("CUDA_CACHE_PATH=")
    assert said["3 first op cold"].endswith("-m autotune.train --warm-up gpu")
    assert said["4 memory"].endswith("--memory-probe gpu")
    for name in names[6:12]:  # the quickstart's baseline layout throughout: one warm pool
        assert "dp=8 tp=1 pp=1" in said[name]
    assert all(said[n].endswith("(one warm pool)") for n in names[8:12])
    assert said["7 hidden"].startswith("LD_LIBRARY_PATH=") and "dp=1 tp=1 pp=1" in said["7 hidden"]
    assert said["8 mindformers"].startswith("skipped: MindFormers supports")  # not on GPU
    assert said["9 mindformers mcore"] == said["8 mindformers"]
    assert said["10 mindformers moe"] == said["8 mindformers"]
    ascend = dict(_dry_run("ascend", "--devices", "2"))
    assert "2 kernels" not in ascend
    for tp, dp in ((1, 2), (2, 1)):  # MindFormers' semi-auto parallel, which no CPU runs
        assert (
            f"dp={dp} tp={tp} (autotune search, trial.program mindformers"
            in ascend[f"8 mindformers tp{tp}"]
        )
    assert ascend["8 mindformers tp2·pp2"] == "skipped: a tp2·pp2 trial needs --devices 4"
    for tp, dp in ((1, 2), (2, 1)):  # the mcore Qwen3, which MindFormers cannot train on a CPU
        assert (
            f"tiny mcore Qwen3, dp={dp} tp={tp} (autotune search"
            in ascend[f"9 mindformers mcore tp{tp}"]
        )
    for tp, dp, ep, label in (
        (1, 2, 1, "dp2"),
        (1, 2, 2, "dp2·ep2"),
        (2, 1, 1, "tp2"),
        (2, 1, 2, "tp2·ep2"),
    ):
        # experts split over the devices: MindFormers' semi-auto parallel and all-to-all dispatch
        assert (
            f"tiny mcore Qwen3-MoE (4 experts, 2 per token), dp={dp} tp={tp} ep={ep} (autotune"
            in ascend[f"10 mindformers moe {label}"]
        )
    one = dict(_dry_run("ascend", "--devices", "1"))
    assert one["10 mindformers moe"] == "skipped: a dp2·ep2 trial needs --devices 2 or more"
    four = _dry_run("ascend", "--devices", "4")
    names = [name for name, _ in four if name.startswith("8 mindformers")]
    assert names[-2:] == ["8 mindformers tp2·pp2 1/2", "8 mindformers tp2·pp2 2/2"]
    said = dict(four)
    assert "dp=1 tp=2 pp=2 micro_batches=4 (fills its compile cache)" in said[names[-2]]
    assert said[names[-1]].endswith("(loads the first's graphs)")
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in ascend["1 install"]


def test_the_device_checks_pipeline_run_prints_what_to_compare(tmp_path):
    """Step 8's tp2·pp2 line on a constructed trial of 4 ranks: the last rank's recorded sum of 4
    micro-batches ÷ 4 beside the loss MindFormers' monitor printed on that rank (its log as the
    recorded CPU run has it), stage 0's output, the peak's parts beside npu-smi's reading, the
    first step and the compile cache's files."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    trial = tmp_path / "trial"
    (trial / "logs").mkdir(parents=True)
    shutil.copy(
        root / "tests/fixtures/mindformers_trial/overflow/logs/worker_0.log",
        trial / "logs" / "worker_3.log",
    )  # MFLossMonitor's step 1: loss:[4.854959/…
    (trial / "config.json").write_text(json.dumps({"mindformers": {"loss_divisor": 4}}))
    (trial / "steps.rank3.jsonl").write_text(json.dumps({"loss": 19.419836}) + "\n")
    (trial / "steps.rank0.jsonl").write_text(json.dumps({"loss": 0.0}) + "\n")
    smi = "| 0       0                 | 77            | python                   | 3000   |\n"
    summary = {"pid": 77, "device_allocated_mb": 1000.0, "device_reserved_now_mb": 2048.0}
    (trial / "metrics.rank3.json").write_text(json.dumps({**summary, "device_smi": smi}))
    cache = tmp_path / "cache"
    (cache / "rank_3").mkdir(parents=True)
    for name in ("a.mindir", "b.mindir", "c.json"):
        (cache / "rank_3" / name).write_text("x")
    metrics = {"loss_first": 19.419836 / 4, "peak_memory_mb": 1952.0, "first_step_s": 12.0}
    code = (
        "import sys, json; from pathlib import Path; sys.path[:0] = sys.argv[1:3]; "
        "import device_check_mindformers as d; "
        "print(d.comparison(Path(sys.argv[3]), 4, json.loads(sys.argv[4]), Path(sys.argv[5])))"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(root / "benchmarks"),
            str(root),
            str(trial),
            json.dumps(metrics),
            str(cache),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "loss: rank 3 19.419836 ÷ 4 = 4.854959, MindFormers printed 4.854959" in line, line
    assert "rank 0 (stage 0) 0.0" in line
    assert (
        "peak 1952 MB = allocated 1000 + overhead 952, npu-smi 3000 MB (pool reserved 2048)" in line
    )
    assert line.endswith("first step 12.0 s; compile cache 3 files")


def test_step_10s_line_reads_the_goodput_and_the_routers_loss(tmp_path):
    """A trial folder as a MindFormers run leaves it: the line carries the trial's own line, its
    goodput against the ep1 trial's, and the load-balancing loss MFLossMonitor printed (its
    print_separate_loss format, callback.py) on the last rank; a failed trial's line is its own,
    a log without the loss says so (run in a process of its own: no test imports a benchmark)."""
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "worker_1.log"
    log.write_text(
        "{ Epoch:[  1/ 40], step:[    1/   10], loss:[4.158883/4.158883], lm_loss: 4.158000, "
        "load_balancing_loss: 0.002012, per_step_time: 812ms, lr: 0.001, overflow cond: False\n"
    )
    code = (
        "import sys; from pathlib import Path; sys.path[:0] = sys.argv[1:3]; "
        "import device_check_mindformers as d; from autotune.jobs import Result; "
        "folder = Path(sys.argv[3]); ok = Result('ok', {'goodput': 30.0}); "
        "print(d.moe_line(ok, folder, 2, 40.0, lambda r, f: 'ok step 9.0 ms')); "
        "print(d.moe_line(Result('infeasible'), folder, 2, 40.0, lambda r, f: 'infeasible: x')); "
        "Path(sys.argv[4]).write_text('no monitor line'); "
        "print(d.moe_line(ok, folder, 2, None, lambda r, f: 'ok'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(root / "benchmarks"), str(root), str(tmp_path), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ok step 9.0 ms; goodput 30.0 samples/s (÷ ep1's 0.75); load_balancing_loss 0.002012",
        "infeasible: x",
        "ok; goodput 30.0 samples/s; load_balancing_loss not printed",
    ]
