"""Run one trial as a subprocess and classify how it ended.

Contract: :func:`run_trial` writes ``config.json`` into the trial folder, launches the trial
program (directly for one worker, under ``msrun`` for several), enforces the wall-clock timeout
and the per-device memory budget, and returns a :class:`TrialResult` whose ``outcome`` is one of
``ok``, ``diverged``, ``oom``, ``timeout``, ``error``. It never touches study storage. A trial
that spans nodes runs as one :func:`run_trial` per node (`autotune.dispatch` places them), each
launching that node's msrun; the node of rank 0 returns the metrics. ``oom`` is a process killed
by the kernel, a worker over the budget, or a line of any log saying so in the backend's words
(`autotune.backends`).

An ``error`` says whose failure it is (``TrialResult.infrastructure``). It is the candidate's own
once the trial program got to run the candidate: a rank printed ``CANDIDATE_STARTED`` (the launch
was done), or the program gave a verdict other than ``LaunchError`` (a config error, a bad model
entry, an exception while building, compiling or training). It is the infrastructure's when the
program never got there: msrun or the process launch failed before any verdict, or the verdict is
``LaunchError`` (communication init, the cluster join). The search remembers the first kind and
retries the second (`autotune.failures`).

It owns the trial's whole process tree (`autotune.processes`): msrun starts each worker in a
session of its own, out of reach of a process-group kill, so every descendant of the launched
process is tracked while it runs. The budget is the largest RSS of any of them (msrun itself
aside: it is no device), and however the trial ends — done, timeout, over budget, cancelled
(a prune, Ctrl-C) — none of them outlives :func:`run_trial`. Should the runner itself be killed,
the launched process dies with it (``PR_SET_PDEATHSIG``) and msrun's workers die with msrun.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune.backends import Backend, backend_of
from autotune.placement import NodeLaunch
from autotune.processes import ProcessTree, die_with_parent_hook

PROJECT_ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.25
STOP_GRACE_S = 2.0  # SIGTERM → SIGKILL for a trial stopped early (a timeout, a cancel)


@dataclass
class TrialResult:
    outcome: str
    metrics: dict = field(default_factory=dict)
    detail: str = ""          # why it failed: one line of reason, then the log tail
    infrastructure: bool = False  # an error not the candidate's own (see the module doc)
    run_s: float = 0.0        # wall time, launch to the last process of the trial gone
    stop_s: float | None = None  # launch → when the runner decided to stop it (timeout, oom)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (msrun's scheduler binds it moments later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class NodeRun:
    """This node's part of a trial that spans several: its ranks, and where rank 0's node
    listens (msrun's scheduler)."""

    launch: NodeLaunch
    master_addr: str
    master_port: int


def command(config_path: Path, workers: int, log_dir: Path, port: int,
            bind_cores: bool = False, node: NodeRun | None = None) -> list[str]:
    """The argument list that runs the trial program with ``workers`` ranks, under msrun
    (`autotune.msrun`, the builder exported launch scripts use too) when there are several —
    this node's share of them with ``node``. ``bind_cores`` pins each msrun worker to its own
    cores: measured on the 2-core CPU, unpinned dp = 2 step times jump between ~46 and ~75 ms
    from run to run; pinned they stay within 44–47 ms."""
    from autotune.msrun import msrun_args
    from autotune.train import PROGRAM_PATH

    if workers == 1:
        return [sys.executable, str(PROGRAM_PATH), str(config_path)]
    msrun = Path(sys.executable).with_name("msrun")
    if node is None:
        args = msrun_args(workers, workers, master_port=port, log_dir=str(log_dir),
                          bind_core=bind_cores)
    else:
        args = msrun_args(workers, node.launch.local_workers, master_port=node.master_port,
                          master_addr=node.master_addr, node_rank=node.launch.msrun_node_rank,
                          log_dir=str(log_dir), bind_core=bind_cores)
    return [str(msrun), *args, str(PROGRAM_PATH), str(config_path)]


def _environment(extra: dict | None) -> dict:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    # msrun starts its workers with the `python` on PATH: make it this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("GLOG_v", "3")  # MindSpore C++ logs: errors only
    return env


def _logs(log_dir: Path) -> dict:
    return {log: log.read_text(errors="replace").strip().splitlines()
            for log in sorted(log_dir.glob("**/*.log"))}


def log_tail(log_dir: Path, lines: int = 20) -> str:
    """The last lines of two of the logs under ``log_dir``: the lowest rank's (that is where
    errors surface), then another that holds the trial program's verdict, else another
    worker's, else msrun's."""
    texts = _logs(log_dir)

    def worker_rank(log):
        number = log.stem.removeprefix("worker_")
        return int(number) if log.name.startswith("worker_") and number.isdigit() else 1 << 30

    lowest = min(map(worker_rank, texts), default=None)

    def rank(log):
        verdict = any(line.startswith("autotune.train:") for line in texts[log])
        return (worker_rank(log) != lowest, not verdict, not log.name.startswith("worker_"), log.name)

    chunks = [f"[{log.name}] " + "\n".join(texts[log][-lines:])
              for log in sorted(texts, key=rank) if texts[log]]
    return "\n".join(chunks[:2])


def run_trial(config: dict, trial_dir: Path, timeout_s: float, memory_limit_mb: float | None,
              workers: int, node: NodeRun | None = None, env: dict | None = None) -> TrialResult:
    """Run the trial program for ``config`` in ``trial_dir`` with ``workers`` ranks — only this
    node's share of them with ``node`` (its logs under ``logs/node<i>``; rank 0's node returns
    the metrics, the others ``ok`` without). ``env``: variables to add (the devices Ray gave)."""
    backend = backend_of(config.get("backend", "cpu"))
    trial_dir = trial_dir.resolve()  # the program runs with the trial folder as its cwd
    trial_dir.mkdir(parents=True, exist_ok=True)
    config_path = trial_dir / "config.json"
    temporary = trial_dir / f"config.json.{os.getpid()}"  # nodes on one host share the folder
    temporary.write_text(json.dumps(config, indent=2))
    temporary.replace(config_path)
    log_dir = trial_dir / "logs" / (f"node{node.launch.index}" if node else "")
    log_dir.mkdir(parents=True, exist_ok=True)
    # Pinning starts from core 0 on every msrun: nodes of one trial may share a host (as Ray
    # nodes on one machine do), so only a single-node trial pins.
    argv = command(config_path, workers, log_dir, free_port(),
                   bind_cores=backend.pins_cores and node is None, node=node)
    if node is not None:
        from autotune.train import NODE_VARIABLE

        env = {**(env or {}), NODE_VARIABLE: str(node.launch.index)}
    started = time.monotonic()
    with open(log_dir / ("worker_0.log" if workers == 1 else "msrun.log"), "w") as out:
        # msrun does not say how it was started, nor which devices Ray gave: the log does
        given = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
        out.write(f"launched: {' '.join(given + [shlex.join(argv)])}\n")
        out.flush()
        # Its own session (a terminal's Ctrl-C is the driver's to handle), and it dies with
        # this thread, even when the whole driver is SIGKILLed.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=trial_dir,
                                env=_environment(env), start_new_session=True,
                                preexec_fn=die_with_parent_hook())
        tree = ProcessTree(proc.pid)
        try:
            outcome, detail, stop_s = _supervise(proc, tree, started, timeout_s, memory_limit_mb,
                                                 launcher=proc.pid if workers > 1 else None)
        except BaseException:  # cancelled (Ctrl-C, ray.cancel): leave nothing running
            tree.stop(STOP_GRACE_S, reap=proc.poll)
            proc.wait()
            raise
    run_s = time.monotonic() - started
    if outcome:
        return TrialResult(outcome, detail=detail, run_s=run_s, stop_s=stop_s)
    if node is not None and node.launch.index > 0 and proc.returncode == 0:
        return TrialResult("ok", run_s=run_s)  # rank 0's node holds the metrics
    return _classify(proc.returncode, trial_dir, log_dir, run_s, backend)


