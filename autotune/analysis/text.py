"""Numbers and values as the terminal views print them (`autotune.analysis.show`, the report's
page, the live progress of a study), and the one sentence every view gives for what a study
without an ``ok`` trial cannot have (:func:`no_ok_trial`)."""

from __future__ import annotations


def fmt(value) -> str:
    """A value for a table cell: floats to 4 significant digits, None as empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def no_ok_trial(outcomes) -> str:
    """Why a study whose trials ended with ``outcomes`` (one outcome per trial) has no best, no
    value and no per-trial figure: none finished ``ok``."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    ended = ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "no trials"
    return f"no trial finished ok ({ended})"
