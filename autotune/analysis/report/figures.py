"""The report's figures, each drawn twice: plotly (interactive HTML) and matplotlib (PNG).

Contract: every builder takes a :class:`~autotune.analysis.view.StudyView` (``studies`` takes a
list) and returns a :class:`Figure` — or a str saying why the study has no such figure (one
``ok`` trial has no importances, a simulated study no measurement to set against its estimate).
Per-trial figures draw one point (or line) per ``ok`` trial the search ran (``view.ok``; the
confirm phase shows as the confirmed mean of its trial): ``history``, ``parallel``, ``slice``,
``pareto``, ``memory``, ``estimate``, ``studies`` (per study); ``parallel`` the best
:data:`PARALLEL` of them where there are more. ``importances`` and ``breakdown`` (the top five
and the baseline) are not per trial. Optuna's own visualizations are used where
they fit, fed the view's own study (`autotune.analysis.report.view_study`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import optuna.visualization as ov  # noqa: E402
import optuna.visualization.matplotlib as om  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

from autotune.analysis.report.view_study import copy_of, view_study  # noqa: E402

SIZE = (10, 5.6)  # inches: 1000 × 560 px at the report's DPI
TOP = 5  # candidates in the time-breakdown figure, besides the baseline
PARALLEL = 500  # trials in the parallel-coordinates figure at most: the best
COLOURS = {
    "compute": "#4c72b0",
    "recompute": "#8172b3",
    "tp_comm": "#dd8452",
    "pp_comm": "#937860",
    "bubble": "#c44e52",
    "dp_comm": "#55a868",
    "optimizer": "#da8bc3",
    "host": "#8c8c8c",
    "experts": "#64b5cd",
    "imbalance": "#ccb974",
    "mla": "#4c4c9c",
    "mtp": "#9c9c4c",
    "ep_comm": "#e08a3c",
    "ep_comm_inter": "#a0522d",
    "cp_comm": "#2e8b57",
}


VISIBLE_BLUES = ListedColormap(plt.get_cmap("Blues")(np.linspace(0.3, 1.0, 256)))


@dataclass
class Figure:
    name: str  # file stem: <study>-<name>.html / .png
    title: str
    caption: str  # one sentence under the figure in index.html
    plotly: object  # plotly.graph_objects.Figure
    png: object  # matplotlib.figure.Figure
    stem: str = ""  # set when written


def _label(v) -> str:
    return f"{v.objectives[0]} ({'higher' if v.maximize else 'lower'} is better)"


def _optuna_mpl(name: str, study, **kw):
    """Optuna's matplotlib plot ``name``. Optuna marks that backend experimental; the version is
    pinned (pyproject.toml), so its warning says nothing to a reader of the report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return getattr(om, name)(study, **kw)


def _target(v):
    return {
        "target": (lambda t: t.values[0]) if len(v.study.directions) > 1 else None,
        "target_name": v.objectives[0],
    }


def _mpl(ax_or_axes, title: str, size=SIZE):
    """The matplotlib figure of Optuna's Axes, sized and titled for the report."""
    if hasattr(ax_or_axes, "flat"):  # several panels: one title above them all
        fig = ax_or_axes.flat[0].figure
        fig.suptitle(title, fontsize=13)
    else:  # replaces Optuna's generic "Optimization History Plot" and the like
        fig = ax_or_axes.figure
        for side in ("left", "right"):
            ax_or_axes.set_title("", loc=side)
        ax_or_axes.set_title(title, fontsize=13, pad=12)
    for ax in fig.axes:  # Optuna's "Blues" draws the lowest value white: start it at pale blue
        for artist in ax.collections:
            if getattr(artist, "get_cmap", None) and artist.get_cmap().name == "Blues":
                artist.set_cmap(VISIBLE_BLUES)
    fig.set_size_inches(*size)
    return fig


def _best_so_far(v) -> tuple[list, list]:
    xs, ys, best = [], [], None
    for t in v.ok:
        value = v.value(t)
        best = value if best is None or (value > best) == v.maximize else best
        xs.append(t.number)
        ys.append(best)
    return xs, ys


