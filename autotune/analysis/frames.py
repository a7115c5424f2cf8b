"""Studies as pandas DataFrames. Reads storage only; never writes.

Contract: :func:`trials_frame` returns one row per trial with plain columns: ``study``,
``number``, ``state``, ``outcome``, ``engine`` (what executed the study's trials, as the cost
model names it; None for a study older than the attribute), every knob, every metric, ``value_<objective>`` per
objective, ``baseline``, the timing columns, ``repeat_of``, ``retry_of``, ``confirm_of``,
``infrastructure``, ``detail`` and ``verdict`` (the bottleneck diagnosis of an ``ok`` trial,
`autotune.costmodel.diagnosis`). :func:`compare` stacks several studies and :func:`summary` gives
one column per study: trial counts by outcome, the best trial (`autotune.analysis.ranking`), its
first objective, the confirmed mean where the confirm phase ran, ``trials_to_3pct`` (of the
trials the search ran, `autotune.storage.counting.is_search_trial`, in order: how many until
the first ``ok`` one within 3% of the best), ``device_hours`` (every trial's run time × its
devices), of which ``device_hours_fixed`` and ``device_hours_measured`` (the measured steps;
`autotune.analysis.trial_time`), ``median_fixed_per_measured`` (the median trial's fixed time
÷ its measured steps) and the best trial's knobs and metrics — or, for a study without an ``ok`` trial,
``no_best`` saying why it has none of them.
"""

from __future__ import annotations

import optuna
import pandas as pd

from autotune.analysis import ranking, trial_time
from autotune.analysis.text import no_ok_trial
from autotune.costmodel import diagnosis
from autotune.jobs import METRICS, OUTCOMES
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage.bulk import read_all
from autotune.storage.connection import load_study
from autotune.storage.counting import search_trials
from autotune.storage.schema import is_infrastructure, knobs_of, maximizes, outcome_of

TIMING = ("run_s", "wall_s", "queued_s", "driver_s")
# repeat_of: the earlier trial whose result a re-sampled candidate got (it was not run again)


def trials_frame(study: str | optuna.Study, storage: str | None = None) -> pd.DataFrame:
    """One row per trial of ``study`` (a name or a loaded Study), knobs and metrics as columns."""
    study = load_study(study, storage) if isinstance(study, str) else study
    read_all(study)  # (a study given loaded: its trials in one pass too)
    attrs = study.user_attrs  # one read: each read of it is a query
    objectives = attrs.get("objectives") or [f"objective{i}" for i in range(len(study.directions))]
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {
            "study": study.study_name,
            "number": t.number,
            "state": t.state.name,
            "outcome": outcome_of(t),
            "baseline": bool(t.user_attrs.get("baseline")),
            "engine": attrs.get("engine"),  # what ran it (None: an older study)
        }
        knobs = knobs_of(t)
        row.update(knobs)
        for name in METRICS + TIMING:
            row[name] = t.user_attrs.get(name)
        for name, value in zip(objectives, t.values or [None] * len(objectives)):
            row[f"value_{name}"] = value
        row["repeat_of"] = t.user_attrs.get("repeat_of")
        row["retry_of"] = t.user_attrs.get("retry_of")  # ran again after an infrastructure failure
        row["confirm_of"] = t.user_attrs.get("confirm_of")
        row["infrastructure"] = is_infrastructure(t)
        row["detail"] = t.user_attrs.get("detail", "")
        found = diagnosis.of_trial(t, knobs, attrs)
        row["verdict"] = found["verdict"] if found else ""
        rows.append(row)
    columns = [
        "study",
        "number",
        "state",
        "outcome",
        "baseline",
        "engine",
        *KNOB_NAMES,
        *METRICS,
        *(f"value_{o}" for o in objectives),
        *TIMING,
        "repeat_of",
        "retry_of",
        "confirm_of",
        "infrastructure",
        "detail",
        "verdict",
    ]
    return pd.DataFrame(rows, columns=columns)


def compare(studies, storage: str | None = None) -> pd.DataFrame:
    """All trials of several studies in one frame (``study`` column tells them apart)."""
    frames = [trials_frame(s, storage) for s in studies]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


WITHIN = 0.03  # "trials to reach within 3% of the best"


def summary(studies, storage: str | None = None) -> pd.DataFrame:
    """One column per study (see the module doc); rows are the fields."""
    rows = []
    for name in studies:
        study = load_study(name, storage) if isinstance(name, str) else name
        frame = trials_frame(study)
        maximize = maximizes(study)
        searched = [t.number for t in search_trials(study.get_trials(deepcopy=False))]
        ran = frame[frame["number"].isin(searched)].sort_values("number")
        ok = ran[ran["outcome"] == "ok"]
        row = {
            "study": study.study_name,
            "trials": len(frame),
            "ok": int((frame["outcome"] == "ok").sum()),
        }
        for outcome in OUTCOMES[1:]:
            row[outcome] = int((frame["outcome"] == outcome).sum())
        devices = frame["dp"] * frame["tp"] * frame["pp"]
        row["device_hours"] = float((frame["run_s"].astype(float).fillna(0) * devices).sum() / 3600)
        spent = trial_time.device_time(
            (t, knobs["dp"] * knobs["tp"] * knobs["pp"])
            for t in study.get_trials(deepcopy=False)
            if "run_s" in t.user_attrs
            for knobs in [knobs_of(t)]
        )
        row["device_hours_fixed"] = spent["fixed_s"] / 3600
        row["device_hours_measured"] = spent["measured_s"] / 3600
        row["median_fixed_per_measured"] = spent["median_ratio"]
        first = next(c for c in frame.columns if c.startswith("value_"))
        if len(ok):
            # stable: of equal values the earliest trial is the best (as pandas idxmax answers)
            best = ok.sort_values(first, ascending=not maximize, kind="stable").iloc[0]
            row["best_trial"] = int(best["number"])
            row[f"best_{first[len('value_') :]}"] = best[first]
            confirmed = ranking.best_confirmed(study)
            if confirmed is not None:
                row["confirmed_trial"] = confirmed.number
                row["confirmed_mean"], row["confirmed_sd"] = confirmed.mean, confirmed.std
            row["trials_to_3pct"] = _trials_to_reach(ran, first, best[first], maximize)
            row["noise_floor"] = study.user_attrs.get("noise_floor")
            row.update({k: best[k] for k in KNOB_NAMES})
            # not the metric ``diverged``: the row of that name counts diverged trials
            row.update({m: best[m] for m in METRICS if m != "diverged"})
        else:  # what the study cannot have, and why
            row["no_best"] = no_ok_trial(frame["outcome"])
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("study")
    best_trial = [*KNOB_NAMES, *(m for m in METRICS if m != "diverged")]
    fields = [c for c in frame.columns if c not in best_trial]  # counts and summary first
    return frame[fields + [c for c in frame.columns if c in best_trial]].T


def _trials_to_reach(ran: pd.DataFrame, column: str, best: float, maximize: bool) -> int:
    """How many of the trials run (in order) it took to get within :data:`WITHIN` of ``best``."""
    target = best * (1 - WITHIN) if maximize else best * (1 + WITHIN)
    if best < 0:  # "within 3%" of a negative value is the other way round
        target = best * (1 + WITHIN) if maximize else best * (1 - WITHIN)
    close = ran[ran[column] >= target] if maximize else ran[ran[column] <= target]
    return int((ran["number"] <= close["number"].iloc[0]).sum())
