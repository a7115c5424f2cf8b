"""The report's figures that Optuna has no plot for: goodput against memory, estimate against
measurement, the time breakdown of the top candidates, where each trial's time went, and
several studies on one axis.

Contract: as `autotune.analysis.report.figures` (a
:class:`~autotune.analysis.report.figures.Figure` or a str
saying why not); ``memory`` and ``estimate`` draw one point per ``ok`` trial (``estimate`` in
each of its two panels), ``studies`` one point per ``ok`` trial of each study, ``trial_time``
one bar per run that stored its time split (confirm re-runs included: they are device time too).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autotune.analysis import trial_time as time_split
from autotune.analysis.report.figures import COLOURS, SIZE, TOP, Figure, _best_so_far, _label
from autotune.costmodel import Calibration
from autotune.costmodel.diagnosis import MEMORY_ALARM, PARTS
from autotune.spec.backends import BACKENDS

FAR = 0.4  # peaks below this share of the device memory: the OOM line is left off the axis
MARKERS = (("circle", "o"), ("square", "s"), ("triangle-up", "^"), ("diamond", "D"))
DASHES = (("solid", "-"), ("dash", "--"), ("dot", ":"), ("dashdot", "-."))


def _layout(knobs: dict) -> str:
    return f"dp{knobs['dp']} tp{knobs['tp']} pp{knobs['pp']}"


def memory(v):
    """Goodput against peak memory per device, with the device's memory (the OOM line)."""
    points = [
        t
        for t in v.ok
        if t.user_attrs.get("peak_memory_mb") is not None
        and t.user_attrs.get("goodput") is not None
    ]
    if len(points) < len(v.ok):
        return "some ok trials have no measured peak memory or goodput"
    title = f"{v.name}: goodput against peak memory"
    fig, (png, ax) = go.Figure(), plt.subplots(figsize=SIZE)
    groups: dict[str, list] = {}
    for t in points:
        groups.setdefault(_layout(v.knobs(t)), []).append(t)
    for layout, trials in sorted(groups.items()):
        x = [t.user_attrs["peak_memory_mb"] / 1024 for t in trials]
        y = [t.user_attrs["goodput"] for t in trials]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=layout,
                marker={"size": 10},
                text=[v.label(t) for t in trials],
            )
        )
        ax.scatter(x, y, s=45, label=layout)
    caption = "Each ok trial, coloured by its layout."
    peak = max(t.user_attrs["peak_memory_mb"] for t in points) / 1024
    right = peak * 1.25
    if v.budget_gb and peak > FAR * v.budget_gb:
        right = v.budget_gb * 1.05
        for share, dash, name in (
            (1.0, "solid", f"device memory {v.budget_gb:g} GB: OOM"),
            (MEMORY_ALARM, "dot", f"{MEMORY_ALARM:.0%}: screened out before running"),
        ):
            fig.add_vline(
                x=v.budget_gb * share,
                line_dash=dash,
                line_color="#c44e52",
                annotation_text=name,
                annotation_position="top left",
            )
            ax.axvline(
                v.budget_gb * share,
                color="#c44e52",
                linestyle="-" if dash == "solid" else ":",
                label=name,
            )
        caption += (
            " The red lines are the device memory (on CPU, each worker's RSS budget) and "
            "the cost model's screen-out margin."
        )
    elif v.budget_gb:  # the OOM line would squeeze every point against the axis
        note = (
            f"OOM at {v.budget_gb:g} GB, off the scale: the largest peak is "
            f"{peak / v.budget_gb:.0%} of it"
        )
        fig.add_annotation(text=note, xref="paper", yref="paper", x=1, y=1.06, showarrow=False)
        ax.text(
            1,
            1.01,
            note,
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=9,
            color="#c44e52",
        )
        caption += f" The device memory ({v.budget_gb:g} GB: OOM) is far to the right."
    fig.update_layout(
        title=title,
        xaxis_title="peak memory per device (GB)",
        yaxis_title="goodput (samples/s)",
        legend_title="layout",
        xaxis_range=[0, right],
    )
    ax.set(xlabel="peak memory per device (GB)", ylabel="goodput (samples/s)")
    ax.set_title(title, pad=18)
    ax.set_xlim(0, right)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    return Figure("memory", "Goodput against peak memory", caption, fig, png)