def history(v):
    """The first objective of every ok trial, the best so far, and the confirmed best."""
    title = f"{v.name}: optimization history"
    study, kw = view_study(v), _target(v)
    fig = ov.plot_optimization_history(study, **kw)
    fig.data = tuple(tr for tr in fig.data if len(tr.x or ()))  # Optuna's empty "infeasible"
    xs, ys = _best_so_far(v)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name="best so far"))
    ax = _optuna_mpl("plot_optimization_history", study, **kw)
    for line in list(ax.lines):  # Optuna's own best line (one objective): ours replaces it
        line.remove()
    ax.step(xs, ys, where="post", color="#c44e52", label="best so far")
    caption = "Each ok trial of the search (repeats and confirm re-runs left out)"
    confirmed = next(
        (c for c in v.confirmed if v.best is not None and c.number == v.best.number), None
    )
    if confirmed is not None:
        name = f"confirmed best #{confirmed.number}: mean ± sd of {len(confirmed.values)} re-runs"
        fig.add_trace(
            go.Scatter(
                x=[confirmed.number],
                y=[confirmed.mean],
                mode="markers",
                marker={"symbol": "diamond", "size": 13, "color": "black"},
                error_y={"type": "data", "array": [confirmed.std]},
                name=name,
            )
        )
        ax.errorbar(
            [confirmed.number],
            [confirmed.mean],
            yerr=[confirmed.std],
            fmt="D",
            color="black",
            markersize=9,
            capsize=5,
            label=name,
        )
        caption += "; the diamond is the confirmed best's mean over its re-runs, with its sd"
    fig.update_layout(title=title, xaxis_title="trial number", yaxis_title=_label(v))
    ax.set_xlabel("trial number")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_label(v))
    ax.legend(loc="best")
    return Figure("history", "Optimization history", caption + ".", fig, _mpl(ax, title))


def importances(v):
    """How much each knob decided the first objective (Optuna's PED-ANOVA importances)."""
    if len(v.ok) < 3 or not v.searched:
        return "knob importances need at least 3 ok trials that differ in a knob"
    title = f"{v.name}: knob importances for {v.objectives[0]}"
    # PED-ANOVA ranks knobs by how they separate the lowest targets from the rest: a maximised
    # objective is negated so "best" means the highest goodput
    kw = {
        "target": (lambda t: -t.values[0]) if v.maximize else (lambda t: t.values[0]),
        "target_name": v.objectives[0],
    }
    study = view_study(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "… low `target` values": negated above
        try:
            fig = ov.plot_param_importances(study, **kw)
            ax = _optuna_mpl("plot_param_importances", study, **kw)
        except (ValueError, RuntimeError) as exc:  # e.g. every trial has the same value
            return f"knob importances: {exc}"
    xlabel = "importance (PED-ANOVA; the knobs' importances sum to 1)"
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title="knob", showlegend=False)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("knob")
    if ax.get_legend() is not None:
        ax.get_legend().remove()  # one bar per knob: Optuna's legend names the target only
    return Figure(
        "importances",
        "Knob importances",
        f"How much each knob that varied decided the best {v.objectives[0]} of the ok "
        "trials (Optuna's PED-ANOVA).",
        fig,
        _mpl(ax, title),
    )


def parallel(v):
    if not v.searched:
        return "no knob varies between ok trials"
    best = sorted(v.ok, key=v.value, reverse=v.maximize)[:PARALLEL]
    which = "every ok trial" if len(best) == len(v.ok) else f"the best {len(best)} ok trials"
    title = f"{v.name}: knobs of {which}"
    study = view_study(v)
    if len(best) < len(v.ok):  # thousands of lines draw one blot, and take a minute to
        kept = {t.number for t in best}
        study = copy_of(study, [t for t in study.trials if t.number in kept])
    kw = _target(v)
    fig = ov.plot_parallel_coordinate(study, **kw)
    ax = _optuna_mpl("plot_parallel_coordinate", study, **kw)
    fig.update_layout(title=title)
    return Figure(
        "parallel",
        "Knobs (parallel coordinates)",
        f"One line per ok trial across the knobs that varied, coloured by {v.objectives[0]}"
        + ("." if len(best) == len(v.ok) else f": the best {len(best)} of {len(v.ok)}."),
        fig,
        _mpl(ax, title, (max(10, 1.6 * len(v.searched)), 6)),
    )


