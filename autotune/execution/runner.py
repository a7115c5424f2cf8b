"""Run one trial as a subprocess.

Contract: :func:`run_trial` writes ``config.json`` into the trial folder, launches the trial
program the config names as its run side says (`autotune.execution.program_run`: autotune's
trainer, :class:`TrainerRun`, directly for one worker and under ``msrun`` for several;
MindFormers' ``run_mindformer.py`` always under msrun, `autotune.execution.mindformers_run`; both
registered here), polls it and reads its results back as that run side says, enforces the
wall-clock timeout (from when a rank starts the candidate: :func:`trial_clock`) and the
per-device memory budget, and returns an `autotune.jobs.Result` whose ``outcome`` is one
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

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from autotune.execution.classify import (
    CandidateStart,
    classify,
    outputs_complete,
    stopped_in_probe,
)
from autotune.execution.environment import PROJECT_ROOT, environment
from autotune.execution.launch_time import with_launch_and_teardown
from autotune.execution.mindformers_run import MindFormersRun
from autotune.execution.nodes import NodeRun, free_port
from autotune.execution.processes import ProcessTree, msrun_workers_gone
from autotune.execution.program_run import Launch, ProgramRun, register_run, run_of
from autotune.execution.warmup import warm_up
from autotune.files import write_json
from autotune.jobs import Result
from autotune.spec.backends import DEFAULT_BACKEND, backend_of
from autotune.spec.programs import Trainer
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


class TrainerRun(ProgramRun):
    """autotune's own trainer (`autotune.train`) as a study's trials: in warm pools unless the
    study asks for fresh launches, its compiled graphs reused by graph key; launched by
    :func:`command` (one worker directly, several under msrun) in the environment
    `autotune.execution.environment.environment` gives it, after this node's warm-up
    (`autotune.execution.warmup`), msrun stopped once every rank wrote its last outputs on a
    trial of one node; its own ``metrics.json`` is its result."""

    name = Trainer.name
    warm_pools = compile_cache = True

    def start(self) -> None:
        pass  # the trainer needs nothing written before its first trial

    def configure(self, job, trial_dir: Path, config: dict) -> None:
        pass  # `autotune.train.config.trial_config` is the trainer's config whole

    def ended(self, number: int) -> None:
        pass

    @staticmethod
    def launch(config, trial_dir, log_dir, env, workers, node, pins, backend, timeout_s) -> Launch:
        argv = command(
            trial_dir / "config.json", workers, log_dir, free_port(), bind_cores=pins, node=node
        )
        local = node.launch.local_workers if node else workers
        full_env = environment(env, config, local, timeout_s)
        warmed = warm_up(backend, full_env, str(PROJECT_ROOT))  # before the trial's clock starts
        done = (lambda: outputs_complete(trial_dir, workers)) if workers > 1 and not node else None
        return Launch(argv, full_env, trial_dir, msrun=workers > 1, warmed=warmed, done=done)

    @staticmethod
    def finish(config: dict, trial_dir: Path) -> Result | None:
        return None  # the trainer writes its metrics.json itself


for _run in (TrainerRun, MindFormersRun):  # the built-in programs' run sides
    register_run(_run)


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
    run = run_of(config)
    launch = run.launch(config, trial_dir, log_dir, env, workers, node, pins, backend, timeout_s)
    started, handed_over = time.monotonic(), time.time()
    with open(log_dir / ("msrun.log" if launch.msrun else "worker_0.log"), "w") as out:
        # msrun does not say how it was started, nor which devices Ray gave: the log does
        given = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
        out.write(f"launched: {' '.join(given + [shlex.join(launch.argv)])}\n{launch.warmed}")
        out.flush()
        # Its own session (a terminal's Ctrl-C is the driver's to handle), and it dies with
        # this thread, even when the whole driver is SIGKILLed.
        proc = subprocess.Popen(
            launch.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=launch.cwd,
            env=launch.env,
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
                launcher=proc.pid if launch.msrun else None,
                poll=launch.poll,
                done=launch.done,
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
    returncode = 0 if finished else proc.returncode  # msrun stopped once its workers were done
    failed = run.finish(config, trial_dir) if returncode == 0 else None
    if failed is not None:
        failed.run_s = run_s
        return failed
    result = classify(returncode, trial_dir, log_dir, run_s, backend, dict(tree.known))
    result.metrics = with_launch_and_teardown(result.metrics, handed_over, ended)
    return result


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
