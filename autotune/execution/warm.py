"""Trials of one size run one after another in workers that stay up.

Contract: a :class:`WarmPool` runs trials of ``workers`` ranks on this node in trial-program
processes it keeps between trials (`autotune.train.runtime.serve`: one msrun launch, or one process for
a single rank), so MindSpore's import, msrun's start, the cluster join and communication init
are paid once per pool, not once per trial. :meth:`WarmPool.run` has the face and the outcomes
of `autotune.execution.runner.run_trial` — ``config.json`` written, the folder cleared, the
timeout (from when a rank starts the candidate, so the pool's first trial does not spend it on
the workers' start-up: `autotune.execution.runner.trial_clock`), the memory budget and a cancel (KeyboardInterrupt) enforced on the trial's processes,
an `autotune.jobs.Result` read by `autotune.execution.classify` from the trial's own folder and
logs — and says where the time went (``launch_s`` … ``teardown_s``,
`autotune.execution.launch_time`).

A trial that does not end well retires the pool: a timeout, a worker over the budget, a cancel,
a crash, or any rank whose trial ended with a non-zero code (it may leave a collective half
done). Its processes are stopped; the next trial starts fresh ones. A trial that ended ok or
diverged leaves the workers up for the next — of the same size: a pool runs trials whose
estimated memory per device (the cost model's, ``memory_mb``) is within `SAME_SIZE` of its
first trial's, and retires before a trial of another size (or of no estimate); on a backend
whose process groups hold device memory outside the pool (``Backend.pool_per_layout``: the
accelerators' communicators, which ``destroy_group`` cannot free on GPU), it also runs one layout
(dp, tp, pp) and retires before another, so a trial holds the communicators of its own layout
only, as in processes of its own. MindSpore's CPU
memory pool keeps, after every release, the memory a trial's activations took (measured: ~0.5 GB
after a large one, reused by the next trial unseen), so a smaller trial after a larger one would
read the larger one's peak and answer to the memory budget for it; in trials of one size it is
what each trial needs anyway (docs/mindspore-cpu.md, "Warm workers"). What the ranks keep beyond
their state after the pool's first trial (``leftover_mb``) is taken off each trial's peak by the
ranks and off the resident set the budget judges here. Should the pool's owner die, its processes die
with it: they are started from a thread that lives as long as they do (``PR_SET_PDEATHSIG``,
`autotune.train.runtime.lifetime`), and msrun's workers die with msrun.

Where a pool's own files go: ``root`` (the handovers, msrun's logs of what the workers print
between trials); a pool that cannot start copies its logs into the trial's ``logs/pool/``, where
`autotune.execution.classify` reads them (no rank started the candidate: the infrastructure's).
On a backend that warms each node's kernel JIT cache (`autotune.execution.warmup`), the workers'
start waits for it, before the trial's clock starts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

from autotune.execution.classify import classify, stopped_in_probe
from autotune.execution.environment import PROJECT_ROOT, environment
from autotune.execution.launch_time import with_launch_and_teardown
from autotune.execution.processes import ProcessTree
from autotune.execution.runner import (
    POLL_S,
    STOP_GRACE_S,
    command,
    free_port,
    fresh_trial_dir,
    trial_clock,
)
from autotune.execution.warmup import warm_up
from autotune.files import write_json
from autotune.jobs import Result
from autotune.spec.backends import DEFAULT_BACKEND, backend_of
from autotune.train.runtime.lifetime import die_with_parent_hook

FAILED_RANKS_GRACE_S = 1.0  # after a rank's failure, for the others to say how they ended
CLOSE_WAIT_S = 5.0  # a pool told to stop gets this long before it is stopped
# A pool whose workers keep more than this share of the memory budget resident beyond what they
# held after its first trial (MindSpore keeps some of every trial: `autotune.train.runtime.serve`)
# retires after the trial.
RETIRE_LEFTOVER = 0.1
# Trials whose estimated memory per device differs by more than this share (of the smaller) are of
# another size: a pool runs one size (see the module doc). The tiny GPT's candidates are
# estimated within 1.2 % of each other (`autotune estimate examples/tiny_gpt.yaml --set …`).
SAME_SIZE = 0.03


def _layout(config: dict) -> tuple:
    knobs = config["knobs"]
    return knobs["dp"], knobs["tp"], knobs["pp"]


class WarmPool:
    """Workers of ``workers`` ranks for one backend on this node (see the module doc). ``env``:
    variables every worker gets (the devices Ray gave)."""

    def __init__(self, root: Path, workers: int, env: dict | None = None):
        self.root, self.workers, self.env = Path(root), workers, dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.tree: ProcessTree | None = None
        self.trials = 0  # trials handed to the processes running now
        self.argv: list[str] = []
        self.started_at = 0.0
        self.size_mb: float | None = None  # the estimated memory of the trials they run
        self.layout: tuple | None = None  # (dp, tp, pp) of the trials they run
        self.warmed = ""  # the warm-up's line for the next trial's log
        self.leftover_mb = 0.0  # what they keep beyond their state after their first trial

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self, config: dict, timeout_s: float) -> None:
        """Start the workers (from a thread that lives as long as they do), the node's JIT
        cache warmed first where the backend asks for it; ``timeout_s``: their trials' (the
        collective library's timeouts follow it: `autotune.execution.environment`)."""
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "logs").mkdir(parents=True)
        backend = backend_of(config.get("backend", DEFAULT_BACKEND))
        env = environment(self.env, config, self.workers, timeout_s)
        self.warmed = warm_up(backend, env, str(PROJECT_ROOT))
        self.argv = command(
            ["--serve", self.root],
            self.workers,
            self.root / "logs",
            free_port(),
            bind_cores=backend.pins_cores,
        )
        started = threading.Event()

        def launch_and_wait():
            with open(self.root / "logs" / "launcher.log", "w") as out:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.root,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent_hook(),
                )
                started.set()
                self.proc.wait()

        threading.Thread(target=launch_and_wait, daemon=True, name="warm-pool").start()
        started.wait()
        self.tree = ProcessTree(self.proc.pid)
        self.trials, self.started_at, self.leftover_mb = 0, time.time(), 0.0

    def _same_size(self, memory_mb: float | None) -> bool:
        """Whether a trial estimated at ``memory_mb`` is of the size the running processes run."""
        if memory_mb is None or self.size_mb is None:
            return False
        return abs(memory_mb - self.size_mb) <= SAME_SIZE * min(memory_mb, self.size_mb)

    def retire_for(self, config: dict, memory_mb: float | None) -> str:
        """Why the running processes cannot run the trial of ``config`` estimated at
        ``memory_mb`` (see the module doc), as the trial log's line; "" when they can."""
        if not self._same_size(memory_mb):
            held = "an unknown size" if self.size_mb is None else f"~{self.size_mb:.0f} MB"
            this = "not estimated" if memory_mb is None else f"estimated at {memory_mb:.0f} MB"
            return (
                f"fresh workers: the pool's processes ran trials of {held} a device, this "
                f"one is {this} (a trial after one of another size would reuse, unseen, "
                "the memory MindSpore kept of it)\n"
            )
        layout = _layout(config)
        if (
            backend_of(config.get("backend", DEFAULT_BACKEND)).pool_per_layout
            and layout != self.layout
        ):
            return (
                f"fresh workers: the pool's processes ran the layout dp·tp·pp = "
                f"{'·'.join(map(str, self.layout or ()))}, this trial is "
                f"{'·'.join(map(str, layout))} (their process groups hold device memory "
                "outside the pool, which another layout's trial would carry)\n"
            )
        return ""

    def run(
        self,
        config: dict,
        trial_dir: Path,
        timeout_s: float,
        memory_limit_mb: float | None,
        memory_mb: float | None = None,
    ) -> Result:
        """Run the trial of ``config`` in ``trial_dir`` (see the module doc); ``memory_mb``: the
        cost model's estimate of its memory per device (None: not known, so of no size the
        running processes run)."""
        backend = backend_of(config.get("backend", DEFAULT_BACKEND))
        trial_dir = trial_dir.resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        config_path = trial_dir / "config.json"
        write_json(config_path, config)
        log_dir = trial_dir / "logs"
        fresh_trial_dir(trial_dir, log_dir)
        retired = self.retire_for(config, memory_mb) if self.up else ""
        if retired:
            self.close()
        if not self.up:
            self._start(config, timeout_s)
            self.size_mb, self.layout = memory_mb, _layout(config)
        started, handed_over = time.monotonic(), time.time()
        given = [f"{name}={shlex.quote(value)}" for name, value in self.env.items()]
        # the trial's launch log, as a fresh launch writes it: msrun's, or the one worker's
        with open(log_dir / ("worker_0.log" if self.workers == 1 else "msrun.log"), "w") as out:
            out.write(f"launched: {' '.join(given + [shlex.join(self.argv)])}\n")
            out.write(retired + self.warmed)
            self.warmed = ""
            out.write(
                f"warm workers: trial {self.trials} of the processes started "
                f"{time.time() - self.started_at:.1f} s ago (pid {self.proc.pid})\n"
            )
        number = self.trials
        write_json(
            self.root / f"trial.{number}.json",
            {"config": str(config_path), "log_dir": str(log_dir)},
        )
        self.trials += 1
        try:
            outcome, detail, stop_s, said = self._supervise(
                number, started, trial_clock(log_dir, timeout_s), memory_limit_mb
            )
        except BaseException:  # cancelled (Ctrl-C, a prune): leave nothing running
            self.close(grace_s=0)
            raise
        run_s, ended = time.monotonic() - started, time.time()
        if outcome:
            self.close(grace_s=0)
            trained = stopped_in_probe(trial_dir, outcome, detail, run_s, stop_s)
            if trained is not None:
                trained.metrics = with_launch_and_teardown(trained.metrics, handed_over, ended)
                return trained
            return Result(
                outcome,
                detail=detail,
                run_s=run_s,
                stop_s=stop_s,
                infrastructure=outcome == "error",
            )
        code = max((s["code"] for s in said.values()), default=None)
        if code == 0 and len(said) == self.workers:
            result = classify(0, trial_dir, log_dir, run_s, backend, dict(self.tree.known))
            if result.outcome in ("ok", "diverged"):
                for path in [
                    self.root / f"trial.{number}.json",
                    *(self.root / f"done.{number}.{r}" for r in range(self.workers)),
                ]:
                    path.unlink(missing_ok=True)
                result.metrics = with_launch_and_teardown(result.metrics, handed_over, ended)
                leftovers = [s.get("leftover_mb", 0.0) for s in said.values()]
                self.leftover_mb = min(leftovers)  # the next trial's budget: each rank's own
                if memory_limit_mb and max(leftovers) > RETIRE_LEFTOVER * memory_limit_mb:
                    self.close()
                return result
        known = dict(self.tree.known)
        returncode = code if code else self.proc.poll()
        self.close(grace_s=0)
        if not said:  # no rank got to the trial: what the pool said is the trial's evidence
            shutil.copytree(self.root / "logs", log_dir / "pool", dirs_exist_ok=True)
        return classify(
            returncode if returncode is not None else 1,
            trial_dir,
            log_dir,
            time.monotonic() - started,
            backend,
            known,
        )

    def _said(self, number: int) -> dict:
        """rank → how trial ``number`` ended there (``code``, ``leftover_mb``), for the ranks
        that said so."""
        said = {}
        for rank in range(self.workers):
            path = self.root / f"done.{number}.{rank}"
            if path.exists():
                said[rank] = json.loads(path.read_text())
        return said

    def _supervise(self, number: int, started: float, clock, memory_limit_mb: float | None):
        """Wait until every rank said how trial ``number`` ended, a rank failed (and the others
        had a moment to say so too), or the processes ended; stop them when the trial's
        ``clock`` (`autotune.execution.runner.trial_clock`: its timeout from when a rank started
        the candidate, the launch limit before) says so or a worker is over the memory budget.
        Returns (outcome, detail, seconds to the decision, what the ranks said) with an outcome
        only for a stopped trial."""
        launcher = self.proc.pid if self.workers > 1 else None
        failed_at = None
        while True:
            said = self._said(number)
            if len(said) == self.workers:
                return "", "", None, said
            if any(s["code"] for s in said.values()):
                failed_at = failed_at or time.monotonic()
                if time.monotonic() - failed_at > FAILED_RANKS_GRACE_S:
                    return "", "", None, said
            if not self.up:
                return "", "", None, self._said(number)
            self.tree.refresh()
            now = time.monotonic() - started
            outcome, detail = clock(now)
            if outcome:
                return outcome, detail, now, said
            if memory_limit_mb:
                pid, rss = self.tree.largest_rss(exclude=launcher)
                if rss - self.leftover_mb > memory_limit_mb:  # the trial's own memory
                    kept = (
                        f", {self.leftover_mb:.0f} MB of it kept from earlier trials"
                        if self.leftover_mb
                        else ""
                    )
                    return (
                        "oom",
                        (
                            f"a worker reached {rss:.0f} MB{kept}, over the "
                            f"{memory_limit_mb:.0f} MB device budget (pid {pid}, "
                            f"{now:.1f} s in)"
                        ),
                        now,
                        said,
                    )
            time.sleep(POLL_S / 5)

    def close(self, grace_s: float = CLOSE_WAIT_S) -> None:
        """Stop the workers: told to (``grace_s`` to exit), then stopped; nothing of them
        outlives this call."""
        if self.proc is None:
            return
        if grace_s and self.up:
            (self.root / "stop").touch()
            deadline = time.monotonic() + grace_s
            while self.up and time.monotonic() < deadline:
                time.sleep(0.05)
        self.tree.stop(0 if not grace_s else STOP_GRACE_S, reap=self.proc.poll)
        self.proc = None
