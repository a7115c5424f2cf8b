"""Replay tables: measured candidates standing in for trial runs (``cluster.backend: replay``).

Contract: :func:`load_table` reads ``cluster.replay`` (a CSV with a header row) for one spec and
space and returns a :class:`ReplayTable`, or raises SpecError naming the file, the row (data
rows count from 1, the header excluded) and the column; nothing is written either way.

- Knob columns (named as the knobs are) say which candidate a row measured; a knob without a
  column matches any value. A value must be one the knob can take in the space (for ``dp:
  auto``: devices / (tp·pp)); a knob is read only where it acts on the row's layout
  (``micro_batches`` with pp > 1, ``grad_accum`` with pp = 1, ``parallel_optimizer`` with
  dp > 1: `autotune.spec.knobs.is_active`), as a candidate resolves it; true/false for a
  boolean knob.
- Metric columns are named as trial metrics (`autotune.jobs.METRICS`: ``goodput``,
  ``step_time_ms``, ``peak_memory_mb``, ``loss_last``, …): numbers (``diverged``: true/false),
  an empty cell is a metric not measured. ``run_s`` (seconds the run took) is kept for the
  trial's timing, ``detail`` for a failed row's reason.
- ``outcome`` (``ok`` when the column is absent or the cell empty) is any trial outcome; an
  ``ok`` row needs a finite value for every objective of the study. An ``error`` row whose
  ``infrastructure`` cell is true is a failure of the infrastructure, not of the candidate
  (the study retries it); ``infrastructure`` on any other outcome is an error.
- A candidate may have several rows, in table order: each run of it in a session takes the next
  (after the last, the first again), so re-runs see the spread that was measured
  (:meth:`ReplayTable.rows_of`; :attr:`ReplayTable.varies` when some candidate has several).
  A candidate without a row is ``infeasible`` (:data:`MISSING`): a study rejects it before it
  is dispatched (:meth:`ReplayTable.missing`), the executor answers so for one dispatched
  anyway (a confirm re-run or retry runs as it is).
- Rows that are no run of their candidate are skipped: ``interrupted`` ones, and those a study's
  own CSV (``autotune compare --csv``) marks as a repeat (``repeat_of``: answered from storage).
  Its confirm-phase re-runs and retried failures are runs: further rows of their candidate.
- ``engine`` (optional) names what executed the rows — ``trainer`` (autotune's trainer),
  ``mindspore`` (MindSpore's own engine: a MindFormers run, or a ``simulate`` study's
  estimates), ``megatron`` — the same in every row that gives it; :func:`with_engine` makes it
  the spec's ``cluster.replay_engine``, so the prior prices the program that produced the
  measurements (`autotune.costmodel.estimate.default_engine`).
- Every other column is ignored, with one note naming them all.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.jobs import METRICS, OUTCOMES
from autotune.spec.backends import ENGINES
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOB_NAMES, KNOBS, is_active
from autotune.spec.objectives import OBJECTIVES

SKIP_MARKERS = ("repeat_of",)
MISSING = "not in the replay table"  # a candidate without a row: infeasible, never run
KEPT = ("outcome", "run_s", "detail", "infrastructure", "confirm_of", "retry_of", "engine")
FALSE, TRUE = ("false", "0", "no"), ("true", "1", "yes")


@dataclass(frozen=True)
class Row:
    """One candidate's measurement: how it ended, its metrics, and where it came from."""

    outcome: str
    metrics: dict
    detail: str
    run_s: float | None
    row: int
    infrastructure: bool = False


class ReplayTable:
    """Candidates → their measured rows, in table order (see the module doc)."""

    def __init__(
        self, path: Path, knobs: tuple, rows: dict, notes: list[str], engine: str | None = None
    ):
        self.path, self.knobs, self.rows, self.notes = path, knobs, rows, notes
        self.varies = any(len(found) > 1 for found in rows.values())
        self.engine = engine  # what executed the rows (its ``engine`` column), None: unsaid

    def key(self, values) -> tuple:
        """The lookup key of a candidate (or of a row's values): its value of each knob column."""
        get = values.get if isinstance(values, dict) else lambda name: getattr(values, name)
        return tuple(get(name) for name in self.knobs)

    def rows_of(self, candidate) -> list[Row]:
        """The rows that measured ``candidate``, in table order (none: not in the table)."""
        return self.rows.get(self.key(candidate), [])

    def missing(self, candidate) -> str:
        """Why ``candidate`` cannot be replayed (:data:`MISSING`), "" when it has a row."""
        return "" if self.rows_of(candidate) else MISSING

    def __len__(self) -> int:
        return len(self.rows)


