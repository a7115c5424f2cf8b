"""Early stopping of clearly slow trials from the steps they report while running.

Contract: the search loop owns a :class:`StepWatcher` per running trial; :meth:`report` reads
the trial's new ``steps.jsonl`` lines, reports its goodput so far as the trial's intermediate
value (one per optimizer step, after ``measure_after`` steps), stores how precisely it is known
so far as the trial's user attr ``step_time_ci`` (the metric's definition,
`autotune.train.metrics.step_time_ci`; a finished trial's metric replaces it, a pruned trial
keeps the one it was stopped on), and answers whether the study's pruner says stop. Only
single-objective goodput studies are pruned (Optuna does not prune multi-objective studies);
the watcher never stops anything itself — the loop cancels the run.
The file is read as it grows: a line still being written waits for its newline, a line that is
not a step record (a fragment) is skipped, and a file written anew (it shrank, or its first line
changed) is read again from its start with the watcher's tally reset: nothing raises while a
trial runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna

from autotune.spec.specs import DEFAULT_MIN_STEPS
from autotune.train.intervals import step_time_ci


class SlowTrialPruner(optuna.pruners.BasePruner):
    """Prune a trial whose goodput so far is *clearly* below ``ratio`` × the best finished
    trial's: even its upper 95% bound is, ``goodput / (1 − h)`` with ``h`` its ``step_time_ci``
    so far (goodput is proportional to 1 / the mean step time; the overflow rate is taken as
    measured). Never on fewer than ``min_steps`` reported steps (the study's
    ``trial.min_steps``: what a trial's own interval is trusted on), nor without an interval.

    A trial at half the best stays there (each step does the same work), but a few slow steps
    on a shared machine are not the trial's speed: it is kept until its interval says it
    cannot be within reach.
    """

    def __init__(self, ratio: float = 0.5, min_steps: int = DEFAULT_MIN_STEPS):
        self.ratio, self.min_steps = ratio, min_steps

    @staticmethod
    def upper_bound(goodput: float, half_width: float | None) -> float:
        """The upper 95% bound of a goodput whose mean step time is known to ±``half_width``
        (relative); infinite without an interval, or with one as wide as the mean."""
        if half_width is None or half_width >= 1:
            return float("inf")
        return goodput / (1 - half_width)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if len(trial.intermediate_values) < self.min_steps:
            return False
        try:
            best = study.best_value
        except ValueError:  # no finished trial yet: nothing to compare with
            return False
        latest = trial.intermediate_values[max(trial.intermediate_values)]
        return self.upper_bound(latest, trial.user_attrs.get("step_time_ci")) < self.ratio * best


def _record(line: bytes) -> dict | None:
    """One ``steps.jsonl`` line as a step record, or None for anything else (a fragment)."""
    try:
        record = json.loads(line)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return None
    ok = isinstance(record, dict) and all(key in record for key in ("step", "step_time_ms"))
    return record if ok else None


class StepWatcher:
    """Follows one running trial's ``steps.jsonl`` (written line by line by rank 0)."""

    def __init__(
        self, trial: optuna.Trial, trial_dir: Path, samples_per_step: int, measure_after: int
    ):
        self.trial, self.path = trial, trial_dir / "steps.jsonl"
        self.samples_per_step, self.measure_after = samples_per_step, measure_after
        self._offset, self._head = 0, b""  # bytes read, and the first line they began with
        self._start()
        self.last: tuple[int, float] | None = None  # (step, goodput so far) last reported
        self.half_width: float | None = None  # step_time_ci of the steps so far, last stored

    def _start(self) -> None:
        self._seconds = 0.0
        self._times: list[float] = []  # the measured steps' times (ms)
        self._settled = 0  # measured steps after the scaler's initial back-off
        self._overflowed = 0  # ... of which overflowed
        self._backing_off = True  # no update applied yet: overflows so far are the back-off

    def _new_steps(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                if (
                    os.fstat(f.fileno()).st_size < self._offset
                    or f.read(len(self._head)) != self._head
                ):  # written anew: start again
                    self._offset, self._head = 0, b""
                    self._start()
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        if not self._offset:
            self._head = complete[: complete.find(b"\n") + 1]
        self._offset += len(complete)
        return [step for step in map(_record, complete.splitlines()) if step is not None]

    def report(self) -> bool:
        """Report new measured steps; True when the pruner says this trial should stop.

        Goodput so far follows the metric's rule (`autotune.train.metrics`) without the parts
        only the finished trial knows: measured throughput × (1 − overflow rate after the initial
        back-off). The back-off itself is charged once per full run, so a high initial loss scale
        is not stopped for the steps it takes to settle; nothing is reported until it has."""
        reported = False
        for step in self._new_steps():
            overflow = bool(step.get("overflow"))
            self._backing_off = self._backing_off and overflow
            if step["step"] < self.measure_after:
                continue
            self._seconds += step["step_time_ms"] / 1000
            self._times.append(step["step_time_ms"])
            if not self._backing_off:
                self._settled += 1
                self._overflowed += overflow
            if self._seconds > 0 and self._settled:
                throughput = len(self._times) * self.samples_per_step / self._seconds
                self.last = (step["step"], throughput * (1 - self._overflowed / self._settled))
                self.trial.report(self.last[1], self.last[0])
                reported = True
        if not reported:
            return False
        # one write a poll, not one a step: the pruner judges the latest value by it
        self.half_width = step_time_ci(self._times)
        self.trial.set_user_attr("step_time_ci", self.half_width)
        return self.trial.should_prune()
