"""``autotune show``: a study at a glance in the terminal, or one trial with its diagnosis.

Contract: :func:`show_study` prints the study's trials (outcome, the knobs that vary, the main
metrics, the largest non-compute part of each ``ok`` trial's step; of a study that ran more than
:data:`SHOWN`, the ``SHOWN`` best and the baseline, and how to list every one), then the best, the baseline
and the noise floor where the confirm phase measured it, and the diagnosis of the best and the
baseline. :func:`show_trial` prints one trial: knobs, metrics, outcome and detail, and for an
``ok`` trial its step split into parts with the measured facts and the verdict
(`autotune.costmodel.diagnosis`). Both read through a :class:`~autotune.analysis.view.StudyView`
only.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autotune.analysis import trial_time
from autotune.analysis.text import fmt
from autotune.analysis.view import StudyView
from autotune.costmodel.diagnosis import OPTIONAL_PARTS, PARTS, fact_lines
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage.schema import metrics_of, outcome_of

BAR = 30  # characters of the widest share bar
SHORT = {
    "micro_batches": "mb",
    "fusion_mb": "fusion",
    "grad_accum": "accum",
    "loss_scale": "scale",
    "warmup_steps": "warmup",
    "jit_level": "jit",
    "recompute": "recomp",
}  # column headers: ten knobs must fit beside the metrics
LEFT = ("role", "outcome", "largest non-compute part")
SHOWN = 40  # trials the table lists at most: of a longer study, the best and the baseline


def show_study(v: StudyView, console: Console) -> None:
    objective = v.objectives[0]
    counts: dict[str, int] = {}
    for t in v.trials:
        counts[outcome_of(t)] = counts.get(outcome_of(t), 0) + 1
    console.print(
        f"study [bold]{v.name}[/bold] — backend "
        f"{v.attrs.get('backend', '?')}, objectives "
        + ", ".join(
            f"{o} ({'max' if d.name == 'MAXIMIZE' else 'min'})"
            for o, d in zip(v.objectives, v.study.directions)
        )
    )
    console.print(
        f"{len(v.trials)} trials: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    )
    rows, title = (
        v.ran,
        (
            "trials the search ran (rejected candidates, repeats, confirm re-runs, interrupted "
            "runs and retried infrastructure failures left out)"
        ),
    )
    if len(v.ran) > SHOWN:  # a table of thousands of rows is read by no one
        best = sorted(v.ok, key=v.value, reverse=v.maximize)[:SHOWN]
        kept = {t.number for t in best} | ({v.baseline.number} if v.baseline else set())
        rows = [t for t in v.ran if t.number in kept]
        title = (
            f"the {len(best)} best of the {len(v.ran)} trials the search ran, and the "
            f"baseline (every trial: autotune compare {v.name} --csv FILE)"
        )
    table = Table(title=title)
    for column in (
        "#",
        "role",
        "outcome",
        *(SHORT.get(k, k) for k in v.searched),
        objective,
        "step ms",
        "peak MB",
        "overflows",
        "fixed/measured s",
        "largest non-compute part",
    ):
        table.add_column(column, justify="right" if column not in LEFT else "left")
    for t in rows:
        found = v.diagnosis(t)
        knobs = v.knobs(t)
        bottleneck = (
            f"{PARTS[found['largest']]} {found['shares'][found['largest']]:.0%}" if found else ""
        )
        style = "bold" if v.best is not None and t.number == v.best.number else None
        parts = trial_time.split(t.user_attrs)
        spent = f"{parts['fixed_s']:.1f} / {parts['measured_s']:.1f}" if parts else ""
        table.add_row(
            str(t.number),
            v.label(t).partition(" ")[2].strip("()"),
            outcome_of(t),
            *(fmt(knobs[k]) for k in v.searched),
            fmt(v.value(t)),
            fmt(t.user_attrs.get("step_time_ms")),
            fmt(t.user_attrs.get("peak_memory_mb")),
            fmt(t.user_attrs.get("overflow_steps")),
            spent,
            bottleneck,
            style=style,
        )
    console.print(table)
    _device_time(v, console)
    _layouts(v, console)
    _standing(v, console)
    shown = [v.best] + ([v.baseline] if v.baseline is not v.best else [])
    for t in [x for x in shown if x is not None]:
        found = v.diagnosis(t)
        if found:
            console.print(f"{v.label(t)}: {found['verdict']}")
    console.print(f"[dim]autotune show {v.name} --trial N: one trial's step split into parts[/dim]")


def _device_time(v: StudyView, console: Console) -> None:
    """Device time of every run of the study (confirm re-runs and retries included), fixed
    against measured (`autotune.analysis.trial_time`)."""
    spent = trial_time.device_time((t, v.devices(t)) for t in v.trials if "run_s" in t.user_attrs)
    total = spent["fixed_s"] + spent["measured_s"]
    if not total:
        return
    ratio = (
        f"; the median trial's fixed time is {spent['median_ratio']:.2g}× its measured steps"
        if spent["median_ratio"] is not None
        else ""
    )
    console.print(
        f"device time: {total / 3600:.3g} device-h, fixed {spent['fixed_s'] / 3600:.3g} "
        f"({spent['fixed_s'] / total:.0%}), measured steps "
        f"{spent['measured_s'] / 3600:.3g}{ratio}"
    )


def _layouts(v: StudyView, console: Console) -> None:
    """The layouts the search did not run, and why (study attr ``layouts``, stored by a study
    of sampler ``auto`` when its search ends: `autotune.search.prior.Prior.layouts`)."""
    layouts = v.attrs.get("layouts")
    if not layouts:
        return
    skipped = [entry for entry in layouts if not entry["ran"]]
    console.print(
        f"layouts: {len(layouts) - len(skipped)} of {len(layouts)} ran"
        + (", the others did not:" if skipped else "")
    )
    for entry in skipped:
        console.print(f"  {entry['layout']}: {entry['why']}")


def _standing(v: StudyView, console: Console) -> None:
    """The best against the baseline, confirmed where the confirm phase ran."""
    objective = v.objectives[0]
    confirmed = {c.number: c for c in v.confirmed}
    for what, t in (("best", v.best), ("baseline", v.baseline)):
        if t is None:
            console.print(f"{what}: none" + (f": {v.why_no_ok}" if v.why_no_ok else ""))
            continue
        c = confirmed.get(t.number)
        value = v.value(t)
        line = (
            f"{what}: #{t.number} {objective} {fmt(value)}"
            if value is not None
            else f"{what}: #{t.number} {outcome_of(t)}, no {objective}"
        )
        if c is not None:
            line += (
                f", confirmed {fmt(c.mean)} ± {fmt(c.std)} over {len(c.values)} re-runs "
                f"(original {fmt(c.original)} not included"
                + ("" if c.within_run is None else f"; ±{c.within_run:.1%} within a run")
                + ")"
            )
        console.print(line)
    floor = v.noise_floor
    console.print(
        f"noise floor: {floor:.1%} (differences below it are not findings)"
        if floor is not None
        else "noise floor: not measured (no confirm phase)"
    )


def show_trial(v: StudyView, trial, console: Console) -> None:
    outcome = outcome_of(trial)
    console.print(
        f"study [bold]{v.name}[/bold], trial {v.label(trial)}: {outcome}"
        + "".join(
            f", {k} {trial.user_attrs[k]}"
            for k in ("repeat_of", "confirm_of", "retry_of")
            if k in trial.user_attrs
        )
    )
    knobs = v.knobs(trial)
    console.print("knobs: " + " ".join(f"{k}={knobs[k]}" for k in KNOB_NAMES))
    metrics = metrics_of(trial)
    if metrics:
        console.print(
            "metrics: "
            + ", ".join(
                f"{k} {fmt(val)}" for k, val in metrics.items() if k not in trial_time.LABELS
            )
        )
    parts = trial_time.split(trial.user_attrs)
    if parts:
        console.print(f"time: {trial_time.line(parts)}")
    if trial.user_attrs.get("detail"):
        console.print(f"detail: {trial.user_attrs['detail'].strip()[-600:]}", markup=False)
    found = v.diagnosis(trial)
    if found is None:
        if outcome == "ok":
            console.print("no diagnosis: the trial has no cost-model estimate to split its step")
        return
    table = Table(
        title=f"step {found['step_time_ms']:.4g} ms, split as the cost model splits "
        f"it (scaled ×{found['scale']:.3g} to the measured step)"
    )
    table.add_column("part")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("")
    for part, label in PARTS.items():
        share = found["shares"][part]
        if part in OPTIONAL_PARTS and not share:
            continue
        table.add_row(
            label,
            f"{found['parts_ms'][part]:.4g}",
            f"{share:.1%}",
            "█" * round(share * BAR),
            style="bold" if part == found["largest"] else None,
        )
    console.print(table)
    for line in fact_lines(found["facts"]):
        console.print(f"  {line}")
    console.print(f"[bold]verdict:[/bold] {found['verdict']}")
