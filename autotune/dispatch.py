"""Ray dispatch: place each trial on the device pool and hand back its result.

Contract: a :class:`Dispatcher` runs :func:`autotune.runner.run_trial` as a Ray task holding
``devices`` CPUs, GPUs or Ascend NPUs (by backend). It decides nothing about what to try: the
search loop submits, and collects :class:`Finished` records with :meth:`Dispatcher.wait`.
A trial Ray could not finish — the worker running it died, its result was lost, any error of
Ray or of the runner itself — comes back as an ``error`` with ``infrastructure`` set: not the
candidate's fault. Ray does not retry tasks itself (``max_retries=0``): the search loop does,
once, as a trial of its own (`autotune.failures`). When the driver's own connection to the
cluster is gone (the local raylet died), no trial can run any more: :meth:`Dispatcher.wait`
raises :class:`ClusterLost` instead, and :meth:`Dispatcher.cancel_all` then names every trial
that was running, so the search loop records them as interrupted and a resume reruns them.
An embedded Ray is quiet, bound to loopback and shut down (no processes left) on close. If the
driver dies instead (SIGKILL included), nothing of the study outlives it by more than a few
seconds: Ray ends its raylet and GCS with the driver, a running trial's processes die with the
Ray worker that launched them (`autotune.runner`), and an `autotune.processes.Guard` ends the
rest — Ray's agents, which otherwise wait 60 s on the dead GCS — and removes Ray's temp folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.processes import Guard
from autotune.runner import TrialResult, run_trial


class ClusterLost(RuntimeError):
    """The driver lost its Ray cluster (the local raylet died): nothing more can run."""


@dataclass
class Finished:
    number: int
    result: TrialResult
    queued_s: float   # submit → the Ray task started running (waiting for devices)
    wall_s: float     # submit → result back in the driver


def _task(config: dict, trial_dir: str, timeout_s: float, memory_limit_mb, workers: int):
    started = time.time()
    result = run_trial(config, Path(trial_dir), timeout_s, memory_limit_mb, workers)
    return started, result


def resource_options(backend: str, devices: int) -> dict:
    """Ray resources one trial of ``devices`` devices asks for on ``backend``."""
    if backend == "gpu":
        return {"num_gpus": devices, "num_cpus": 1}
    if backend == "ascend":
        return {"resources": {"NPU": devices}, "num_cpus": 1}
    return {"num_cpus": devices}


class Dispatcher:
    """Submits trials to Ray and waits for them. Use as a context manager."""

    def __init__(self, backend: str, pool_devices: int, address: str | None = None):
        self.backend, self.pool_devices, self.address = backend, pool_devices, address
        self._pending: dict = {}   # ObjectRef → (number, submitted_at)
        self._lost: list[int] = []  # trials running when the cluster went away
        self._temp_dir: str | None = None
        self._guard: Guard | None = None

    def __enter__(self) -> "Dispatcher":
        # Ray reads these at import and init: no auth-token file or warning, no log spam.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not self.address:
            # An embedded Ray serves this machine only: this switch makes Ray take the loopback
            # address as the node IP, so GCS, raylet and object manager listen on 127.0.0.1.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        self._ray = ray
        common = dict(logging_level="ERROR", log_to_driver=False, configure_logging=True)
        if self.address:
            ray.init(address=self.address, **common)
        else:
            self._temp_dir = tempfile.mkdtemp(prefix="autotune-ray-")
            self._guard = Guard(remove=[self._temp_dir]).__enter__()
            pool = {"num_cpus": self.pool_devices} if self.backend == "cpu" else {}
            try:
                ray.init(include_dashboard=False, _temp_dir=self._temp_dir, **pool, **common)
            except BaseException:
                self._close_embedded()
                raise
        self._remote = ray.remote(_task)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.cancel_all()
            self._ray.shutdown()
        finally:
            self._close_embedded()

    def _close_embedded(self) -> None:
        if self._guard:
            self._guard.__exit__(None, None, None)
            self._guard = None
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def capacity(self) -> int:
        """Devices of this backend's kind in the Ray cluster: how many trial devices fit at once
        (embedded on CPU: ``pool_devices``, so trials never share the cores they measure)."""
        kind = {"gpu": "GPU", "ascend": "NPU"}.get(self.backend, "CPU")
        return int(self._ray.cluster_resources().get(kind, 0))

    def submit(self, number: int, config: dict, trial_dir: Path, devices: int,
               timeout_s: float, memory_limit_mb: float | None) -> None:
        options = resource_options(self.backend, devices)
        # No Ray retries: a task whose worker died comes back as an infrastructure error, and
        # the search loop runs the candidate again under a new trial number, with the failed
        # attempt on record (a Ray retry would rerun it unseen, into the same trial folder).
        ref = self._remote.options(max_retries=0, **options).remote(
            config, str(trial_dir), timeout_s, memory_limit_mb, devices)
        self._pending[ref] = (number, time.time())

    def wait(self, timeout_s: float | None = None) -> list[Finished]:
        """Block until at least one trial finishes (or ``timeout_s``); return those finished."""
        if not self._pending:
            return []
        ready, _ = self._ray.wait(list(self._pending), num_returns=1, timeout=timeout_s)
        done = []
        for ref in ready:
            number, submitted = self._pending.pop(ref)
            now = time.time()
            try:
                started, result = self._ray.get(ref)
            except self._ray.exceptions.LocalRayletDiedError as exc:
                self._lost.append(number)
                raise ClusterLost(f"the Ray cluster is gone ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
            except Exception as exc:  # Ray lost the task: its worker or node died, ...
                started = submitted
                result = TrialResult("error", detail=f"infrastructure: Ray: {type(exc).__name__}: "
                                     f"{exc}", infrastructure=True)
            done.append(Finished(number, result, max(0.0, started - submitted), now - submitted))
        return done

    def cancel(self, number: int) -> None:
        """Stop one running trial (its process group is killed); it is not reported by wait."""
        ref = next(r for r, (n, _) in self._pending.items() if n == number)
        self._ray.cancel(ref, force=False)
        del self._pending[ref]

    def cancel_all(self) -> list[int]:
        """Cancel every running trial (their process groups are killed); return their numbers,
        those lost with the cluster (`ClusterLost`) included."""
        numbers = self._lost + [number for number, _ in self._pending.values()]
        try:
            for ref in self._pending:
                self._ray.cancel(ref, force=False)
            if self._pending:
                self._ray.wait(list(self._pending), num_returns=len(self._pending), timeout=15)
        except Exception:  # noqa: BLE001  (a cluster that is gone cancels nothing: the
            pass           # trials' processes died with their raylet's workers)
        self._pending.clear()
        self._lost = []
        return numbers
