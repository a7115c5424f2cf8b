"""Ways of running a trial: one executor per backend kind, all with the same face.

Contract: an executor runs the candidates it is handed and reports how each ended; it never
decides what to try next, never writes the study, and never looks at other trials. The study's
loop (`autotune.study.loop`) drives every executor the same way:

- ``check(devices)`` raises SpecError when a trial of ``devices`` could never be placed;
  ``capacity()`` devices that may run at once; ``submit(job)`` starts an `autotune.jobs.Job`;
  ``wait(timeout_s)`` returns ``(number, Result)`` of the trials finished since the last call
  (``[]`` when none finished in time); ``cancel(number)`` stops one running trial (it is not reported);
  ``cancel_all()`` stops every running one and returns their numbers. Executors are context
  managers (the dispatched one starts and stops Ray).
- ``measures``: results are measurements (calibrate the cost model from them); ``noisy``: a
  second run of the same candidate may differ (a confirm phase makes sense); ``virtual_clock``:
  a trial takes no time here (only the seconds its result says it took); ``instant``: a trial's
  result is :meth:`~InstantExecutor.evaluate` of its candidate, known the moment it is asked;
  ``steps_dir(n)``: the folder where trial ``n`` writes its ``steps.jsonl`` while it runs, or
  None (no pruning).

:class:`SimulateExecutor` answers with the cost model's estimate, :class:`ReplayExecutor` with
the row of a replay table (`autotune.execution.replay`), :class:`DispatchedExecutor` runs the
real MindSpore program through Ray (`autotune.execution.dispatch`).
"""

from __future__ import annotations

from pathlib import Path

from autotune.jobs import Job, Result
from autotune.spec.backends import backend_of


def simulated_metrics(estimate) -> dict:
    """A simulate-backend trial: the cost model's estimate stored as the trial's metrics."""
    return {"goodput": estimate.samples_per_s, "throughput": estimate.samples_per_s,
            "step_time_ms": estimate.step_time_s * 1000,
            "peak_memory_mb": estimate.memory_gb_per_device * 1024}


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

    def steps_dir(self, number: int) -> Path | None:
        return None


class SimulateExecutor(InstantExecutor):
    """backend ``simulate``: the trial is the cost model's estimate."""

    def evaluate(self, candidate, estimate) -> Result:
        return Result("ok", simulated_metrics(estimate))


class ReplayExecutor(InstantExecutor):
    """backend ``replay``: the trial is its candidate's row of the replay table; a candidate
    not in the table is ``infeasible``."""

    measures = True

    def __init__(self, spec, table):
        super().__init__(spec)
        self.table = table

    def evaluate(self, candidate, estimate) -> Result:
        row = self.table.lookup(candidate)
        if row is None:
            return Result("infeasible", detail="not in the replay table")
        return Result(row.outcome, dict(row.metrics), row.detail, run_s=row.run_s)


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
        self._dispatcher = None

    def __enter__(self):
        from autotune.execution.dispatch import Dispatcher

        cluster = self.spec.cluster
        self._dispatcher = Dispatcher(backend_of(cluster.backend), cluster.devices_per_node,
                                      cluster.devices, self.ray_address).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatcher.__exit__(*exc)

    def capacity(self) -> int:
        return self._dispatcher.capacity()

    def check(self, devices: int) -> None:
        self._dispatcher.check(devices)

    def steps_dir(self, number: int) -> Path:
        return self.study_dir / str(number)

    def submit(self, job: Job) -> None:
        from autotune.train.config import trial_config

        trial_dir = self.steps_dir(job.number)
        config = trial_config(self.spec, job.candidate, study=self.spec.study, number=job.number,
                              out_dir=trial_dir.resolve(), steps=self.spec.trial.steps,
                              measure_after=self.spec.trial.measure_after)
        self._dispatcher.submit(job.number, config, trial_dir, job.candidate.devices,
                                self.spec.trial.timeout_s, self.memory_mb)

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, Result]]:
        return self._dispatcher.wait(timeout_s=timeout_s)

    def cancel(self, number: int) -> None:
        self._dispatcher.cancel(number)

    def cancel_all(self) -> list[int]:
        return self._dispatcher.cancel_all()


def make_executor(spec, study_dir: Path, ray_address: str | None = None, replay_table=None):
    """The executor of ``spec.cluster.backend`` (not entered yet)."""
    kind = backend_of(spec.cluster.backend).kind
    if kind == "estimate":
        return SimulateExecutor(spec)
    if kind == "table":
        return ReplayExecutor(spec, replay_table)
    return DispatchedExecutor(spec, study_dir, ray_address)
