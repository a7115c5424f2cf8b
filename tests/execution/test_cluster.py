"""Scale-out on this machine: a Ray cluster of two nodes (two `ray start`s on loopback, one CPU
each), trials that span both as one msrun per node, a node lost mid-trial, and backends whose
devices the cluster lacks."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import autotune
from autotune.execution.runner import free_port, run_trial
from tests.conftest import TINY_GPT_MODEL, stop_cluster

# multi-process proofs: make test-slow
pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))

SPANNING = (
    "study: span\n"
    + TINY_GPT_MODEL
    + """\
cluster: {backend: cpu, devices: 2, devices_per_node: 1, device_memory_gb: 8}
search:
  space: {tp: [1, 2], pp: 1, fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0,
          jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 2
  objectives: [goodput, final_loss]  # two objectives: no pruner stops the slower tp trial
trial: {steps: 8, measure_after: 2, timeout_s: 240}
"""
)


def ray_env() -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # "0" refuses a second node
    return env


def start_node(temp: str, head_port: int, head: bool, *resources: str) -> None:
    """One Ray node with one CPU on a loopback address of its own (127.0.0.2 the head, 127.0.0.3
    the other: given 127.0.0.1, Ray would move a multi-node cluster onto the host's public
    address), every port of its own (two nodes share a host)."""
    ports = [
        f"--{name}-port={free_port()}"
        for name in (
            "node-manager",
            "object-manager",
            "dashboard-agent-listen",
            "dashboard-agent-grpc",
            "runtime-env-agent",
            "metrics-export",
        )
    ]
    role = (
        [
            "--head",
            f"--port={head_port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
        ]
        if head
        else [f"--address=127.0.0.2:{head_port}"]
    )
    started = subprocess.run(
        [
            RAY,
            "start",
            *role,
            "--num-cpus=1",
            f"--node-ip-address=127.0.0.{2 if head else 3}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
            *ports,
            *resources,
        ],
        capture_output=True,
        text=True,
        env=ray_env(),
        start_new_session=True,
    )
    assert started.returncode == 0, started.stderr[-2000:]


def cluster_of_two(head_resources):
    """A head and a second node, each one CPU; yields (address, [head temp, node temp])."""
    port = free_port()
    # short folders: Ray's socket paths must fit in 107 bytes
    temps = [tempfile.mkdtemp(prefix="rayh-"), tempfile.mkdtemp(prefix="rayn-")]
    try:
        start_node(temps[0], port, True, *head_resources)
        start_node(temps[1], port, False)
        yield f"127.0.0.2:{port}", temps
    finally:
        for temp in reversed(temps):
            stop_cluster(temp)
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_nodes():
    """Two nodes of one CPU, the head also saying it has one GPU and one NPU, for every test of
    this module (a Ray node takes seconds to start); the last test kills the second node."""
    yield from cluster_of_two(("--num-gpus=1", '--resources={"NPU": 1}'))


def search(tmp_path, text, address, *extra, env=None):
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(text))
    argv = [
        AUTOTUNE,
        "search",
        str(path),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "--artifacts",
        str(tmp_path / "art"),
        "--no-confirm",
        *extra,
    ]
    if address:
        argv += ["--ray-address", address]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ray_env()
    )


def finish(proc, timeout_s: float) -> tuple[str, str]:
    """The driver's output once it exits; killed (and the test failed) past ``timeout_s``."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the driver did not exit within {timeout_s} s: {err[-3000:]}")


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "steps.jsonl").read_text().splitlines()]


