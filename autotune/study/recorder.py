"""The recording of results: storage, the cost model's calibration, the diagnosis, progress.

Contract: a :class:`Recorder` is the only part of a study's run that writes trial outcomes
(through `autotune.storage.schema`). For every way a trial ends — settled without a run,
finished by its executor, pruned while running, interrupted — it stores the outcome with its
metrics, estimate and timing; an ``ok`` trial with an estimate also gets its ``diagnosis``
(`autotune.costmodel.diagnosis`, against this study's device memory). It refits the study's
calibration from measured ``ok`` trials (study attr ``calibration``; only for executors whose
results are measurements) and tells the progress display. What a failure means for the next
proposals is `autotune.study.retry`'s rule; the recorder answers whether a finished trial must
run again (:meth:`finished`).
"""

from __future__ import annotations

from autotune import costmodel
from autotune.costmodel.diagnosis import diagnose
from autotune.jobs import Job, Result
from autotune.storage import schema
from autotune.storage.recovery import requeue_trial
from autotune.study import retry
from autotune.train.metrics import MEASUREMENT


class Recorder:
    """Writes outcomes, keeps the calibration (see the module doc)."""

    def __init__(self, spec, study, progress, calibrates: bool):
        self.spec, self.study, self.progress = spec, study, progress
        self.objectives = spec.search.objectives
        self.calibrates = calibrates
        self.pairs: list = []  # (estimate, measured peak MB, measured step ms): calibration
        self.measured: list = []  # (candidate, measured peak MB, measured step ms): the prior
        self.calibration = None
        self.memory_gb = costmodel.resolve_profile(spec.cluster).memory_gb
        self.late: dict = {}  # number → the trial holding its late result (another driver failed it)

    def add_measurement(self, candidate, estimate, metrics: dict) -> bool:
        """Refit the per-study correction of the cost model with one more measured trial of
        ``candidate``, and keep it for the prior (:attr:`measured`); whether it did (not:
        nothing to calibrate with). Storing it is the caller's (with the trial's result:
        :meth:`finished`; after a batch: :meth:`store_calibration`)."""
        if not self.calibrates or not {"peak_memory_mb", "step_time_ms"} & set(metrics):
            return False
        memory_mb, step_ms = metrics.get("peak_memory_mb"), metrics.get("step_time_ms")
        self.pairs.append((estimate, memory_mb, step_ms))
        self.measured.append((candidate, memory_mb, step_ms))
        self.calibration = costmodel.Calibration.from_pairs(self.pairs)
        return True

    def store_calibration(self) -> None:
        self.study.set_user_attr("calibration", self.calibration.as_dict())

    def _record(self, trial, result: Result, extra: dict, study_attrs=None) -> None:
        if result.outcome == "ok" and "estimate" in extra:
            # why it is as fast as it is, kept beside what it measured
            breakdown = (extra["estimate"].get("breakdown") or {}).get("time_s")
            found = diagnose(breakdown, result.metrics, schema.knobs_of(trial), self.memory_gb)
            if found:
                extra["diagnosis"] = found
        self._store(trial, result.outcome, result.metrics, result.detail, extra, study_attrs)

    def _store(
        self, trial, outcome: str, metrics=None, detail: str = "", extra=None, study_attrs=None
    ) -> None:
        """`autotune.storage.schema.record`, saying so when the result came late."""
        stored = schema.record(
            self.study, trial, self.objectives, outcome, metrics, detail, extra, study_attrs
        )
        if stored != trial.number:
            self.late[trial.number] = stored
            self.progress.note(
                f"#{trial.number} was failed by another driver that took this one for dead"
                + (
                    f": its {outcome} result is recorded as #{stored} (late_of {trial.number})"
                    if stored is not None
                    else ""
                )
            )

    def settled(self, job: Job) -> None:
        """A trial answered without a run (infeasible, or a repeat of a tried candidate)."""
        result, extra = job.settled, {}
        if result.repeat_of is not None:
            extra["repeat_of"] = result.repeat_of
        elif job.estimate is not None:
            extra["estimate"] = job.estimate.as_dict()
        self._store(job.trial, result.outcome, result.metrics, result.detail, extra)
        if result.repeat_of is None:
            self.progress.trial_done(job.number, result.outcome, {}, result.detail)

    def finished(self, job: Job, result: Result) -> bool:
        """Record a finished trial; True when its candidate must run once more (a first
        infrastructure failure, queued again here)."""
        trial, study_attrs = job.trial, {}
        if result.outcome == "ok" and self.add_measurement(
            job.candidate, job.estimate, result.metrics
        ):
            study_attrs["calibration"] = self.calibration.as_dict()  # stored with the trial
        timing = result.timing()
        extra = {"estimate": job.estimate.as_dict(), **timing, **retry.attrs(result)}
        if timing:
            extra["driver_s"] = round(job.driver_s, 4)
        self._record(trial, result, extra, study_attrs)
        if retry.needs_retry(trial, result):  # not counted: its candidate runs once more
            retry.retry(self.study, trial)
            self.progress.note(retry.retry_note(trial.number, result))
            return True
        self.progress.trial_done(
            trial.number,
            result.outcome,
            result.metrics,
            result.detail,
            again_of=trial.user_attrs.get("confirm_of"),
            ran=result.run_s is not None,
        )
        return False

    def pruned(self, job: Job, detail: str, run_s: float) -> None:
        """A trial stopped while running as clearly slow, after ``run_s`` seconds on its
        devices (they count toward a budget)."""
        # its steps were read by the trial program's rules before the pruner judged them
        self._store(
            job.trial,
            "pruned",
            detail=detail,
            extra={
                "estimate": job.estimate.as_dict(),
                "run_s": round(run_s, 3),
                "measurement": MEASUREMENT,
            },
        )
        self.progress.trial_done(job.number, "pruned", {}, detail)

    def interrupted(self, trial) -> None:
        """The driver stops before ``trial`` finished: recorded, and its candidate queued to
        run again on ``--resume`` (`autotune.storage.recovery.requeue_trial`)."""
        requeue_trial(self.study, trial)
        self._store(trial, "interrupted", detail="the driver stopped before this trial finished")
