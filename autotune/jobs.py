"""What passes between choosing a trial and running it: a :class:`Job` in, a :class:`Result` out.

Contract: the two value types the search side (`autotune.search`, `autotune.study`) and the
execution side (`autotune.execution`) share; neither side imports the other.

- A :class:`Job` is a trial to run: the live Optuna trial (opaque to executors, which read only
  its number), the candidate, the cost model's estimate it was judged with, the driver's seconds
  spent proposing it, and — for an answer that needs no run (a candidate already tried, one
  running elsewhere, an infeasible one) — the :class:`Result` it ``settled`` with.
- A :class:`Result` is how a trial ended: one of :data:`OUTCOMES`, the trial's
  :data:`METRICS` (``ok`` and ``diverged`` runs), a ``detail`` (one line of reason, then a log
  tail), whether an ``error`` was the infrastructure's rather than the candidate's, where its
  time went, and, for a settled answer, the trial it repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# pruned: stopped while running because it was clearly slower than the best (autotune.stopping)
OUTCOMES = ("ok", "infeasible", "oom", "diverged", "timeout", "pruned", "error", "interrupted")
# The metrics a trial reports (its metrics.json, `autotune.train.metrics`) and the study stores
# under their own names.
METRICS = (
    "goodput",
    "throughput",
    "step_time_ms",
    "step_time_ci",
    "peak_memory_mb",
    "overflow_steps",
    "backoff_steps",
    "overflow_rate",
    "underflow_share",
    "underflow_bound",
    "underflow_probed",
    "loss_first",
    "loss_last",
    "diverged",
    "compile_s",
    "launch_s",
    "init_s",
    "first_step_s",
    "excluded_steps_s",
    "steps_s",
    "probe_s",
    "teardown_s",
    "router_imbalance",
    "measurement",
)
# Where a trial's run time went, in order (`autotune.train.metrics`, `autotune.execution.launch_time`);
# its fixed time is the run time less ``steps_s``, the time it measures.
TIME_PARTS = (
    "launch_s",
    "init_s",
    "first_step_s",
    "excluded_steps_s",
    "steps_s",
    "probe_s",
    "teardown_s",
)
RUNNING = "running"  # a settled repeat of a trial still running: answered when that one ends
TIMING = ("run_s", "wall_s", "queued_s")


@dataclass
class Result:
    """How one trial ended (see the module doc)."""

    outcome: str
    metrics: dict = field(default_factory=dict)
    detail: str = ""  # why it failed: one line of reason, then the log tail
    infrastructure: bool = False  # an error that was not the candidate's own
    run_s: float | None = None  # launch → the last process of the trial gone (None: no run)
    stop_s: float | None = None  # launch → when the runner decided to stop it (timeout, oom)
    queued_s: float | None = None  # submit → the trial started (waiting for devices)
    wall_s: float | None = None  # submit → its result back in the driver
    repeat_of: int | None = None  # settled from this earlier trial of the same candidate

    def timing(self) -> dict:
        """The seconds this result measured, rounded, under their attr names (none: no run)."""
        return {
            name: round(getattr(self, name), 3)
            for name in TIMING
            if getattr(self, name) is not None
        }


@dataclass
class Job:
    """A trial to run, or — ``settled`` — one answered without a run (see the module doc)."""

    trial: object
    candidate: object
    estimate: object = None
    driver_s: float = 0.0
    settled: Result | None = None

    @property
    def number(self) -> int:
        return self.trial.number