def test_a_trial_larger_than_a_node_runs_as_one_msrun_per_node(tmp_path, shared_nodes):
    address, _ = shared_nodes
    proc = search(tmp_path, SPANNING, address, "--sampler", "grid")
    out, err = finish(proc, 600)
    assert proc.returncode == 0, err[-3000:]
    frame = autotune.trials_frame("span", f"sqlite:///{tmp_path}/s.db").set_index("tp")
    assert list(frame["outcome"]) == ["ok", "ok"], frame["detail"].tolist()
    assert frame.loc[1, "dp"] == 2 and frame.loc[2, "dp"] == 1
    for tp in (1, 2):
        folder = tmp_path / "art" / "span" / str(frame.loc[tp, "number"])
        # one msrun per node: node 0 holds rank 0 (and msrun's master), node 1 rank 1
        for node in (0, 1):
            msrun = (folder / "logs" / f"node{node}" / "msrun.log").read_text()
            assert f"--node_rank={node}" in msrun and "--local_worker_num=1" in msrun, msrun[-2000:]
            assert f"Start worker process with rank id:{node}," in msrun
            assert sorted(
                p.name for p in (folder / "logs" / f"node{node}").glob("worker_*.log")
            ) == [f"worker_{node}.log"]
    # tp = 2 on one node, one msrun of two workers: the same losses as its tp group split over
    # two nodes (dp's one all-reduce per step is the simpler exchange; both take time here)
    folder = tmp_path / "art" / "span" / str(frame.loc[2, "number"])
    config = json.loads((folder / "config.json").read_text())
    alone = tmp_path / "alone"
    config["out_dir"] = str(alone)
    assert run_trial(config, alone, 240, None, 2).outcome == "ok"
    assert losses(folder) == pytest.approx(losses(alone), rel=1e-6)


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                args = (
                    Path(entry.path, "cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                )
            except OSError:
                continue
            found.append((int(entry.name), args))
    return found


@pytest.mark.parametrize(
    "backend,variable", [("gpu", "CUDA_VISIBLE_DEVICES"), ("ascend", "ASCEND_RT_VISIBLE_DEVICES")]
)
def test_the_device_ray_assigns_reaches_the_trial(tmp_path, shared_nodes, backend, variable):
    """A node that says it has one GPU (NPU): the trial's launch carries the device Ray gave
    it, and MindSpore is asked for that device. This machine has none and its MindSpore cannot
    load the device plugin, so the device never comes up: the infrastructure's failure, retried
    once, not remembered — and with every run failing so, the study stops in one line instead
    of running its three trials."""
    text = (
        SPANNING.replace("backend: cpu", f"backend: {backend}")
        .replace("devices: 2, devices_per_node: 1", "devices: 1, devices_per_node: 1")
        .replace("tp: [1, 2]", "tp: 1")
        .replace("n_trials: 2", "n_trials: 3")
    )
    env = {**ray_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the GPU JIT cache's folder
    out, err = finish(search(tmp_path, text, shared_nodes[0], env=env), 180)
    assert "Traceback" not in err, err[-3000:]
    log = (tmp_path / "art" / "span" / "0" / "logs" / "worker_0.log").read_text()
    assert log.startswith(f"launched: {variable}=0 "), log[:500]
    frame = autotune.trials_frame("span", f"sqlite:///{tmp_path}/s.db")
    target = {"gpu": "GPU", "ascend": "Ascend"}[backend]  # MindSpore was asked for the device
    assert list(frame["outcome"]) == ["error", "error"], frame["detail"].tolist()
    assert frame["infrastructure"].tolist() == [True, True]
    assert frame.iloc[1]["retry_of"] == 0
    assert (
        f"LaunchError: set_device({target}) failed: RuntimeError: Unsupported device target "
        f"{target}" in frame.iloc[0]["detail"]
    )
    assert "failed before their candidate ran, a retry among them" in out, out[-3000:]


@pytest.mark.parametrize(
    "backend,resource,flag", [("gpu", "GPU", "--num-gpus"), ("ascend", "NPU", "--resources")]
)
def test_a_backend_whose_devices_the_cluster_lacks_is_refused_at_once(
    tmp_path, backend, resource, flag
):
    text = SPANNING.replace("backend: cpu", f"backend: {backend}").replace(
        "devices_per_node: 1", "devices_per_node: 2"
    )
    # the driver's embedded Ray under a folder of this test's (short: Ray's socket paths)
    temp = tempfile.mkdtemp(prefix="t-")
    started = time.monotonic()
    proc = search(tmp_path, text, None, env={**ray_env(), "TMPDIR": temp})
    out, err = finish(proc, 60)
    took = time.monotonic() - started
    assert proc.returncode == 2, err[-3000:]
    assert f"Ray resource {resource}" in err and flag in err and "Traceback" not in err, err
    assert took < 30, took  # measured ≈5 s on a quiet machine (docs/cluster.md); no hang
    assert not (tmp_path / "s.db").exists()  # refused before the study was written
    deadline = time.monotonic() + 10
    while any(temp in args for _, args in processes()):  # its embedded Ray ended with it
        assert time.monotonic() < deadline, [a for _, a in processes() if temp in a]
        time.sleep(0.2)
    assert os.listdir(temp) == []  # and its temp folder is gone
    os.rmdir(temp)


def test_a_trial_larger_than_the_only_node_is_refused_before_the_study_is_written(tmp_path):
    proc = search(tmp_path, SPANNING, None)  # the embedded Ray is one node
    out, err = finish(proc, 60)
    assert proc.returncode == 2, err[-3000:]
    assert "spans 2 nodes of 1 devices" in err and "ray start --address" in err, err
    assert not (tmp_path / "s.db").exists()


def test_a_lost_node_ends_the_trial_on_both_and_the_driver_stops_resumable(tmp_path, shared_nodes):
    """Last of the module: it kills the second node of the shared cluster."""
    address, temps = shared_nodes
    text = SPANNING.replace("tp: [1, 2]", "tp: 1").replace("steps: 8,", "steps: 400,")
    proc = search(tmp_path, text, address)
    steps = tmp_path / "art" / "span" / "0" / "steps.jsonl"
    deadline = time.monotonic() + 240
    while not (steps.exists() and len(steps.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)
    trial = [p for p in processes() if "autotune/train" in p[1] or "msrun" in p[1]]
    assert len({pid for pid, _ in trial}) >= 4  # two msruns, two workers
    # the second node's raylet dies (its machine, say, lost power)
    raylet = next(pid for pid, args in processes() if "raylet" in args and temps[1] in args)
    killed = time.monotonic()
    os.kill(raylet, signal.SIGKILL)
    while any(os.path.exists(f"/proc/{pid}") for pid, _ in trial):
        assert time.monotonic() - killed < 30, "the trial's processes outlived the lost node"
        time.sleep(0.2)
    ended_s = time.monotonic() - killed
    out, err = finish(proc, 120)
    assert proc.returncode == 1, err[-3000:]
    assert "no set of nodes can place trial" in err and "--resume" in err, err[-3000:]
    frame = autotune.trials_frame("span", f"sqlite:///{tmp_path}/s.db")
    first = frame.iloc[0]
    assert first["outcome"] == "error" and first["infrastructure"], first["detail"]
    assert "node" in first["detail"]
    # the retry could not be placed: recorded interrupted, queued for a resume
    assert frame.iloc[-1]["outcome"] == "interrupted"
    print(f"trial processes on both nodes gone {ended_s:.1f} s after the raylet was killed")