def _supervise(proc, tree: ProcessTree, started: float, timeout_s: float,
               memory_limit_mb: float | None, launcher: int | None) -> tuple[str, str, float | None]:
    """Wait for exit; stop the tree on timeout or when a worker exceeds the memory budget.
    Returns (outcome, detail, seconds from launch to the decision) for a stopped trial."""
    while True:
        exited = proc.poll() is not None
        tree.refresh()
        now = time.monotonic() - started
        if exited:
            break
        if now > timeout_s:
            tree.stop(STOP_GRACE_S, reap=proc.poll)
            proc.wait()
            return "timeout", f"killed after {timeout_s:.0f} s (trial.timeout_s)", now
        if memory_limit_mb:
            pid, rss = tree.largest_rss(exclude=launcher)
            if rss > memory_limit_mb:
                tree.stop(0, reap=proc.poll)  # over its memory: no grace
                proc.wait()
                return "oom", (f"a worker reached {rss:.0f} MB, over the "
                               f"{memory_limit_mb:.0f} MB device budget (pid {pid}, "
                               f"{now:.1f} s in)"), now
        time.sleep(POLL_S)
    # Processes msrun left behind (it exits when the scheduler does) must not outlive the trial.
    tree.stop(STOP_GRACE_S)
    return "", "", None


def _classify(returncode: int, trial_dir: Path, log_dir: Path, run_s: float,
              backend: Backend) -> TrialResult:
    metrics_file = trial_dir / "metrics.json"
    if returncode == 0 and metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        outcome = "diverged" if metrics.get("diverged") else "ok"
        return TrialResult(outcome, metrics, run_s=run_s)
    tail = log_tail(log_dir)
    # The trial program's own one-line verdict, if it got to say one, beats msrun's epilogue.
    verdicts = [line for line in tail.splitlines() if line.startswith("autotune.train:")]
    reason = verdicts[-1] if verdicts else (tail.splitlines() or [""])[-1]
    evidence = oom_evidence(log_dir, backend)
    if returncode in (-signal.SIGKILL, 137) or evidence:
        return TrialResult("oom", detail=f"{evidence or reason}\n{tail}", run_s=run_s)
    why = f"exit code {returncode}" if returncode else "exited 0 without metrics.json"
    infrastructure = not _candidate_ran(log_dir)
    if infrastructure:
        why = f"infrastructure: {why}, before the candidate ran"
    return TrialResult("error", detail=f"{why}: {reason}\n{tail}", run_s=run_s,
                       infrastructure=infrastructure)


def oom_evidence(log_dir: Path, backend: Backend) -> str | None:
    """The first line of any log under ``log_dir`` (every worker's, msrun's) that says it ran
    out of memory on ``backend``, as ``[log] line``; None when none does."""
    for log, lines in _logs(log_dir).items():
        for line in lines:
            if backend.oom_in(line):
                return f"[{log.name}] {line.strip()}"
    return None


def _candidate_ran(log_dir: Path) -> bool:
    """Whether any rank got to run the candidate: it said it started it, or gave a verdict
    that is not a failed launch (config errors are the candidate's too)."""
    from autotune.train import CANDIDATE_STARTED, LAUNCH_FAILED, VERDICT

    for log, lines in _logs(log_dir).items():
        for line in lines:
            if line.startswith(CANDIDATE_STARTED) or (line.startswith(VERDICT)
                                                      and not line.startswith(LAUNCH_FAILED)):
                return True
    return False
