"""Live progress of a search: a line per finished trial (n/N, outcome, objective, best so far,
elapsed and ETA) and, at the end, a table of the best configuration against the baseline.
``n`` counts runs, as N does (`autotune.storage.counting`): a candidate rejected before it ran
gets a line of its own (its reason) and leaves ``n`` as it was.

Contract: a study's run (`autotune.study.run`, `autotune.study.loop`) calls these hooks; nothing
here writes storage, and what is read comes through the ``optuna.Study`` it is handed and the
rankings of `autotune.analysis.ranking`.
"""

from __future__ import annotations

import math
import time

import optuna
from rich.console import Console
from rich.table import Table

from autotune.analysis.ranking import (
    baseline_of,
    best_confirmed,
    best_trials,
    median_within_run,
    noise_floor,
    summarize,
)
from autotune.analysis.text import fmt
from autotune.jobs import METRICS
from autotune.spec.knobs import KNOB_NAMES
from autotune.spec.objectives import OBJECTIVES, directions
from autotune.storage.schema import knobs_of, maximizes, outcome_of


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Prints search progress to a rich console (stderr-safe, plain when not a terminal)."""

    def __init__(self, console: Console | None = None):
        # soft_wrap: one trial, one line, also in logs and CI where the width defaults to 80
        self.console = console or Console(highlight=False, soft_wrap=True)
        # the driver's own seconds (all the study's loop does but wait for trials to end) and
        # the trials it asked in them, settled or run, confirm re-runs and retries included
        self.driver_seconds, self.driver_trials = 0.0, 0
        self._done = self._total = self._done_here = 0
        self._started = time.monotonic()
        self._objectives: tuple = ()
        self._searched: tuple = ()
        self._best: tuple | None = None  # (value of the first objective, trial number)
        self._maximize = True
        self._confirm_total = self._confirm_done = 0
        self._confirm_started = 0.0
        self.status = lambda: ""  # more for each trial line (the search sets the budget used)

    def driver_ms_per_trial(self) -> float:
        """The driver's own milliseconds per trial it asked (see ``driver_seconds``)."""
        return self.driver_seconds / max(1, self.driver_trials) * 1000

    def note(self, message: str) -> None:
        self.console.print(f"[dim]·[/dim] {message}")

    def start(self, study: optuna.Study, done: int, total: int, objectives, searched=()) -> None:
        """``searched``: the knobs the space varies (the ones worth showing per trial)."""
        self._done, self._total, self._objectives = done, total, tuple(objectives)
        self._searched = tuple(searched)
        self._started = time.monotonic()
        self._maximize = maximizes(study)
        best = best_trials(study)  # once; later trials update the best in memory
        self._best = (best[0].values[0], best[0].number) if best else None
        what = ", ".join(f"{o} ({d})" for o, d in zip(objectives, directions(objectives)))
        self.console.print(
            f"study [bold]{study.study_name}[/bold]: {total - done} trials to run "
            f"({done} already done), objectives {what}"
        )

    def trial_started(self, number: int, candidate) -> None:
        knobs = " ".join(f"{k}={v}" for k, v in candidate.as_dict().items() if k in self._searched)
        self.console.print(f"[dim]      #{number:<3} running: {knobs}[/dim]")

    def trial_done(
        self,
        number: int,
        outcome: str,
        metrics: dict,
        detail: str = "",
        again_of: int | None = None,
        ran: bool = False,
    ) -> None:
        """A trial ended; ``again_of``: it was a confirm-phase re-run of that trial; ``ran``: it
        was dispatched (an ``infeasible`` one the trial program refused is one of the N)."""
        main = self._objectives[0]
        value = metrics.get(OBJECTIVES[main].metric) if outcome == "ok" else None
        shown = f"{main} {fmt(value)}" if value is not None else ""
        if outcome != "ok" and detail:
            shown = detail.strip().splitlines()[0][:100]  # the reason; the log tail follows
        colour = "green" if outcome == "ok" else "yellow" if outcome != "error" else "red"
        if again_of is not None:
            self._confirm_done += 1
            elapsed = time.monotonic() - self._confirm_started
            eta = elapsed / self._confirm_done * (self._confirm_total - self._confirm_done)
            self.console.print(
                f"confirm [{self._confirm_done}/{self._confirm_total}] #{number:<3} "
                f"again #{again_of:<3} [{colour}]{outcome:<10}[/{colour}] "
                f"{shown:<20} | {_clock(elapsed)}, ETA {_clock(eta)}"
            )
            return
        if outcome == "infeasible" and not ran:  # never ran: not one of the N
            self.console.print(f"[dim]      #{number:<3} {outcome}: {shown} (not run)[/dim]")
            return
        self._done += 1
        self._done_here += 1
        if value is not None and (self._best is None or (value > self._best[0]) == self._maximize):
            self._best = (value, number)
        self._line(f"#{number:<3} [{colour}]{outcome:<10}[/{colour}] {shown:<20}")

    def start_confirm(self, total: int, top: int, runs: int) -> None:
        """The confirm phase begins: ``total`` re-runs of the top ``top`` and the baseline."""
        self._confirm_total, self._confirm_done = total, 0
        self._confirm_started = time.monotonic()
        self.console.print(
            f"confirm phase: the top {top} and the baseline again, {runs} more "
            f"run{'s' if runs > 1 else ''} each, interleaved ({total} trials)"
        )

    def batch_done(self, count: int, runs: int, ok_values: list[tuple[float, int]]) -> None:
        """Trials settled in bulk (a simulated grid): one line per batch, not per trial.
        ``runs``: how many of the ``count`` ran (the others were rejected); ``ok_values``:
        (first objective, trial number) of the batch's ok trials."""
        self._done += runs
        self._done_here += runs
        for value, number in ok_values:
            if self._best is None or (value > self._best[0]) == self._maximize:
                self._best = (value, number)
        self._line(
            f"{count} candidates: {runs} ran ({len(ok_values)} ok), {count - runs} infeasible"
        )

    def _line(self, what: str) -> None:
        elapsed = time.monotonic() - self._started
        eta = elapsed / self._done_here * max(0, self._total - self._done)
        best = f"best {fmt(self._best[0])} (#{self._best[1]})" if self._best else "best: none yet"
        status = self.status()
        self.console.print(
            f"[{self._done:>{len(str(self._total))}}/{self._total}] {what} | "
            f"{best} | {_clock(elapsed)}, ETA {_clock(eta)}" + (f" | {status}" if status else "")
        )

    def finish(self, study: optuna.Study) -> None:
        counts: dict[str, int] = {}
        queued = 0  # retries a stop left waiting (a resume runs them)
        for t in study.get_trials(deepcopy=False):
            if t.state == optuna.trial.TrialState.WAITING:
                queued += 1
                continue
            counts[outcome_of(t)] = counts.get(outcome_of(t), 0) + 1
        self.console.print(
            "outcomes: "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            + (f", queued to run again {queued}" if queued else "")
        )
        if self.driver_trials:
            self.console.print(
                f"driver overhead (ask, feasibility, submit, tell, sync): "
                f"{self.driver_ms_per_trial():.0f} ms per trial "
                f"({self.driver_trials} trials)"
            )
        best = best_trials(study)
        if not best:
            self.console.print("[red]no trial finished ok[/red]")
            return
        self.console.print(best_table(study, best))
        confirmed = summarize(study)
        if confirmed:
            self.console.print(confirmed_lines(study, confirmed))


