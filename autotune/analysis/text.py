"""Numbers and values as the terminal views print them (`autotune.analysis.show`, the report's
page, the live progress of a study)."""

from __future__ import annotations


def fmt(value) -> str:
    """A value for a table cell: floats to 4 significant digits, None as empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
