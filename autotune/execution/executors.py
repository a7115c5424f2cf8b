"""Ways of running a trial: one executor per backend kind, all with the same face.

Contract: an executor runs the candidates it is handed and reports how each ended; it never
decides what to try next, never writes the study, and never looks at other trials. The study's
loop (`autotune.study.loop`) drives every executor the same way:

- ``check(devices)`` raises SpecError when a trial of ``devices`` could never be placed;
  ``capacity()`` devices that may run at once; ``submit(job)`` starts an `autotune.jobs.Job`;
  ``wait(timeout_s)`` returns ``(number, Result)`` of the trials finished since the last call
  (``[]`` when none finished in time); ``cancel(number)`` stops one running trial (it is not reported);
  ``cancel_all()`` stops every running one and returns their numbers;
  ``continue_from(runs)`` says how often each candidate ran before this session (a resumed
  study: a replay table goes on with each candidate's next row; the others need not know).
  Executors are context managers (the dispatched one starts and stops Ray).
- ``measures``: results are measurements (calibrate the cost model from them); ``noisy``: a
  second run of the same candidate may differ (a confirm phase makes sense); ``virtual_clock``:
  a trial takes no time here (only the seconds its result says it took); ``instant``: a trial's
  result is :meth:`~InstantExecutor.evaluate` of its candidate, known the moment it is asked;
  ``steps_dir(n)``: the folder where trial ``n`` writes its ``steps.jsonl`` while it runs, or
  None (no pruning).

:class:`SimulateExecutor` answers with the cost model's estimate, :class:`ReplayExecutor` with
the row of a replay table (`autotune.execution.replay`), :class:`DispatchedExecutor` runs the
study's trial program for real through Ray (`autotune.execution.dispatch`), each trial as that
program's run side prepares it (`autotune.execution.program_run`: autotune's trainer in warm
pools with its compile cache, MindFormers' ``run_mindformer.py`` in processes of its own).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
from pathlib import Path

from autotune.execution.program_run import COMPILE_CACHE, RUNS
from autotune.execution.replay import MISSING
from autotune.execution.runner import fresh_trial_dir
from autotune.jobs import Job, Result
from autotune.spec.backends import backend_of

FRESH_TRIALS = "AUTOTUNE_FRESH_TRIALS"  # "1": every real trial in processes of its own


def simulated_metrics(estimate) -> dict:
    """A simulate-backend trial: the cost model's estimate stored as the trial's metrics."""
    return {
        "goodput": estimate.samples_per_s,
        "throughput": estimate.samples_per_s,
        "step_time_ms": estimate.step_time_s * 1000,
        "peak_memory_mb": estimate.memory_gb_per_device * 1024,
    }


class InstantExecutor:
    """An executor whose trial is a lookup: :meth:`evaluate` gives the result the moment it is
    asked. One trial at a time (every trial uses the whole pool), so the sampler sees each
    result before the next ask, as it would on the real pool with one trial in flight."""

    measures = noisy = False
    instant = virtual_clock = True

    def __init__(self, spec):
        self.spec = spec
        self._done: list[tuple[int, Result]] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._done.clear()

    def capacity(self) -> int:
        return self.spec.cluster.devices

    def check(self, devices: int) -> None:
        pass  # a lookup places nothing

    def submit(self, job: Job) -> None:
        self._done.append((job.number, self.evaluate(job.candidate, job.estimate)))

    def evaluate(self, candidate, estimate) -> Result:
        """The result of ``candidate`` (judged feasible with ``estimate``)."""
        raise NotImplementedError

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, Result]]:
        done, self._done = self._done, []
        return done

    def cancel(self, number: int) -> None:
        self._done = [(n, r) for n, r in self._done if n != number]

    def cancel_all(self) -> list[int]:
        return []  # nothing is ever running

    def continue_from(self, runs: dict) -> None:
        pass  # an estimate is the same every time

    def steps_dir(self, number: int) -> Path | None:
        return None


class SimulateExecutor(InstantExecutor):
    """backend ``simulate``: the trial is the cost model's estimate."""

    def evaluate(self, candidate, estimate) -> Result:
        return Result("ok", simulated_metrics(estimate))


class ReplayExecutor(InstantExecutor):
    """backend ``replay``: a trial is the next row of its candidate in the replay table
    (`autotune.execution.replay`); a candidate not in the table is ``infeasible``. Trials run
    side by side as ``cluster.pool_devices`` holds them, on a virtual clock: each ends the
    ``run_s`` of its row after it started (a row without one ends at once), the earliest first.
    Its runs are ``noisy`` when some candidate has several rows."""

    measures = True

    def __init__(self, spec, table):
        super().__init__(spec)
        self.table = table
        self.noisy = table.varies
        self.runs: dict = {}  # candidate → its runs so far in this study (its next row)
        self.clock = 0.0  # virtual seconds since the session started
        self._running: list = []  # heap of (ends at, order, number, result)
        self._order = itertools.count()

    def capacity(self) -> int:
        return self.spec.cluster.pool_devices or self.spec.cluster.devices

    def continue_from(self, runs: dict) -> None:
        self.runs = dict(runs)

    def evaluate(self, candidate, estimate) -> Result:
        rows = self.table.rows_of(candidate)
        if not rows:
            return Result("infeasible", detail=MISSING)
        taken = self.runs.get(candidate, 0)
        self.runs[candidate] = taken + 1
        row = rows[taken % len(rows)]
        return Result(
            row.outcome, dict(row.metrics), row.detail, row.infrastructure, run_s=row.run_s
        )

    def submit(self, job: Job) -> None:
        result = self.evaluate(job.candidate, job.estimate)
        heapq.heappush(
            self._running,
            (self.clock + (result.run_s or 0.0), next(self._order), job.number, result),
        )

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, Result]]:
        """The trials that end first on the virtual clock (every one that ends then)."""
        done = []
        while self._running and (not done or self._running[0][0] == self.clock):
            self.clock, _, number, result = heapq.heappop(self._running)
            done.append((number, result))
        return done

    def cancel(self, number: int) -> None:
        self._running = [entry for entry in self._running if entry[2] != number]
        heapq.heapify(self._running)

    def cancel_all(self) -> list[int]:
        numbers = [entry[2] for entry in self._running]
        self._running.clear()
        return numbers