def best_table(study: optuna.Study, best: list) -> Table:
    baseline = baseline_of(study)
    title = "best configuration" if len(best) == 1 else "Pareto front (best first objective first)"
    table = Table(title=title)
    shown = best[:5] + ([baseline] if baseline is not None and baseline not in best[:5] else [])
    table.add_column("")
    for t in shown:
        label = f"#{t.number}" + (" baseline" if t is baseline else "")
        table.add_column(label, justify="right")
    for name in KNOB_NAMES:
        table.add_row(name, *(fmt(knobs_of(t)[name]) for t in shown))
    for name in METRICS:
        cells = [fmt(t.user_attrs.get(name, "")) for t in shown]
        if any(cells):  # a simulated trial has no loss, overflow or compile time
            table.add_row(name, *cells)
    table.add_row("outcome", *(outcome_of(t) for t in shown))
    if (
        baseline is not None
        and baseline.values
        and best[0] is not baseline
        and not summarize(study)
    ):
        maximize = maximizes(study)
        ratio = best[0].values[0] / baseline.values[0] if baseline.values[0] else float("nan")
        table.caption = (
            f"#{best[0].number} vs baseline #{baseline.number}: "
            f"{ratio:.2f}× {'higher' if maximize else 'of the'} "
            f"{study.user_attrs.get('objectives', ['objective'])[0]} (single runs, "
            "unconfirmed)"
        )
    return table


def confirmed_lines(study: optuna.Study, confirmed: list) -> str:
    """The confirmed configurations as mean ± sample std (and, where the re-runs stored one,
    how precisely one run knew its step time), the best against the baseline with its spread,
    and the noise floor set against that within-run precision."""
    objective = study.user_attrs.get("objectives", ["objective"])[0]
    lines = [
        f"confirmed {objective} (mean ± sd over the confirm-phase re-runs only; the "
        "original run that won the selection beside it, not in it):"
    ]
    for c in confirmed:
        label = " baseline" if c.baseline else ""
        within = "" if c.within_run is None else f"; ±{c.within_run:.1%} within a run"
        lines.append(
            f"  #{c.number}{label}: {fmt(c.mean)} ± {fmt(c.std)} (n={len(c.values)}; "
            f"original {fmt(c.original)}{within})"
        )
    best, baseline = best_confirmed(study), next((c for c in confirmed if c.baseline), None)
    label = "best confirmed"
    if best is not None and baseline is not None and best.number == baseline.number:
        lines.append(f"the baseline #{baseline.number} is the best confirmed configuration")
        # the ratio still says by how much the search's own best lost to it
        best, label = best_confirmed(study, include_baseline=False), "next best confirmed"
    if (
        best is not None
        and baseline is not None
        and best.number != baseline.number
        and baseline.mean
    ):
        ratio = best.mean / baseline.mean
        spread = ratio * math.hypot(_relative_spread(best), _relative_spread(baseline))
        lines.append(
            f"{label} #{best.number} vs baseline #{baseline.number}: {ratio:.2f}× ± {spread:.2f}"
        )
    floor, within = noise_floor(confirmed), median_within_run(confirmed)
    if floor is not None:
        lines.append(f"noise floor (median sd/mean of confirmed configurations): {floor:.1%}")
    if floor is not None and within is not None:
        # one sd between runs against a 95% half-width (≈ 2 standard errors) within one
        lines.append(
            f"within a run the mean step time is known to ±{within:.1%} (median "
            "step_time_ci of the re-runs, 95%): "
            + (
                "the runs differ by more than their steps' noise explains, so more "
                "re-runs (--confirm-runs), not a tighter trial.precision, would lower "
                "the noise floor"
                if floor > within
                else "the steps' own noise accounts for the noise floor, so a tighter "
                "trial.precision would lower it"
            )
        )
    return "\n".join(lines)


def _relative_spread(c) -> float:
    """Relative spread of a confirmed mean (0 with a single value)."""
    return c.std / c.mean if len(c.values) > 1 and c.mean else 0.0
