"""When a study stops before ``--trials``: a budget of time or device-hours, or a flat search.

Contract:
- :func:`parse_budget` reads ``--budget``: a wall time of the study (``90s``, ``30m``, ``2h``)
  or device-hours (``40dh``: the sum over trials of run time × devices); anything else, or not
  > 0, is a SpecError naming ``--budget``.
- A :class:`Stopper` follows a study's runs and answers :meth:`Stopper.reason` before each new
  dispatch: a reason to stop, or None.
  - Budget: stop when what was used plus what the next run will take would exceed it — the
    next run taken at the median of the finished runs' cost; for device-hours each trial still
    running is counted at that median too (it will spend it). Before any run finished nothing is
    known, so the first one is dispatched. Wall time is the study's own: summed over its
    sessions (stored as study attr ``wall_s_used`` after every run, so a resume or a crash keeps
    it; stored on a real backend also without a budget, so a later ``--budget`` counts it) — the
    driver's clock on a real backend, the recorded ``run_s`` of each run on replay (as if run
    one after another). Device-hours are re-read from storage before every dispatch, so
    several drivers share one budget and a resume counts every earlier session: every run
    that spent device time counts — a trial of the search, a confirm-phase re-run, an
    infrastructure failure that was retried, a pruned run (its ``run_s`` is the driver's clock
    from submit to the stop) — at its ``run_s`` × its devices, and every trial running now in
    any driver at the median. A warm-start copy ran in another study and a repeat did not run:
    neither counts, nor does a candidate rejected before it ran (no run, no device time). The
    median and the flat rule go by the runs that count toward N. What storage holds is read
    before every dispatch, each finished trial once (`autotune.storage.feed`), so the check
    costs the same at the 10,000th trial as at the 10th.
  - ``--stop-when-flat``: stop once at least :data:`FLAT_MIN_RUNS` runs finished and the last
    ``max(FLAT_MIN_WINDOW, runs // 3)`` of them did not improve the best first objective by
    more than :data:`FLAT_GAIN` (relative): a plateau that long rarely ends in these spaces.
- A cluster that cannot run trials: stop once every run of this session failed by the
  infrastructure before its candidate ran (`autotune.study.retry`) and one of them was the retry
  of such a failure — the same candidate failed twice, and nothing ran since the session began (a
  device plugin that cannot load, a chip the backend refuses, a cluster that never forms): one
  line with the last reason, instead of a study of identical failures.
- :meth:`Stopper.used` is the budget's progress text (``1.2 of 40 dh (3%)``).
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass

from optuna.trial import TrialState

from autotune.spec.backends import backend_of
from autotune.spec.errors import SpecError
from autotune.storage.counting import counted
from autotune.storage.feed import Feed
from autotune.storage.schema import knobs_of, maximizes

WALL_UNITS = {"s": 1, "m": 60, "h": 3600}
FLAT_MIN_RUNS = 8
FLAT_MIN_WINDOW = 5
FLAT_GAIN = 0.01


@dataclass(frozen=True)
class Budget:
    kind: str  # "wall" (seconds of the study) or "device" (device-seconds)
    seconds: float

    def show(self, seconds: float) -> str:
        if self.kind == "device":
            return f"{seconds / 3600:.3g} dh"
        return f"{seconds / 60:.3g} min" if self.seconds < 3 * 3600 else f"{seconds / 3600:.3g} h"


def parse_budget(text: str) -> Budget:
    """``--budget`` (see the module doc)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(dh|h|m|s)\s*", text or "")
    if not match or not float(match[1]) > 0:
        raise SpecError(
            f"--budget {text!r}: give a wall time of the study (90s, 30m, 2h) or "
            "device-hours (40dh: run time × devices, summed over trials), > 0"
        )
    number, unit = float(match[1]), match[2]
    if unit == "dh":
        return Budget("device", number * 3600)
    return Budget("wall", number * WALL_UNITS[unit])


def _devices(frozen) -> int:
    knobs = knobs_of(frozen)
    return int(knobs["dp"] * knobs["tp"] * knobs["pp"]) if None not in knobs.values() else 0