def estimate(v):
    """The cost model's step time and memory against what each ok trial measured."""
    backend = BACKENDS.get(v.attrs.get("backend"))
    if backend is not None and backend.kind == "estimate":
        return "a simulated trial is its estimate: nothing measured to set against it"
    if v.spec is None:
        return "the study's model.yaml cannot be read back to recompute the estimates"
    pairs = [(v.estimate(t), t) for t in v.ok]
    if any(e is None or e.step_time_s != e.step_time_s for e, _ in pairs):
        return "the cost model has no estimate for this model (no dimensions given)"
    stored = v.attrs.get("calibration")
    cal = (
        Calibration.from_dict(stored)
        if stored
        else Calibration.from_pairs(
            [
                (e, t.user_attrs.get("peak_memory_mb"), t.user_attrs.get("step_time_ms"))
                for e, t in pairs
            ]
        )
    )
    title = f"{v.name}: cost model against measurement"
    panels = (
        (
            "step time (ms)",
            [e.step_time_s * 1000 for e, _ in pairs],
            [t.user_attrs.get("step_time_ms") for _, t in pairs],
            cal.time_factor,
        ),
        (
            "peak memory per device (GB)",
            [e.memory_gb_per_device for e, _ in pairs],
            [(t.user_attrs.get("peak_memory_mb") or 0) / 1024 for _, t in pairs],
            cal.memory_factor,
        ),
    )
    fig = make_subplots(rows=1, cols=2, subplot_titles=[p[0] for p in panels])
    png, axes = plt.subplots(1, 2, figsize=SIZE)
    for col, (what, est, measured, factor) in enumerate(panels, start=1):
        top = max(est + measured) * 1.1
        fig.add_trace(
            go.Scatter(
                x=est,
                y=measured,
                mode="markers",
                name=f"trials: {what}",
                marker={"size": 10},
                text=[v.label(t) for _, t in pairs],
            ),
            row=1,
            col=col,
        )
        ax = axes[col - 1]
        ax.scatter(est, measured, s=45, label="ok trials")
        for slope, style, name in (
            (1.0, "dash", "estimate = measured"),
            (factor, "dot", f"calibrated: measured = {factor:.3g} × estimate"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=[0, top],
                    y=[0, slope * top],
                    mode="lines",
                    line_dash=style,
                    name=name,
                    showlegend=col == 1 or slope != 1,
                ),
                row=1,
                col=col,
            )
            ax.plot([0, top], [0, slope * top], "--" if style == "dash" else ":", label=name)
        fig.update_xaxes(title_text=f"estimated {what}", range=[0, top], row=1, col=col)
        fig.update_yaxes(title_text=f"measured {what}", range=[0, top], row=1, col=col)
        ax.set(
            title=what,
            xlabel=f"estimated {what}",
            ylabel=f"measured {what}",
            xlim=(0, top),
            ylim=(0, top),
        )
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.update_layout(title=title)
    png.suptitle(title, fontsize=13)
    png.tight_layout()
    return Figure(
        "estimate",
        "Cost model against measurement",
        "Each ok trial's uncalibrated estimate against its measurement; the dotted "
        "line is the study's calibration (median of measured ÷ estimated).",
        fig,
        png,
    )


def breakdown(v):
    """The step of the top candidates and the baseline split into parts (the diagnosis)."""
    ranked = sorted(v.ok, key=v.value, reverse=v.maximize)[:TOP]
    if v.baseline is not None and v.baseline in v.ok and v.baseline not in ranked:
        ranked.append(v.baseline)
    shown = [(t, v.diagnosis(t)) for t in ranked if v.diagnosis(t)]
    if not shown:
        return "no ok trial has a cost-model breakdown"
    title = f"{v.name}: where the step time goes (top {TOP} and baseline)"
    labels = [f"{v.label(t)} {_layout(v.knobs(t))}" for t, _ in shown]
    fig = go.Figure()
    png, ax = plt.subplots(figsize=(SIZE[0], 1.6 + 0.55 * len(shown)))
    left = [0.0] * len(shown)
    for part, name in PARTS.items():
        ms = [d["parts_ms"][part] for _, d in shown]
        if not any(ms):
            continue
        fig.add_trace(
            go.Bar(y=labels, x=ms, name=name, orientation="h", marker_color=COLOURS[part])
        )
        ax.barh(labels, ms, left=left, label=name, color=COLOURS[part])
        left = [a + b for a, b in zip(left, ms)]
    fig.update_layout(
        barmode="stack", title=title, xaxis_title="ms per step", yaxis={"autorange": "reversed"}
    )
    ax.invert_yaxis()  # best first, as in the table
    ax.set(title=title, xlabel="ms per step")
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.3 / len(shown)),
        ncol=4,
        fontsize=9,
        frameon=False,
    )
    png.tight_layout()
    return Figure(
        "breakdown",
        "Time breakdown of the top candidates",
        "The measured step of each, split as the cost model splits it (each trial's diagnosis).",
        fig,
        png,
    )


