"""Run one trial as a subprocess.

Contract: :func:`run_trial` writes ``config.json`` into the trial folder, launches the trial
program (directly for one worker, under ``msrun`` for several; a config with a ``mindformers``
section is MindFormers' ``run_mindformer.py`` instead, always under msrun, its ``trial.yaml``
written beside ``config.json``, the stop rule followed from its live steps and its recorder's
files read into ``metrics.json`` once it exits: `autotune.mindformers`), enforces the wall-clock timeout
(from when a rank starts the candidate: :func:`trial_clock`) and the per-device memory budget, and returns an `autotune.jobs.Result` whose ``outcome`` is one
of ``ok``, ``diverged``, ``oom``, ``timeout``, ``error`` (how a finished program is read:
`autotune.execution.classify`). It never touches study storage. A trial that spans nodes runs as
one :func:`run_trial` per node (`autotune.execution.dispatch` places them), each launching that
node's msrun; the node of rank 0 returns the metrics. Its own ``oom`` is a worker over the
budget (the other evidence of an ``oom``: `autotune.execution.classify`); the study remembers a
candidate's own failure and retries the infrastructure's (`autotune.study.retry`).

It owns the trial's whole process tree (`autotune.execution.processes`): msrun starts each
worker in a session of its own, out of reach of a process-group kill, so every descendant of the
launched process is tracked while it runs. The budget is the largest RSS of any of them (msrun
itself aside: it is no device), and however the trial ends — done, timeout, over budget,
cancelled (a prune, Ctrl-C) — none of them outlives :func:`run_trial`; a single-node trial of
autotune's program ends once every rank wrote its last outputs and no msrun worker is left (the
runner stops msrun and its scheduler rather than wait for MindSpore's scheduler to notice). Should the runner
itself be killed, the launched process dies with it (``PR_SET_PDEATHSIG``) and msrun's workers
die with msrun. A trial starts from a clean folder (:func:`fresh_trial_dir`): nothing an
earlier study of the same name left there — a log with an out-of-memory line, a "running the
candidate" marker, a ``steps.jsonl`` — is read as this trial's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.execution.classify import (
    CandidateStart,
    classify,
    outputs_complete,
    stopped_in_probe,
)
from autotune.execution.environment import PROJECT_ROOT, device_environment, environment
from autotune.execution.launch_time import with_launch_and_teardown
from autotune.execution.nodes import NodeLaunch
from autotune.execution.processes import ProcessTree, msrun_workers_gone
from autotune.execution.warmup import warm_up
from autotune.files import write_json, write_text
from autotune.jobs import Result
from autotune.mindformers.launch import launch as mindformers_launch
from autotune.mindformers.results import MissingRanks, StopPlan, write_metrics
from autotune.mindformers.trial import TRIAL_FILE
from autotune.spec.backends import DEFAULT_BACKEND, backend_of, reserved_ports
from autotune.train import NODE_VARIABLE, PROGRAM_PATH
from autotune.train.msrun import msrun_args
from autotune.train.runtime.lifetime import die_with_parent_hook

POLL_S = 0.25
STOP_GRACE_S = 2.0  # SIGTERM → SIGKILL for a trial stopped early (a timeout, a cancel)
# A trial's start-up (the processes' imports, msrun's cluster join and communication init: ~14 s
# for two CPU workers here, paid by a warm pool's first trial only) is outside its timeout, which
# starts when a rank starts the candidate. A start-up still going after this long (or the
# trial's timeout, if longer) is stopped as the infrastructure's: msrun itself gives up joining
# after `autotune.train.msrun.CLUSTER_TIME_OUT_S` (120 s).
LAUNCH_LIMIT_S = 300.0
MINDFORMERS = (
    "mindformers"  # a config's section naming a MindFormers trial (`autotune.mindformers`)
)


def trial_clock(log_dir: Path, timeout_s: float):
    """The clock of a trial whose logs go to ``log_dir`` (see `LAUNCH_LIMIT_S`): a function of
    the monotonic seconds since the launcher handed the trial over that returns ``(outcome,
    detail)`` once the trial must be stopped — ``timeout`` past ``timeout_s`` from when a rank
    started the candidate, ``error`` (the infrastructure's) when none did within the launch
    limit — else ``("", "")``."""
    watch, started_at = CandidateStart(log_dir), []
    launch_limit = max(LAUNCH_LIMIT_S, timeout_s)

    def check(elapsed: float) -> tuple[str, str]:
        if not started_at and watch.seen():
            started_at.append(elapsed)
        if not started_at:
            if elapsed > launch_limit:
                return "error", (
                    f"infrastructure: the launch did not start the candidate within "
                    f"{launch_limit:.0f} s (no rank said "
                    f"'autotune.train running the candidate')"
                )
            return "", ""
        if elapsed - started_at[0] > timeout_s:
            return "timeout", (
                f"killed after {timeout_s:.0f} s of the candidate's run "
                f"(trial.timeout_s; its launch took {started_at[0]:.1f} s before)"
            )
        return "", ""

    return check


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (msrun's scheduler binds it moments later), none
    of the ports a backend's collectives take on the host (``Backend.host_ports``: the OS hands
    out ports up to 60999 unless they are reserved, docs/cluster.md)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not any(first <= port <= last for first, last in reserved_ports()):
            return port


@dataclass(frozen=True)
class NodeRun:
    """This node's part of a trial that spans several: its ranks, and where rank 0's node
    listens (msrun's scheduler)."""

    launch: NodeLaunch
    master_addr: str
    master_port: int


def fresh_trial_dir(trial_dir: Path, log_dir: Path | None = None, outputs: bool = True) -> None:
    """Clear what an earlier trial of the same folder left. Without ``log_dir`` the whole folder
    (the driver, before it dispatches the trial: nothing of it runs yet); with it, that node's
    log folder and — ``outputs``, on rank 0's node — the files the program writes
    (``steps.jsonl``, ``metrics.json``): a node never touches another node's logs, and nodes
    that share the folder write the same ``config.json``."""
    if log_dir is None:
        shutil.rmtree(trial_dir, ignore_errors=True)
        trial_dir.mkdir(parents=True, exist_ok=True)
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    for name in ("steps.jsonl", "metrics.json") if outputs else ():
        (trial_dir / name).unlink(missing_ok=True)


def command(
    program_args,
    workers: int,
    log_dir: Path,
    port: int,
    bind_cores: bool = False,
    node: NodeRun | None = None,
) -> list[str]:
    """The argument list that runs the trial program with ``program_args`` (a config path, or
    ``["--serve", POOL_DIR]``: `autotune.train.runtime.serve`) and ``workers`` ranks, under msrun
    (`autotune.train.msrun`, the builder exported launch scripts use too) when there are several —
    this node's share of them with ``node``. ``bind_cores`` pins each msrun worker to its own
    cores: measured on the 2-core CPU, unpinned dp = 2 step times jump between ~46 and ~75 ms
    from run to run; pinned they stay within 44–47 ms."""
    program = [
        str(PROGRAM_PATH),
        *map(str, program_args if isinstance(program_args, list) else [program_args]),
    ]
    if workers == 1:
        return [sys.executable, *program]
    msrun = Path(sys.executable).with_name("msrun")
    if node is None:
        args = msrun_args(
            workers, workers, master_port=port, log_dir=str(log_dir), bind_core=bind_cores
        )
    else:
        args = msrun_args(
            workers,
            node.launch.local_workers,
            master_port=node.master_port,
            master_addr=node.master_addr,
            node_rank=node.launch.msrun_node_rank,
            log_dir=str(log_dir),
            bind_core=bind_cores,
        )
    return [str(msrun), *args, *program]


def run_trial(
    config: dict,
    trial_dir: Path,
    timeout_s: float,
    memory_limit_mb: float | None,
    workers: int,
    node: NodeRun | None = None,
    env: dict | None = None,
) -> Result:
    """Run the trial program for ``config`` in ``trial_dir`` with ``workers`` ranks — only this
    node's share of them with ``node`` (its logs under ``logs/node<i>``; rank 0's node returns
    the metrics, the others ``ok`` without). ``env``: variables to add (the devices Ray gave)."""
    backend = backend_of(config.get("backend", DEFAULT_BACKEND))
    trial_dir = trial_dir.resolve()  # the program runs with the trial folder as its cwd
    trial_dir.mkdir(parents=True, exist_ok=True)
    config_path = trial_dir / "config.json"
    write_json(config_path, config, indent=2)  # whole: nodes on one host share the folder
    log_dir = trial_dir / "logs" / (f"node{node.launch.index}" if node else "")
    fresh_trial_dir(trial_dir, log_dir, outputs=node is None or node.launch.index == 0)
    # Pinning starts from core 0 on every msrun: nodes of one trial may share a host (as Ray
    # nodes on one machine do), so only a single-node trial pins.
    pins = backend.pins_cores and node is None
    if node is not None:
        env = {**(env or {}), NODE_VARIABLE: str(node.launch.index)}
    local = node.launch.local_workers if node else workers
    mf, cwd, plan = config.get(MINDFORMERS), trial_dir, None
    if mf is not None:  # MindFormers' run_mindformer.py (`autotune.mindformers`), fresh each time
        argv, full_env, cwd = _mindformers_launch(
            mf, trial_dir, log_dir, env, workers, node, pins, backend, timeout_s
        )
        warmed = ""  # autotune's kernel JIT cache is its own MindSpore's, not MindFormers'
        plan = StopPlan(config, trial_dir) if node is None or node.launch.index == 0 else None
    else:
        argv = command(config_path, workers, log_dir, free_port(), bind_cores=pins, node=node)
        full_env = environment(env, config, local, timeout_s)
        warmed = warm_up(backend, full_env, str(PROJECT_ROOT))  # before the trial's clock starts
    started, handed_over = time.monotonic(), time.time()
    single = workers == 1 and mf is None  # MindFormers runs under msrun always
    with open(log_dir / ("worker_0.log" if single else "msrun.log"), "w") as out:
        # msrun does not say how it was started, nor which devices Ray gave: the log does
        given = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
        out.write(f"launched: {' '.join(given + [shlex.join(argv)])}\n{warmed}")
        out.flush()
        # Its own session (a terminal's Ctrl-C is the driver's to handle), and it dies with
        # this thread, even when the whole driver is SIGKILLed.
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
            preexec_fn=die_with_parent_hook(),
        )
        tree = ProcessTree(proc.pid)
        try:
            outcome, detail, stop_s, finished = _supervise(
                proc,
                tree,
                started,
                trial_clock(log_dir, timeout_s),
                memory_limit_mb,
                launcher=proc.pid if not single else None,
                poll=plan.poll if plan is not None else None,
                done=(lambda: outputs_complete(trial_dir, workers))
                if not single and mf is None and node is None
                else None,
            )
        except BaseException:  # cancelled (Ctrl-C, ray.cancel): leave nothing running
            tree.stop(STOP_GRACE_S, reap=proc.poll)
            proc.wait()
            raise
    run_s, ended = time.monotonic() - started, time.time()
    if outcome:
        trained = stopped_in_probe(trial_dir, outcome, detail, run_s, stop_s)
        if trained is not None and (node is None or node.launch.index == 0):
            trained.metrics = with_launch_and_teardown(trained.metrics, handed_over, ended)
            return trained
        return Result(
            outcome, detail=detail, run_s=run_s, stop_s=stop_s, infrastructure=outcome == "error"
        )
    if node is not None and node.launch.index > 0 and proc.returncode == 0:
        return Result("ok", run_s=run_s)  # rank 0's node holds the metrics
    if mf is not None and proc.returncode == 0:
        try:
            write_metrics(trial_dir, config)  # the recorder's files → metrics.json
        except MissingRanks as missing:  # the trial folder is not the nodes' shared one
            return Result(
                "error", detail=f"infrastructure: {missing}", run_s=run_s, infrastructure=True
            )
    returncode = 0 if finished else proc.returncode  # msrun stopped once its workers were done
    result = classify(returncode, trial_dir, log_dir, run_s, backend, dict(tree.known))
    result.metrics = with_launch_and_teardown(result.metrics, handed_over, ended)
    return result


def _mindformers_launch(
    mf: dict,
    trial_dir: Path,
    log_dir: Path,
    env: dict | None,
    workers: int,
    node,
    pins: bool,
    backend,
    timeout_s: float,
) -> tuple[list[str], dict, Path]:
    """A MindFormers trial's ``(argv, environment, cwd)`` on this node, its trial.yaml written
    whole (nodes sharing the folder each write it; a reader never sees half of it:
    `autotune.files.write_text`) (`autotune.mindformers.launch`): from ours plus ``env``, the
    backend's own variables and what an accelerator's trial gets beside its devices, as
    autotune's own trials do (`autotune.execution.environment.device_environment`)."""
    write_text(trial_dir / TRIAL_FILE, mf["trial_yaml"])
    local = node.launch.local_workers if node else workers
    base = {**os.environ, **(env or {}), **dict(backend.environment)}
    base.update(device_environment(backend, base, local, timeout_s))
    place = (
        {"master_port": free_port()}
        if node is None
        else {
            "master_port": node.master_port,
            "master_addr": node.master_addr,
            "node_rank": node.launch.msrun_node_rank,
        }
    )
    return mindformers_launch(
        mf, trial_dir, log_dir, base, workers=workers, local_workers=local, bind_core=pins, **place
    )


def _supervise(
    proc,
    tree: ProcessTree,
    started: float,
    clock,
    memory_limit_mb: float | None,
    launcher: int | None,
    poll=None,
    done=None,
) -> tuple[str, str, float | None, bool]:
    """Wait for exit; stop the tree when the trial's ``clock`` (:func:`trial_clock`) says so or
    a worker exceeds the memory budget; ``poll()`` at every look (a MindFormers trial's stop
    rule: `autotune.mindformers.results.StopPlan`). Returns (outcome, detail, seconds from
    launch to the decision) for a stopped trial, and whether msrun was stopped because its
    workers had exited after ``done()`` said the outputs were complete."""
    while True:
        exited = proc.poll() is not None
        tree.refresh()
        if poll is not None:
            poll()
        now = time.monotonic() - started
        if exited:
            break
        if done is not None and done() and msrun_workers_gone(tree):
            # Finished: what msrun waits for now is its scheduler, which looks for exited
            # workers every 5 s (MindSpore's ClusterContext::Finalize): up to 5 s a trial
            # (docs/trials.md)
            tree.stop(0, reap=proc.poll)
            proc.wait()
            return "", "", None, True
        outcome, detail = clock(now)
        if outcome:
            tree.stop(STOP_GRACE_S, reap=proc.poll)
            proc.wait()
            return outcome, detail, now, False
        if memory_limit_mb:
            pid, rss = tree.largest_rss(exclude=launcher)
            if rss > memory_limit_mb:
                tree.stop(0, reap=proc.poll)  # over its memory: no grace
                proc.wait()
                return (
                    "oom",
                    (
                        f"a worker reached {rss:.0f} MB, over the "
                        f"{memory_limit_mb:.0f} MB device budget (pid {pid}, "
                        f"{now:.1f} s in)"
                    ),
                    now,
                    False,
                )
        time.sleep(POLL_S)
    # Processes msrun left behind (it exits when the scheduler does) must not outlive the trial.
    tree.stop(STOP_GRACE_S)
    return "", "", None, False
