"""No process of a trial outlives it, however it ends: real two-worker msrun trials stopped by
the memory budget, the timeout and Ctrl-C, and a real `autotune search` driver SIGKILLed in the
middle of its trial. Processes are found here straight from /proc, not with the code under test."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autotune import procfs
from autotune.execution.runner import run_trial
from tests.conftest import interruptible

# multi-process proofs: make test-slow
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# On this CPU a worker holds ~415 MB once MindSpore is imported (the scheduler, which runs the
# same program, stays there) and ~540 MB once its graph compiles and it trains.
BUDGET_MB = 480


def processes() -> dict[int, tuple[int, int, str]]:
    """pid → (ppid, start time, command line) of every live process (zombies left out)."""
    return {
        pid: (info.ppid, info.start, procfs.cmdline(pid))
        for pid, info in procfs.snapshot().items()
        if not info.zombie
    }


def processes_mentioning(text) -> dict[int, str]:
    """Live processes whose command line contains ``text`` (a trial folder, a study name)."""
    return {pid: cmd for pid, (_, _, cmd) in processes().items() if str(text) in cmd}


def descendants(root: int) -> dict[tuple[int, int], str]:
    """(pid, start time) → command line of every live process descended from ``root``."""
    procs = processes()
    children = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = {}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found[(child, procs[child][1])] = procs[child][2]
            stack.append(child)
    return found


def still_alive(known: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
    procs = processes()
    return {
        key: cmd for key, cmd in known.items() if key[0] in procs and procs[key[0]][1] == key[1]
    }


def config(folder: Path, steps: int) -> dict:
    """A 2-layer transformer, data parallel over two msrun workers."""
    return {
        "study": "p",
        "trial_number": 0,
        "backend": "cpu",
        "seed": 0,
        "out_dir": str(folder),
        "model": {
            "family": "transformer",
            "entry": None,
            "num_layers": 2,
            "hidden_size": 32,
            "num_heads": 2,
            "ffn_hidden_size": 128,
            "seq_length": 16,
            "vocab_size": 64,
            "dtype": "float16",
        },
        "train": {"global_batch_size": 8, "learning_rate": 5e-3, "total_steps": 200},
        "trial": {"steps": steps, "measure_after": 2},
        "knobs": {
            "dp": 2,
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


class Watcher(threading.Thread):
    """Counts the trial's processes while it runs; ``then`` runs 2 s after msrun, its scheduler
    and both workers are up (the workers are importing MindSpore by then)."""

    def __init__(self, folder: Path, then=None):
        super().__init__(daemon=True)
        self.needle, self.then, self.most, self.done = f"{folder}/", then, 0, False

    def run(self):
        while not self.done:
            self.most = max(self.most, len(processes_mentioning(self.needle)))
            if self.most >= 4 and self.then:
                time.sleep(2)
                self.then()
                self.then = None
            time.sleep(0.1)


def test_dp2_trial_over_its_memory_budget_ends_oom_within_2_s(tmp_path):
    folder = tmp_path / "t"
    called = time.monotonic()
    result = run_trial(config(folder, steps=1000), folder, 180, BUDGET_MB, 2)
    returned = time.monotonic()
    assert result.outcome == "oom", result.detail
    reached = float(re.search(r"a worker reached (\d+) MB, over the 480 MB", result.detail)[1])
    assert reached > BUDGET_MB
    # from when the runner saw a worker over the budget to run_trial's return (every process gone)
    print(
        f"over the budget {result.stop_s:.1f} s in; every process gone "
        f"{result.run_s - result.stop_s:.2f} s later, run_trial returned "
        f"{returned - called - result.stop_s:.2f} s later"
    )
    assert returned - called - result.stop_s < 2
    assert not processes_mentioning(f"{folder}/")


def test_dp2_trial_past_its_time_leaves_no_process(tmp_path):
    folder = tmp_path / "t"
    watcher = Watcher(folder)
    watcher.start()
    result = run_trial(config(folder, steps=100000), folder, 6, None, 2)
    watcher.done = True
    assert result.outcome == "timeout", result.detail
    # the clock runs from the candidate's start, not the launch's (whose length the load decides):
    # stopped 6 s after a rank started the candidate, every process gone soon after
    launch_s = float(re.search(r"its launch took ([\d.]+) s", result.detail)[1])
    assert 6 <= result.stop_s - launch_s < 9, (result.stop_s, launch_s)
    assert result.run_s - result.stop_s < 3
    assert watcher.most >= 4  # msrun, the scheduler and both workers were running
    assert not processes_mentioning(f"{folder}/")


CTRL_C = """
import json, sys
from pathlib import Path
from autotune.execution.runner import run_trial

