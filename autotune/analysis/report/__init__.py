"""``autotune report``: one folder with an ``index.html`` and every figure of one or more studies.

Contract: :func:`write_report` reads the studies (storage only) and writes ``out/``:
``index.html`` (each study's standing, the diagnosis of its best and baseline, each figure's PNG
linking to its interactive HTML, and for several studies their summary and histories on one
axis), ``<study>-<figure>.html`` (plotly; ``plotly.min.js`` beside them, so the folder works
offline) and ``<study>-<figure>.png`` (matplotlib) for each figure of
`autotune.analysis.report.figures` and `autotune.analysis.report.measured`. It returns the
index's path.

Errors are :class:`~autotune.spec.errors.SpecError` (exit 2) and leave nothing behind: plotting
packages missing (naming the ``pip install``), an unknown study, an ``out`` that is not empty
without ``overwrite``. The report is written to a temporary folder beside ``out`` and renamed
into place only when complete (`autotune.files.staged_folder`).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from autotune.files import staged_folder
from autotune.spec.errors import SpecError

INSTALL = "pip install matplotlib plotly  (the plots extra: pip install -e '.[plots]')"
DPI = 100


def _plotting():
    """The figure modules, or a SpecError naming what to install."""
    for package in ("matplotlib", "plotly"):
        try:
            importlib.import_module(package)
        except ImportError:
            raise SpecError(f"autotune report needs {package}: {INSTALL}") from None
    from autotune.analysis.report import figures, measured

    return figures, measured


def _slugs(names: list[str]) -> list[str]:
    """File-name-safe, distinct prefixes for the studies."""
    slugs = []
    for name in names:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "study"
        while slug in slugs or slug == "studies":
            slug += "_"
        slugs.append(slug)
    return slugs


def write_report(
    names: list[str], out: Path, storage: str | None = None, overwrite: bool = False
) -> Path:
    figures, measured = _plotting()
    from autotune.analysis.report.page import render_index
    from autotune.analysis.view import view

    views = [view(name, storage) for name in names]  # an unknown study fails before any write
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise SpecError(f"--out {out}: exists and is not empty (--force replaces it)")
    with staged_folder(out) as tmp:
        import plotly.offline

        (tmp / "plotly.min.js").write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
        sections = []
        builders = {
            "history": figures.history,
            "importances": figures.importances,
            "parallel": figures.parallel,
            "slice": figures.slice_,
            "pareto": figures.pareto,
            "memory": measured.memory,
            "estimate": measured.estimate,
            "breakdown": measured.breakdown,
            "trial-time": measured.trial_time,
        }
        for v, slug in zip(views, _slugs(names)):
            # a study without an ok trial has no point to plot: each figure says so, not drawn
            drawn = [
                (
                    name,
                    v.why_no_ok
                    if v.why_no_ok and (name != "pareto" or len(v.objectives) > 1)
                    else build(v),
                )
                for name, build in builders.items()
            ]
            sections.append(
                (v, [_named(name, _write(tmp, slug, figure)) for name, figure in drawn])
            )
        together = None
        if len(views) > 1:
            together = _named(
                "studies-history",
                _write(
                    tmp,
                    "studies",
                    measured.studies(views)
                    if any(v.ok for v in views)
                    else "no study has a trial that finished ok",
                ),
            )
        (tmp / "index.html").write_text(
            render_index(sections, together, names, storage), encoding="utf-8"
        )
    return out / "index.html"


def _named(name: str, figure):
    """A figure, None, or the reason it is missing as ``"NAME: reason"``."""
    return f"{name}: {figure}" if isinstance(figure, str) else figure


def _write(folder: Path, slug: str, figure):
    """Write a figure's HTML and PNG; pass through a reason (str) or None (not applicable)."""
    if figure is None or isinstance(figure, str):
        return figure
    import matplotlib.pyplot as plt

    stem = f"{slug}-{figure.name}"
    figure.plotly.write_html(
        folder / f"{stem}.html", include_plotlyjs="plotly.min.js", full_html=True
    )
    figure.png.savefig(folder / f"{stem}.png", dpi=DPI, bbox_inches="tight", facecolor="white")
    plt.close(figure.png)
    figure.stem = stem
    return figure