TIME_COLOURS = {
    "launch_s": "#8c8c8c",
    "init_s": "#937860",
    "first_step_s": "#c44e52",
    "excluded_steps_s": "#dd8452",
    "steps_s": "#4c72b0",
    "probe_s": "#8172b3",
    "teardown_s": "#da8bc3",
    "other_s": "#cccccc",
}


def trial_time(v):
    """Each run's time split into its parts: the measured steps against the fixed rest."""
    runs = [(t, time_split.split(t.user_attrs)) for t in v.trials]
    runs = [(t, parts) for t, parts in runs if parts]
    if not runs:
        return (
            "no trial stored where its time went (a simulated or replayed study, or one "
            "recorded before the split was stored)"
        )
    spent = time_split.device_time((t, v.devices(t)) for t, _ in runs)
    title = (
        f"{v.name}: where each trial's time went — fixed "
        f"{spent['fixed_s'] / (spent['fixed_s'] + spent['measured_s']):.0%} of the device time"
    )
    labels = [v.label(t) for t, _ in runs]
    fig = go.Figure()
    png, ax = plt.subplots(figsize=(SIZE[0], 1.6 + 0.32 * len(runs)))
    left = [0.0] * len(runs)
    for part, colour in TIME_COLOURS.items():
        seconds = [parts[part] for _, parts in runs]
        name = time_split.LABELS[part]
        fig.add_trace(go.Bar(y=labels, x=seconds, name=name, orientation="h", marker_color=colour))
        ax.barh(labels, seconds, left=left, label=name, color=colour)
        left = [a + b for a, b in zip(left, seconds)]
    fig.update_layout(
        barmode="stack", title=title, xaxis_title="seconds", yaxis={"autorange": "reversed"}
    )
    ax.invert_yaxis()
    ax.set(title=title, xlabel="seconds")
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1 - 0.6 / len(runs)),
        ncol=4,
        fontsize=9,
        frameon=False,
    )
    png.tight_layout()
    return Figure(
        "trial-time",
        "Where each trial's time went",
        "Each run's seconds by part, in trial order: the measured steps (blue) are "
        "what the trial is for, the rest is its fixed cost.",
        fig,
        png,
    )


def studies(views):
    """The best-so-far of each study's first objective, on one axis."""
    title = "studies side by side: best so far"
    fig, (png, ax) = go.Figure(), plt.subplots(figsize=SIZE)
    objectives = {v.objectives[0] for v in views}
    for i, v in enumerate(views):
        xs, ys = _best_so_far(v)
        steps = list(range(1, len(xs) + 1))
        # studies often share their best (the baseline): markers and dashes keep both visible
        marker, dash = MARKERS[i % len(MARKERS)], DASHES[i % len(DASHES)]
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=ys,
                mode="lines+markers",
                line_shape="hv",
                name=f"{v.name} ({v.objectives[0]})",
                line_dash=dash[0],
                marker_symbol=marker[0],
                text=[f"#{n}" for n in xs],
            )
        )
        ax.step(
            steps,
            ys,
            where="post",
            marker=marker[1],
            linestyle=dash[1],
            markersize=8 - i,
            alpha=0.85,
            label=f"{v.name} ({v.objectives[0]})",
        )
    ylabel = _label(views[0]) if len(objectives) == 1 else "first objective of each study"
    fig.update_layout(title=title, xaxis_title="ok trials so far", yaxis_title=ylabel)
    ax.set(title=title, xlabel="ok trials so far", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    return Figure(
        "history",
        "Studies side by side",
        "The best first objective of each study after each of its ok trials.",
        fig,
        png,
    )
