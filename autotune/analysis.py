"""Studies as pandas DataFrames. Reads storage only; never writes.

Contract: :func:`trials_frame` returns one row per trial with plain columns: ``study``,
``number``, ``state``, ``outcome``, every knob, every metric, ``value_<objective>`` per
objective, ``baseline``, the timing columns, ``repeat_of`` and ``detail``. :func:`compare` stacks several studies and
:func:`summary` gives one row per study (best trial, its knobs and metrics, outcome counts).
"""

from __future__ import annotations

import os

import optuna
import pandas as pd

from autotune import records
from autotune.knobs import KNOB_NAMES
from autotune.spec import SpecError

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"
TIMING = ("run_s", "wall_s", "queued_s", "driver_s")
# repeat_of: the earlier trial whose result a re-sampled candidate got (it was not run again)


def resolve_storage(storage: str | None) -> str:
    return storage or os.environ.get("AUTOTUNE_STORAGE") or DEFAULT_STORAGE


def load_study(name: str, storage: str | None = None) -> optuna.Study:
    """Load an existing study; SpecError naming it when there is no such study."""
    from autotune.study import open_storage

    url = resolve_storage(storage)
    storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise SpecError(f"study {name!r} not found in {url} "
                        f"(studies: {', '.join(names) or 'none'})") from None


def trials_frame(study: str | optuna.Study, storage: str | None = None) -> pd.DataFrame:
    """One row per trial of ``study`` (a name or a loaded Study), knobs and metrics as columns."""
    if isinstance(study, str):
        study = load_study(study, storage)
    objectives = study.user_attrs.get("objectives") or [f"objective{i}" for i in
                                                         range(len(study.directions))]
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"study": study.study_name, "number": t.number, "state": t.state.name,
               "outcome": records.outcome_of(t), "baseline": bool(t.user_attrs.get("baseline"))}
        row.update(records.knobs_of(t))
        for name in records.METRICS + TIMING:
            row[name] = t.user_attrs.get(name)
        for name, value in zip(objectives, t.values or [None] * len(objectives)):
            row[f"value_{name}"] = value
        row["repeat_of"] = t.user_attrs.get("repeat_of")
        row["retry_of"] = t.user_attrs.get("retry_of")  # ran again after an infrastructure failure
        row["infrastructure"] = records.is_infrastructure(t)
        row["detail"] = t.user_attrs.get("detail", "")
        rows.append(row)
    columns = (["study", "number", "state", "outcome", "baseline", *KNOB_NAMES, *records.METRICS,
                *(f"value_{o}" for o in objectives), *TIMING, "repeat_of", "retry_of",
                "infrastructure", "detail"])
    return pd.DataFrame(rows, columns=columns)


def compare(studies, storage: str | None = None) -> pd.DataFrame:
    """All trials of several studies in one frame (``study`` column tells them apart)."""
    frames = [trials_frame(s, storage) for s in studies]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summary(studies, storage: str | None = None) -> pd.DataFrame:
    """One row per study: trial counts by outcome, then the best ok trial's knobs and metrics."""
    rows = []
    for name in studies:
        frame = trials_frame(name, storage)
        value_cols = [c for c in frame.columns if c.startswith("value_")]
        study = load_study(name, storage) if isinstance(name, str) else name
        maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        ok = frame[frame["outcome"] == "ok"]
        row = {"study": study.study_name, "trials": len(frame), "ok": len(ok)}
        for outcome in records.OUTCOMES[1:]:
            row[outcome] = int((frame["outcome"] == outcome).sum())
        if len(ok):
            best = ok.sort_values(value_cols[0], ascending=not maximize).iloc[0]
            row["best_trial"] = int(best["number"])
            row.update({k: best[k] for k in KNOB_NAMES})
            row.update({m: best[m] for m in records.METRICS})
        rows.append(row)
    return pd.DataFrame(rows).set_index("study").T