class DispatchedExecutor:
    """backends ``cpu``, ``gpu``, ``ascend``: the real trial program, placed by Ray."""

    measures = noisy = True
    instant = virtual_clock = False

    def __init__(self, spec, study_dir: Path, ray_address: str | None = None):
        from autotune import costmodel

        self.spec, self.study_dir, self.ray_address = spec, study_dir, ray_address
        # On CPU a device is a worker process: its RSS budget is enforced by the runner. A
        # device's own memory is its runtime's to enforce (an OOM in the worker's log).
        profile = costmodel.resolve_profile(spec.cluster)
        device_memory = backend_of(spec.cluster.backend).device_memory
        self.memory_mb = None if device_memory else profile.memory_gb * 1024
        # ... which a GPU/Ascend trial caps at the screen's budget (set_memory's max_size)
        self.device_memory = costmodel.device_memory_cap(spec.cluster)
        # compiled graphs, reused by trials of the same graph (autotune.train.runtime.compile_cache):
        # beside the studies, so studies of one model share them
        self.compile_cache = (
            None
            if os.environ.get(COMPILE_CACHE) == "0"
            else (study_dir.parent / ".compile-cache").resolve()
        )
        # the trial program's run side: what its trials need (`autotune.execution.program_run`)
        self.run = RUNS[spec.trial.program](spec, study_dir)
        self._dispatcher = None

    def __enter__(self):
        from autotune.execution.dispatch import Dispatcher

        cluster = self.spec.cluster
        # trials of one size run one after another in workers that stay up (execution.warm),
        # unless AUTOTUNE_FRESH_TRIALS=1 asks for a fresh launch per trial
        fresh = os.environ.get(FRESH_TRIALS) == "1" or not self.run.warm_pools
        warm = None if fresh else self.study_dir.parent / ".pools"
        self.run.start()
        self._dispatcher = Dispatcher(
            backend_of(cluster.backend),
            cluster.devices_per_node,
            cluster.devices,
            self.ray_address,
            warm,
        ).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatcher.__exit__(*exc)

    def capacity(self) -> int:
        return self._dispatcher.cluster.capacity()

    def check(self, devices: int) -> None:
        self._dispatcher.cluster.check(devices)

    def steps_dir(self, number: int) -> Path:
        return self.study_dir / str(number)

    def submit(self, job: Job) -> None:
        from autotune.train.config import trial_config

        trial_dir = self.steps_dir(job.number)
        fresh_trial_dir(trial_dir)  # before the loop watches its steps.jsonl
        config = trial_config(
            self.spec,
            job.candidate,
            study=self.spec.study,
            number=job.number,
            out_dir=trial_dir.resolve(),
            steps=self.spec.trial.steps,
            measure_after=self.spec.trial.measure_after,
            stop_rule=self.spec.stop_rule(),
            device_memory=self.device_memory,
            compile_cache=self.compile_cache if self.run.compile_cache else None,
        )
        config["program"] = self.spec.trial.program  # the runner launches it by its run side
        self.run.configure(job, trial_dir, config)
        # a warm pool runs one size of trial: by the cost model's own estimate, which the
        # study's calibration (refit after every measurement) would move between trials
        from autotune import costmodel

        estimated = costmodel.estimate(self.spec, job.candidate).memory_gb_per_device * 1024
        self._dispatcher.submit(
            job.number,
            config,
            trial_dir,
            job.candidate.devices,
            self.spec.trial.timeout_s,
            self.memory_mb,
            estimated if math.isfinite(estimated) else None,
        )

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, Result]]:
        done = self._dispatcher.wait(timeout_s=timeout_s)
        for number, _ in done:
            self.run.ended(number)
        return done

    def cancel(self, number: int) -> None:
        self.run.ended(number)
        self._dispatcher.cancel(number)

    def cancel_all(self) -> list[int]:
        numbers = self._dispatcher.cancel_all()
        for number in numbers:
            self.run.ended(number)
        return numbers

    def continue_from(self, runs: dict) -> None:
        pass  # a real run measures anew


def make_executor(spec, study_dir: Path, ray_address: str | None = None, replay_table=None):
    """The executor of ``spec.cluster.backend`` (not entered yet)."""
    kind = backend_of(spec.cluster.backend).kind
    if kind == "estimate":
        return SimulateExecutor(spec)
    if kind == "table":
        return ReplayExecutor(spec, replay_table)
    return DispatchedExecutor(spec, study_dir, ray_address)