folder = Path(sys.argv[1])
try:
    run_trial(json.loads(sys.argv[2]), folder, 180, None, 2)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_dp2_trial_interrupted_by_ctrl_c_leaves_no_process(tmp_path):
    # Ctrl-C, and Ray's cancel of a pruned trial, raise KeyboardInterrupt in run_trial's thread.
    # It runs in a process of its own: once MindSpore has run an op in a process (this test
    # session's other tests do), its signal handler turns SIGINT into SIGTERM for the process.
    folder = tmp_path / "t"
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, str(folder), json.dumps(config(folder, steps=100000))],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )
    watcher = Watcher(folder, then=lambda: child.send_signal(signal.SIGINT))
    watcher.start()
    try:
        out, _ = child.communicate(timeout=180)
    finally:
        watcher.done = True
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, out[-3000:]  # run_trial raised KeyboardInterrupt
    assert watcher.most >= 4
    assert not processes_mentioning(f"{folder}/")


MODEL = """
study: {study}
model: {{family: transformer, num_layers: 2, hidden_size: 32, num_heads: 2, seq_length: 16,
        vocab_size: 64, dtype: float16}}
train: {{global_batch_size: 8, learning_rate: 5.0e-3, total_steps: 200}}
cluster: {{backend: cpu, devices: 2, devices_per_node: 2, device_memory_gb: 8}}
search:
  space: {{fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0, jit_level: O1,
          recompute: none}}
  n_trials: 1
  objectives: [goodput, final_loss]
trial: {{steps: 100000, measure_after: 2, timeout_s: 600}}
"""