def slice_(v):
    """The first objective of every ok trial against each knob that varied, one panel per knob.
    Drawn from arrays rather than with Optuna's ``plot_slice``, which builds a list and a
    validated plotly value per point: 3 of the 10 s a 10,000-trial study's report took
    (`docs/search.md`)."""
    if not v.searched:
        return "no knob varies between ok trials"
    title = f"{v.name}: {v.objectives[0]} against each knob"
    study = view_study(v)
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    numbers = np.array([t.number for t in trials])
    values = np.array([t.values[0] for t in trials], dtype=float)
    fig = make_subplots(rows=1, cols=len(v.searched), shared_yaxes=True)
    width = min(24, 3.2 * max(3, len(v.searched)))
    with plt.style.context("ggplot"):  # as Optuna's other matplotlib plots
        png, axes = plt.subplots(1, len(v.searched), sharey=True, squeeze=False)
    for column, (knob, ax) in enumerate(zip(v.searched, axes[0]), start=1):
        labels = [str(c) for c in trials[0].distributions[knob].choices]  # sorted: the view's
        x = np.array([str(t.params[knob]) for t in trials])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=values,
                mode="markers",
                marker={
                    "line": {"width": 0.5, "color": "grey"},
                    "color": numbers,
                    "colorscale": "Blues",
                    "showscale": column == 1,
                    "colorbar": {"title": "trial"},
                },
                showlegend=False,
                name=knob,
            ),
            row=1,
            col=column,
        )
        fig.update_xaxes(
            title_text=knob,
            type="category",
            categoryorder="array",
            categoryarray=labels,
            row=1,
            col=column,
        )
        at = {label: i for i, label in enumerate(labels)}
        shown = _on_top(np.array([at[label] for label in x]), values)
        dots = ax.scatter(
            shown[0],
            shown[1],
            c=numbers[shown[2]],
            vmin=numbers.min(),
            vmax=numbers.max(),
            cmap=VISIBLE_BLUES,
            edgecolors="grey",
            linewidths=0.5,
        )
        ax.set_xticks(range(len(labels)), labels, rotation=45)  # 1048576 next to 65536
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_xlabel(knob)
    axes[0][0].set_ylabel(_label(v))
    png.colorbar(dots, ax=axes[0].tolist()).set_label("trial")
    fig.update_yaxes(title_text=_label(v), row=1, col=1)
    fig.update_layout(title=title, width=300 * len(v.searched) if len(v.searched) > 3 else None)
    return Figure(
        "slice",
        "Objective against each knob",
        "Each ok trial once per knob; colour is the trial number (later is darker).",
        fig,
        _mpl(axes, title, (width, 4.6)),
    )


def _on_top(x: np.ndarray, y: np.ndarray, rows: int = 1024) -> tuple:
    """(x, y, indices) of the points the PNG shows: of points at the same ``x`` whose ``y``
    fall in the same of ``rows`` slices of its range (under a pixel), only the last, which is
    drawn over the others. A 10,000-trial study's eight panels draw 18,700, not 82,400."""
    span = float(y.max() - y.min()) or 1.0
    cells = x * (rows + 1) + ((y - y.min()) / span * rows).astype(int)
    _, first_from_end = np.unique(cells[::-1], return_index=True)
    kept = np.sort(len(cells) - 1 - first_from_end)
    return x[kept], y[kept], kept


def pareto(v):
    if len(v.study.directions) < 2:
        return None  # one objective: there is no front to draw, and nothing to say
    title = f"{v.name}: Pareto front"
    study = view_study(v)
    names = v.objectives[:3]
    fig = ov.plot_pareto_front(study, target_names=names)
    ax = _optuna_mpl("plot_pareto_front", study, target_names=names)
    fig.update_layout(title=title)
    return Figure(
        "pareto",
        "Pareto front",
        "Every ok trial by its objectives; the front is what no other trial beats on all of them.",
        fig,
        _mpl(ax, title),
    )