class Stopper:
    """Follows the runs of one session of a study (see the module doc)."""

    def __init__(self, study, budget: Budget | None, flat: bool, virtual_clock: bool):
        self.study, self.budget, self.flat = study, budget, flat
        self.virtual = virtual_clock
        self.wall_before = float(study.user_attrs.get("wall_s_used", 0.0))
        self.started = time.monotonic()
        self.session_runs_s = 0.0
        self.costs: list[float] = []  # per finished run: run_s (wall) or run_s × devices
        self.values: list = []  # first objective per run (None: not ok), in order
        self.launch_failures: list[str] = []  # this session's infrastructure failures (reasons)
        self.retry_failed = False  # ... a retry among them
        self.ran = False  # whether a run of this session got to its candidate
        self.maximize = maximizes(study)
        self.feed, self.spent = Feed(), 0.0  # device-seconds of the finished trials read
        for t in study.get_trials(deepcopy=False):  # what earlier sessions ran
            if counted(t):
                self._add(
                    float(t.user_attrs.get("run_s") or 0.0),
                    _devices(t),
                    t.values[0] if t.values else None,
                )

    def _add(self, run_s: float, devices: int, value) -> None:
        self.costs.append(
            run_s * devices if self.budget and self.budget.kind == "device" else run_s
        )
        self.values.append(value)

    def finished(
        self,
        run_s: float,
        devices: int,
        value,
        counted: bool,
        infrastructure: str | None = None,
        retry: bool = False,
    ) -> None:
        """A run ended (``counted``: it counts toward N; a retried failure or a re-run does
        not enter the flat rule but costs its time; ``infrastructure``: the reason it failed by
        the infrastructure before its candidate ran, None when it got to run it; ``retry``: it
        was the retry of such a failure)."""
        self.session_runs_s += run_s
        if infrastructure is None:
            self.ran = True
        else:
            self.launch_failures.append(infrastructure)
            self.retry_failed |= retry
        if counted:
            self._add(run_s, devices, value)
        if self.budget or not self.virtual:  # so a later --budget counts this session too
            self.study.set_user_attr("wall_s_used", round(self.wall_used(), 3))

    def wall_used(self) -> float:
        session = self.session_runs_s if self.virtual else time.monotonic() - self.started
        return self.wall_before + session

    def device_use(self) -> tuple[float, int]:
        """(device-seconds spent by every run in storage, trials running now in any driver):
        see the module doc."""
        for t in self.feed.read(self.study):
            if "warm_start" not in t.user_attrs:
                self.spent += float(t.user_attrs.get("run_s") or 0.0) * _devices(t)
        running = sum(  # a parked repeat runs nothing
            t.state == TrialState.RUNNING and "repeat_of" not in t.user_attrs
            for t in self.feed.unfinished.values()
        )
        return self.spent, running

    def _used(self) -> float:
        return self.device_use()[0] if self.budget.kind == "device" else self.wall_used()

    def used(self) -> str:
        """The budget's progress text, or "" without a budget."""
        if not self.budget:
            return ""
        used = self._used()
        return (
            f"budget {self.budget.show(used)} of {self.budget.show(self.budget.seconds)} "
            f"({used / self.budget.seconds:.0%})"
        )

    def reason(self, running: int, flat: bool = True) -> str | None:
        """Why no further run should be dispatched now (``running``: trials in flight;
        ``flat``: the flat rule applies too — not to confirm-phase re-runs)."""
        if self.retry_failed and not self.ran:
            return (
                f"infrastructure: all {len(self.launch_failures)} runs of this session failed "
                f"before their candidate ran, a retry among them (the last: "
                f"{self.launch_failures[-1]}): stopping; the cluster cannot run trials as "
                "it is (docs/accelerators.md)"
            )
        if self.budget and self.costs:
            median = statistics.median(self.costs)
            used, ahead = self.wall_used(), median
            if self.budget.kind == "device":
                used, anywhere = self.device_use()
                ahead = median * (max(running, anywhere) + 1)
            if used + ahead > self.budget.seconds:
                return (
                    f"budget: {self.used()} used; the next run would take about "
                    f"{self.budget.show(median)}: stopping"
                )
        if flat and self.flat and len(self.values) >= FLAT_MIN_RUNS:
            window = max(FLAT_MIN_WINDOW, len(self.values) // 3)
            best = max if self.maximize else min
            before = [v for v in self.values[:-window] if v is not None]
            recent = [v for v in self.values[-window:] if v is not None]
            if before and (not recent or not self._gain(best(before), best(recent))):
                return (
                    f"flat: the last {window} runs did not improve the best by more than "
                    f"{FLAT_GAIN:.0%}: stopping (--stop-when-flat)"
                )
        return None

    def _gain(self, best: float, new: float) -> bool:
        if self.maximize:
            return new > best * (1 + FLAT_GAIN)
        return new < best * (1 - FLAT_GAIN)


def check_budget_backend(budget: Budget | None, spec, table) -> None:
    """A budget needs runs that take time: refused on simulate, and on a replay table without
    ``run_s``."""
    if budget is None:
        return
    if backend_of(spec.cluster.backend).kind == "estimate":
        raise SpecError(
            f"--budget: {spec.cluster.backend} trials take no time; a budget needs a backend that "
            "runs trials, or a replay table with a run_s column"
        )
    if table is not None and not any(row.run_s for rows in table.rows.values() for row in rows):
        raise SpecError(
            f"--budget: {table.path} has no run_s column: replayed runs would take no time"
        )