def test_sigkill_of_the_driver_leaves_no_process_and_resume_reruns_its_trial(tmp_path):
    study = f"killed-{os.getpid()}"
    # 400 steps: long enough to be killed in the middle, short enough to rerun
    (tmp_path / "model.yaml").write_text(
        textwrap.dedent(MODEL.format(study=study).replace("steps: 100000", "steps: 400"))
    )
    trial = tmp_path / "art" / study / "0"
    storage = f"sqlite:///{tmp_path}/s.db"
    argv = [
        str(BIN / "autotune"),
        "search",
        "model.yaml",
        "--storage",
        storage,
        "--artifacts",
        str(tmp_path / "art"),
        "--no-confirm",
    ]
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    seen: dict = {}
    try:
        deadline = time.monotonic() + 150
        while not ((trial / "steps.jsonl").exists() and (trial / "steps.jsonl").stat().st_size):
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the trial never started training"
            time.sleep(0.2)
        seen = descendants(driver.pid)  # Ray's processes, the Ray worker, msrun and its workers
        names = " ".join(seen.values())
        assert "raylet" in names and "gcs_server" in names, names
        # msrun, its scheduler and both workers: the warm workers that run the trial
        pools = f"{tmp_path / 'art' / '.pools'}/"
        assert sum("--serve" in cmd and pools in cmd for cmd in seen.values()) == 4, names
        ray_temp = re.search(r"--log_dir=(\S*/autotune-ray-[^/\s]+)/", names)[1]

        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        driver.wait()
        left = {}
        while time.monotonic() - killed < 10:
            left = still_alive(seen) | {
                (pid, 0): cmd
                for pid, cmd in {
                    **processes_mentioning(tmp_path),
                    **processes_mentioning(study),
                }.items()
            }
            if not left:
                break
            time.sleep(0.1)
        gone_s = time.monotonic() - killed
        print(f"every process of the study gone {gone_s:.1f} s after the driver's SIGKILL")
        assert not left, f"alive {gone_s:.0f} s after the driver's SIGKILL: {left}"
        deadline = time.monotonic() + 5
        while os.path.exists(ray_temp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(ray_temp)  # the guard removed Ray's temp folder too
        assert len(open(trial / "steps.jsonl").readlines()) < 400  # killed in the middle

        # --resume reruns the candidate the kill interrupted, and the study ends with exactly
        # N = 1 finished trial besides it
        resumed = subprocess.run(
            argv + ["--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        assert "resuming: trial #0 (driver " in resumed.stdout
        assert "was interrupted" in resumed.stdout and "its candidate runs again" in resumed.stdout
        import optuna

        trials = optuna.load_study(study_name=study, storage=storage).trials
        assert [t.user_attrs.get("outcome") for t in trials] == ["interrupted", "ok"]
        assert trials[1].params == trials[0].params and trials[1].user_attrs.get("baseline")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid, _ in still_alive(seen):  # a failed run must not leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
def test_a_lost_ray_cluster_stops_the_study_with_nothing_lost(tmp_path):
    """The driver's local raylet dies during trial 0. A warm pool's Ray actor may finish the trials
    it was given (its results come back over the actor's own connection, measured: up to two 12-step
    trials, all three once trials got faster — so the trials here take 40 steps, and there are six),
    but once it dies the trial it held is the infrastructure's error, not remembered as its
    candidate's; nothing more can run: its retry is recorded as interrupted and queued again, and
    the study stops at once (exit 1, saying how to resume) — rather than burning every remaining
    candidate as an error against a dead cluster (measured before: 8 trials and their retries, 14
    errors, in 91 s)."""
    import optuna

    study = f"lost-{os.getpid()}"
    text = (
        MODEL.format(study=study)
        .replace("steps: 100000", "steps: 40")
        .replace("n_trials: 1", "n_trials: 6")
    )
    (tmp_path / "model.yaml").write_text(textwrap.dedent(text))
    storage = f"sqlite:///{tmp_path}/s.db"
    argv = [
        str(BIN / "autotune"),
        "search",
        "model.yaml",
        "--storage",
        storage,
        "--artifacts",
        str(tmp_path / "art"),
        "--no-confirm",
    ]
    trial = tmp_path / "art" / study / "0"
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 150
        while not (trial / "steps.jsonl").exists():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the trial never started training"
            time.sleep(0.2)
        raylets = [
            pid
            for (pid, _), cmd in descendants(driver.pid).items()
            if cmd.split(" ")[0].endswith("/raylet")
        ]
        assert len(raylets) == 1, descendants(driver.pid)
        os.kill(raylets[0], signal.SIGKILL)
        assert driver.wait(timeout=120) == 1
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = (tmp_path / "driver.log").read_text()
    assert "the Ray cluster is gone" in out and "--resume" in out, out[-3000:]
    trials = optuna.load_study(study_name=study, storage=storage).trials
    outcomes = [t.user_attrs.get("outcome") for t in trials]
    lost = outcomes.index("error")  # the trial its actor died holding
    assert outcomes == ["ok"] * lost + ["error", "interrupted", None], out[-3000:]
    assert lost < 6  # the study stopped rather than running on
    assert trials[lost].user_attrs["infrastructure"] is True
    retry, queued = trials[lost + 1], trials[lost + 2]
    assert retry.user_attrs["retry_of"] == lost and retry.params == trials[lost].params
    assert queued.state == optuna.trial.TrialState.WAITING  # a resume runs it first
    assert queued.system_attrs["fixed_params"] == retry.params  # Optuna's queue