def _acts(name: str, dp: int | None, pp: int | None, cp: int | None) -> bool:
    """Whether knob ``name`` acts on a row of this dp, pp and cp (None: the table has no column
    for it, so the row may stand for any value and every knob is read as written)."""
    dps, pps = (1, 2) if dp is None else (dp,), (1, 2) if pp is None else (pp,)
    cps = (1, 2) if cp is None else (cp,)
    return any(is_active(name, d, p, c) for d in dps for p in pps for c in cps)


def _allowed(space, spec) -> dict:
    """knob → the values a candidate of ``space`` can have for it (where the knob acts)."""
    allowed = {name: set(space.domains[name]) for name in KNOB_NAMES}
    if space.domains["dp"] == ("auto",):
        allowed["dp"] = {
            max(1, spec.cluster.devices // (tp * pp))
            for tp in space.domains["tp"]
            for pp in space.domains["pp"]
        }
    return allowed


class _Reader:
    """Parses one table; every error names the file, the row and the column."""

    def __init__(self, path: Path, spec, space):
        self.path, self.spec, self.allowed = path, spec, _allowed(space, spec)
        self.engine: str | None = None

    def engine_of(self, row: int, text: str | None) -> None:
        """Check the row's ``engine`` cell: one of ENGINES, the same as every other row's."""
        text = (text or "").strip()
        if not text:
            return
        if text not in ENGINES:
            self.fail(row, "engine", f"{text!r} is not one of {', '.join(ENGINES)}")
        if self.engine not in (None, text):
            self.fail(row, "engine", f"{text!r}, but earlier rows ran {self.engine!r}")
        self.engine = text

    def fail(self, row: int, column: str, message: str):
        raise SpecError(f"{self.path}: row {row}, column {column}: {message}")

    def knob(self, row: int, name: str, text: str | None):
        text = (text or "").strip()
        if not text:
            self.fail(row, name, "empty (a knob column needs a value in every row)")
        if KNOBS[name].kind is int:
            try:
                number = float(text)
            except ValueError:
                self.fail(row, name, f"{text!r} is not an integer")
            if not number.is_integer():
                self.fail(row, name, f"{text!r} is not an integer")
            value = int(number)
        elif KNOBS[name].kind is bool:
            if text.lower() not in FALSE + TRUE:
                self.fail(row, name, f"{text!r} is not true or false")
            value = text.lower() in TRUE
        else:
            value = text
        if value not in self.allowed[name]:
            shown = ", ".join(map(str, sorted(self.allowed[name], key=str)))
            self.fail(row, name, f"{value!r} is not in the space of {self.spec.source} ({shown})")
        return value

    def metric(self, row: int, name: str, text: str):
        text = (text or "").strip()
        if name == "diverged":
            if text.lower() not in FALSE + TRUE:
                self.fail(row, name, f"{text!r} is not true or false")
            return text.lower() in TRUE
        try:
            return float(text)
        except ValueError:
            self.fail(row, name, f"{text!r} is not a number")

    def read(self, record: dict, row: int, knobs: tuple) -> tuple[tuple, Row] | None:
        """A data row → (key, Row), or None when the row is skipped."""
        outcome = (record.get("outcome") or "").strip() or "ok"
        if outcome not in OUTCOMES:
            self.fail(row, "outcome", f"{outcome!r} is not one of {', '.join(OUTCOMES)}")
        marked = any(
            (record.get(m) or "").strip().lower() not in ("", "nan", "none") + FALSE
            for m in SKIP_MARKERS
        )
        if outcome == "interrupted" or marked:
            return None
        values = {}
        pp = self.knob(row, "pp", record["pp"]) if "pp" in knobs else None
        dp = self.knob(row, "dp", record["dp"]) if "dp" in knobs else None
        cp = self.knob(row, "cp", record["cp"]) if "cp" in knobs else None
        for name in knobs:
            if not _acts(name, dp, pp, cp):
                values[name] = KNOBS[name].default  # does not act here: as a candidate resolves it
            else:
                values[name] = self.knob(row, name, record[name])
        metrics = {
            name: self.metric(row, name, record[name])
            for name in METRICS
            if name in record and (record[name] or "").strip()
        }
        if outcome == "ok":
            for objective in self.spec.search.objectives:
                name = OBJECTIVES[objective].metric
                if not isinstance(metrics.get(name), float) or not math.isfinite(metrics[name]):
                    self.fail(row, name, f"an ok row needs a finite {name} (objective {objective})")
        run_s = None
        if (record.get("run_s") or "").strip():
            run_s = self.metric(row, "run_s", record["run_s"])
            if not math.isfinite(run_s) or run_s < 0:
                self.fail(row, "run_s", f"{run_s} is not a duration in seconds")
        detail = "" if outcome == "ok" else (record.get("detail") or "").strip()
        infrastructure = self.flag(row, "infrastructure", record.get("infrastructure"))
        if infrastructure and outcome != "error":
            self.fail(
                row, "infrastructure", f"only an error is the infrastructure's, not {outcome!r}"
            )
        return tuple(values[name] for name in knobs), Row(
            outcome, metrics, detail, run_s, row, infrastructure
        )

    def flag(self, row: int, name: str, text: str | None) -> bool:
        text = (text or "").strip().lower()
        if text not in ("", "nan", "none") + FALSE + TRUE:
            self.fail(row, name, f"{text!r} is not true or false")
        return text in TRUE


def load_table(spec, space) -> ReplayTable:
    """Read and check ``spec.cluster.replay`` against ``space`` (see the module doc)."""
    path = Path(spec.cluster.replay)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames
            if not header:
                raise SpecError(f"{path}: empty: a replay table starts with a header row")
            repeated = sorted({c for c in header if header.count(c) > 1})
            if repeated:
                raise SpecError(f"{path}: column {repeated[0]} is given twice")
            knobs = tuple(name for name in KNOB_NAMES if name in header)
            table = _Reader(path, spec, space)
            rows, skipped = {}, 0
            for number, record in enumerate(reader, start=1):
                if None in record:  # more cells than the header has columns
                    raise SpecError(
                        f"{path}: row {number}: {len(header) + len(record[None])} "
                        f"cells for {len(header)} columns"
                    )
                table.engine_of(number, record.get("engine"))
                read = table.read(record, number, knobs)
                if read is None:
                    skipped += 1
                    continue
                key, row = read
                rows.setdefault(key, []).append(row)
    except OSError as exc:
        raise SpecError(f"cluster.replay: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"cluster.replay: {path} is not a text (UTF-8) file") from None
    except csv.Error as exc:
        raise SpecError(f"{path}: not a CSV file: {exc}") from None
    notes = _notes(path, header, knobs, rows, skipped, space)
    if table.engine:
        notes.append(
            f"replay: its rows ran the {table.engine} engine (column engine): the cost model prices that"
        )
    return ReplayTable(path, knobs, rows, notes, table.engine)


def with_engine(spec, table: ReplayTable):
    """``spec`` with ``cluster.replay_engine`` the engine ``table``'s rows ran, when its
    ``engine`` column says and model.yaml does not; SpecError when the two disagree."""
    stated = spec.cluster.replay_engine
    if table.engine is None or stated == table.engine:
        return spec
    if stated is not None:
        raise SpecError(
            f"cluster.replay_engine: {stated}, but the engine column of {table.path} says "
            f"its rows ran {table.engine}"
        )
    return replace(spec, cluster=replace(spec.cluster, replay_engine=table.engine))


def _notes(path: Path, header, knobs: tuple, rows: dict, skipped: int, space) -> list[str]:
    runs = sum(map(len, rows.values()))
    notes = [
        f"replay: {len(rows)} measured candidates in {path.name}"
        + (f" ({runs} rows: a candidate's runs take its rows in turn)" if runs > len(rows) else "")
    ]
    ignored = [c for c in header if c not in (*KNOB_NAMES, *METRICS, *KEPT, *SKIP_MARKERS)]
    if ignored:
        notes.append(f"replay: columns ignored: {', '.join(ignored)}")
    if skipped:
        notes.append(
            f"replay: {skipped} rows skipped (interrupted runs and repeats: no run of "
            "their candidate)"
        )
    unmatched = [name for name in space.searched() if name not in knobs]
    if unmatched:
        notes.append(f"replay: no column for {', '.join(unmatched)}: a row matches any value")
    return notes
