"""The report's ``index.html``: plain HTML, no script of its own (the figures' pages have theirs).

Contract: :func:`render_index` takes ``[(StudyView, [Figure | str | None, …]), …]``, the
several-studies figure (or None) and the study names, and returns the page: per study its
standing (trials by outcome, best, baseline, confirmed means, noise floor), the diagnosis of the
best and the baseline, then each figure (its PNG, linking to its interactive HTML) or, for a
figure missing, a str ``"NAME: reason"`` (a study without an ``ok`` trial has every per-trial
figure so, and says why it has no best); for several studies, the per-study summary of `autotune.analysis.frames.summary` and
their histories on one axis. Every text from storage is HTML-escaped.
"""

from __future__ import annotations

from html import escape

from autotune.analysis.text import fmt
from autotune.costmodel.diagnosis import PARTS, fact_lines
from autotune.storage.schema import outcome_of

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
img{max-width:100%;border:1px solid #ddd}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}
.verdict{font-weight:bold}.why{color:#777}"""


def render_index(sections, together, names, storage) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>autotune report: "
        f"{escape(', '.join(names))}</title><style>{STYLE}</style></head><body>",
        f"<h1>autotune report: {escape(', '.join(names))}</h1>",
    ]
    if together is not None:
        from autotune.analysis.frames import summary

        table = summary([v.study for v, _ in sections])
        parts.append(
            "<h2>Studies side by side</h2>"
            + table.to_html(na_rep="", float_format=lambda x: f"{x:.4g}")
        )
        parts.append(_figure_or_why(together))
    for v, figures in sections:
        parts.append(f"<h2>Study {escape(v.name)}</h2>")
        parts.append(_standing(v))
        for t in [v.best] + ([v.baseline] if v.baseline is not v.best else []):
            if t is not None and v.diagnosis(t):
                parts.append(_diagnosis(v, t))
        parts.extend(_figure_or_why(figure) for figure in figures if figure is not None)
    parts.append("</body></html>")
    return "\n".join(parts)


def _figure_or_why(figure) -> str:
    if isinstance(figure, str):
        return f"<p class='why'>(no figure {escape(figure)})</p>"
    return _figure(figure)


def _figure(figure) -> str:
    return (
        f"<h3>{escape(figure.title)}</h3><p>{escape(figure.caption)} "
        f"<a href='{figure.stem}.html'>interactive</a></p>"
        f"<a href='{figure.stem}.html'><img src='{figure.stem}.png' "
        f"alt='{escape(figure.title)}'></a>"
    )


def _standing(v) -> str:
    counts: dict[str, int] = {}
    for t in v.trials:
        counts[outcome_of(t)] = counts.get(outcome_of(t), 0) + 1
    objective = v.objectives[0]
    confirmed = {c.number: c for c in v.confirmed}
    rows = [
        f"<p>backend {escape(str(v.attrs.get('backend', '?')))}, objectives "
        f"{escape(', '.join(v.objectives))}; {len(v.trials)} trials: "
        f"{escape(', '.join(f'{k} {n}' for k, n in sorted(counts.items())))}</p><ul>"
    ]
    for what, t in (("best", v.best), ("baseline", v.baseline)):
        if t is None:
            if v.why_no_ok:
                rows.append(f"<li>{what}: none: {escape(v.why_no_ok)}</li>")
            continue
        knobs = " ".join(f"{k}={val}" for k, val in v.knobs(t).items())
        value = v.value(t)
        line = (
            f"{what}: #{t.number} {objective} {fmt(value)}"
            if value is not None
            else f"{what}: #{t.number} {outcome_of(t)}, no {objective}"
        )
        c = confirmed.get(t.number)
        if c is not None:
            line += (
                f", confirmed {fmt(c.mean)} ± {fmt(c.std)} over {len(c.values)} re-runs "
                f"(original {fmt(c.original)} not included"
                + ("" if c.within_run is None else f"; ±{c.within_run:.1%} within a run")
                + ")"
            )
        rows.append(f"<li>{escape(line)} <small>({escape(knobs)})</small></li>")
    floor = v.noise_floor
    if floor is not None:
        rows.append(f"<li>noise floor {floor:.1%}: differences below it are not findings</li>")
    return "".join(rows) + "</ul>"


def _diagnosis(v, t) -> str:
    d = v.diagnosis(t)
    cells = "".join(
        f"<tr><td>{escape(label)}</td><td>{d['parts_ms'][part]:.4g}</td>"
        f"<td>{d['shares'][part]:.1%}</td></tr>"
        for part, label in PARTS.items()
        if d["parts_ms"][part]
    )
    facts = "".join(f"<li>{escape(line)}</li>" for line in fact_lines(d["facts"]))
    return (
        f"<h3>Diagnosis of {escape(v.label(t))}</h3>"
        f"<p class='verdict'>{escape(d['verdict'])}</p>"
        f"<table><tr><th>part</th><th>ms per step</th><th>share</th></tr>{cells}</table>"
        f"<p>measured:</p><ul>{facts}</ul>"
    )
