"""Run one trial as a subprocess and classify how it ended.

Contract: :func:`run_trial` writes ``config.json`` into the trial folder, launches the trial
program (directly for one worker, under ``msrun`` for several), enforces the wall-clock timeout
and the per-device memory budget, and returns a :class:`TrialResult` whose ``outcome`` is one of
``ok``, ``diverged``, ``oom``, ``timeout``, ``error``. It never touches study storage.

An ``error`` says whose failure it is (``TrialResult.infrastructure``). It is the candidate's own
once the trial program got to run the candidate: a rank printed ``CANDIDATE_STARTED`` (the launch
was done), or the program gave a verdict other than ``LaunchError`` (a config error, a bad model
entry, an exception while building, compiling or training). It is the infrastructure's when the
program never got there: msrun or the process launch failed before any verdict, or the verdict is
``LaunchError`` (communication init, the cluster join). The search remembers the first kind and
retries the second (`autotune.failures`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
OOM_MARKERS = ("MemoryError", "std::bad_alloc", "Out of memory", "out of memory",
               "Memory not enough", "Allocate memory failed")
POLL_S = 0.25


@dataclass
class TrialResult:
    outcome: str
    metrics: dict = field(default_factory=dict)
    detail: str = ""          # why it failed: one line of reason, then the log tail
    infrastructure: bool = False  # an error not the candidate's own (see the module doc)
    run_s: float = 0.0        # subprocess wall time, launch to exit


def free_port() -> int:
    """A TCP port free on loopback right now (msrun's scheduler binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(config_path: Path, workers: int, log_dir: Path, port: int,
            bind_cores: bool = False) -> list[str]:
    """The argument list that runs the trial program with ``workers`` ranks. ``bind_cores``
    pins each msrun worker to its own cores: measured on the 2-core CPU, unpinned dp = 2 step
    times jump between ~46 and ~75 ms from run to run; pinned they stay within 44–47 ms."""
    from autotune.train import PROGRAM_PATH

    if workers == 1:
        return [sys.executable, str(PROGRAM_PATH), str(config_path)]
    msrun = Path(sys.executable).with_name("msrun")
    return [str(msrun), f"--worker_num={workers}", f"--local_worker_num={workers}",
            "--master_addr=127.0.0.1", f"--master_port={port}", f"--log_dir={log_dir}",
            "--join=True", "--cluster_time_out=120", *(["--bind_core=True"] if bind_cores else []),
            str(PROGRAM_PATH), str(config_path)]


def _environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    # msrun starts its workers with the `python` on PATH: make it this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("GLOG_v", "3")  # MindSpore C++ logs: errors only
    return env


def _group_rss_mb(pgid: int) -> float:
    """Largest resident set of any process in the group: one process is one device on CPU."""
    largest = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat: process group id
                continue
            largest = max(largest, int(fields[21]))  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return largest * os.sysconf("SC_PAGE_SIZE") / 2**20


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(trial_dir: Path, lines: int = 20) -> str:
    """The last lines of the trial's logs, worker 0 first (that is where errors surface)."""
    logs = sorted(trial_dir.glob("**/*.log"), key=lambda p: ("worker_0" not in p.name, p.name))
    chunks = []
    for log in logs[:2]:
        text = log.read_text(errors="replace").strip().splitlines()
        if text:
            chunks.append(f"[{log.name}] " + "\n".join(text[-lines:]))
    return "\n".join(chunks)


def run_trial(config: dict, trial_dir: Path, timeout_s: float, memory_limit_mb: float | None,
              workers: int) -> TrialResult:
    """Run the trial program for ``config`` in ``trial_dir`` with ``workers`` ranks."""
    trial_dir = trial_dir.resolve()  # the program runs with the trial folder as its cwd
    trial_dir.mkdir(parents=True, exist_ok=True)
    config_path = trial_dir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    log_dir = trial_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    # On CPU a trial has the pool's cores to itself (one at a time), so pinning is safe; on a
    # GPU/Ascend node several trials may share the host's cores, and msrun's pinning would collide.
    argv = command(config_path, workers, log_dir, free_port(),
                   bind_cores=config.get("backend") == "cpu")
    started = time.monotonic()
    with open(log_dir / ("worker_0.log" if workers == 1 else "msrun.log"), "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=trial_dir,
                                env=_environment(), start_new_session=True)
        try:
            outcome, detail = _supervise(proc, started, timeout_s, memory_limit_mb)
        except BaseException:  # cancelled (Ctrl-C, ray.cancel): leave nothing running
            _kill_group(proc)
            raise
    run_s = time.monotonic() - started
    if outcome:
        return TrialResult(outcome, detail=detail, run_s=run_s)
    return _classify(proc.returncode, trial_dir, run_s)


def _supervise(proc, started, timeout_s, memory_limit_mb) -> tuple[str, str]:
    """Wait for exit; kill the group on timeout or when a worker exceeds the memory budget."""
    while proc.poll() is None:
        if time.monotonic() - started > timeout_s:
            _kill_group(proc)
            return "timeout", f"killed after {timeout_s:.0f} s (trial.timeout_s)"
        if memory_limit_mb:
            rss = _group_rss_mb(proc.pid)
            if rss > memory_limit_mb:
                _kill_group(proc)
                return "oom", (f"a worker reached {rss:.0f} MB, over the "
                               f"{memory_limit_mb:.0f} MB device budget")
        time.sleep(POLL_S)
    # Workers msrun left behind (it exits when the scheduler does) must not outlive the trial.
    _kill_group(proc)
    return "", ""


def _classify(returncode: int, trial_dir: Path, run_s: float) -> TrialResult:
    metrics_file = trial_dir / "metrics.json"
    if returncode == 0 and metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        outcome = "diverged" if metrics.get("diverged") else "ok"
        return TrialResult(outcome, metrics, run_s=run_s)
    tail = log_tail(trial_dir)
    # The trial program's own one-line verdict, if it got to say one, beats msrun's epilogue.
    verdicts = [line for line in tail.splitlines() if line.startswith("autotune.train:")]
    reason = verdicts[-1] if verdicts else (tail.splitlines() or [""])[-1]
    if returncode in (-signal.SIGKILL, 137) or any(m in tail for m in OOM_MARKERS):
        return TrialResult("oom", detail=f"{reason}\n{tail}", run_s=run_s)
    why = f"exit code {returncode}" if returncode else "exited 0 without metrics.json"
    infrastructure = not _candidate_ran(trial_dir)
    if infrastructure:
        why = f"infrastructure: {why}, before the candidate ran"
    return TrialResult("error", detail=f"{why}: {reason}\n{tail}", run_s=run_s,
                       infrastructure=infrastructure)


def _candidate_ran(trial_dir: Path) -> bool:
    """Whether any rank got to run the candidate: it said it started it, or gave a verdict
    that is not a failed launch (config errors are the candidate's too)."""
    from autotune.train import CANDIDATE_STARTED, LAUNCH_FAILED, VERDICT

    for log in trial_dir.glob("**/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(CANDIDATE_STARTED) or (line.startswith(VERDICT)
                                                      and not line.startswith(LAUNCH_FAILED)):
                return True
    return False
