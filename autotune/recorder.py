"""The recording of results: storage, the cost model's calibration, progress.

Contract: a :class:`Recorder` is the only part of the search loop that writes trial outcomes
(through `autotune.records`). For every way a trial ends — settled without a run, finished by
its executor, pruned while running, interrupted — it stores the outcome with its metrics,
estimate and timing, refits the study's calibration from measured ``ok`` trials (study attr
``calibration``; only for executors whose results are measurements), and tells the progress
display. What a failure means for the next proposals is `autotune.failures`' rule; the recorder
answers whether a finished trial must run again (:meth:`finished`).
"""

from __future__ import annotations

import time

from autotune import costmodel, failures, records
from autotune.study import requeue


class Recorder:
    """Writes outcomes, keeps the calibration (see the module doc)."""

    def __init__(self, spec, study, progress, calibrates: bool):
        self.spec, self.study, self.progress = spec, study, progress
        self.objectives = spec.search.objectives
        self.calibrates = calibrates
        self.pairs: list = []  # (estimate, measured peak MB, measured step ms)
        self.calibration = None

    def add_measurement(self, estimate, metrics: dict, store: bool = True) -> None:
        """Refit the per-study correction of the cost model with one more measured trial."""
        if not self.calibrates or not {"peak_memory_mb", "step_time_ms"} & set(metrics):
            return
        self.pairs.append((estimate, metrics.get("peak_memory_mb"), metrics.get("step_time_ms")))
        self.calibration = costmodel.Calibration.from_pairs(self.pairs)
        if store:
            self.store_calibration()

    def store_calibration(self) -> None:
        self.study.set_user_attr("calibration", self.calibration.as_dict())

    def settled(self, settled) -> None:
        """A trial answered without a run (infeasible, or a repeat of a tried candidate)."""
        extra = dict(settled.extra)
        if settled.repeat_of is not None:
            extra["repeat_of"] = settled.repeat_of
        records.record(self.study, settled.trial, self.objectives, settled.outcome,
                       settled.metrics, settled.detail, extra)
        if settled.repeat_of is None:
            self.progress.trial_done(settled.trial.number, settled.outcome, {}, settled.detail)

    def finished(self, job, done) -> bool:
        """Record a finished trial; True when its candidate must run once more (a first
        infrastructure failure, queued again here)."""
        result, trial = done.result, job.trial
        if result.outcome == "ok":
            self.add_measurement(job.estimate, result.metrics)
        extra = {"estimate": job.estimate.as_dict(), **done.timing, **failures.attrs(result)}
        if done.timing:
            extra["driver_s"] = round(job.driver_s, 4)
        started = time.perf_counter()
        records.record(self.study, trial, self.objectives, result.outcome, result.metrics,
                       result.detail, extra)
        self.progress.driver_seconds += time.perf_counter() - started + job.driver_s
        if failures.needs_retry(trial, result):  # not counted: its candidate runs once more
            failures.retry(self.study, trial)
            self.progress.note(failures.retry_note(trial.number, result))
            return True
        self.progress.trial_done(trial.number, result.outcome, result.metrics, result.detail,
                                 again_of=trial.user_attrs.get("confirm_of"))
        return False

    def pruned(self, job, detail: str) -> None:
        records.record(self.study, job.trial, self.objectives, "pruned", detail=detail,
                       extra={"estimate": job.estimate.as_dict()})
        self.progress.trial_done(job.number, "pruned", {}, detail)

    def interrupted(self, trial) -> None:
        """The driver stops before ``trial`` finished: recorded, and its candidate queued to
        run again on ``--resume``."""
        requeue(self.study, trial.params, records.role_of(trial))
        records.record(self.study, trial, self.objectives, "interrupted",
                       detail="the driver stopped before this trial finished")
