"""A study as `autotune show` and `autotune report` see it. Reads storage only; never writes.

Contract: :func:`view` loads a study once into a :class:`StudyView`:

- ``ran``: the trials the search ran (`autotune.storage.counting.is_search_trial`), in trial
  order; ``ok``: those whose outcome is ``ok`` (the points of every per-trial figure of the
  report); ``why_no_ok``: the reason every view gives for what a study without one lacks;
- ``best``: the confirmed best (`autotune.analysis.ranking.best_confirmed`) when the confirm phase ran,
  else the best ``ok`` trial (several objectives: the Pareto point best on the first);
  ``baseline``: the baseline trial; ``confirmed``: every confirmed trial's mean and spread;
- ``searched``: the knobs whose value differs between ``ok`` trials (the ones worth showing);
- :meth:`StudyView.diagnosis`: a trial's stored diagnosis, or one computed now for a trial
  recorded before diagnoses were stored (`autotune.costmodel.diagnosis`); :meth:`StudyView.estimate`:
  the cost model's uncalibrated estimate of a trial's candidate (deterministic, so recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import optuna

from autotune import costmodel
from autotune.analysis import ranking
from autotune.analysis.text import no_ok_trial
from autotune.costmodel import diagnosis
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage.connection import load_study
from autotune.storage.counting import search_trials
from autotune.storage.schema import knobs_of, maximizes, outcome_of


@dataclass
class StudyView:
    study: optuna.Study
    trials: list  # every trial, frozen, in trial order
    ran: list
    ok: list
    objectives: list
    best: object | None
    baseline: object | None
    confirmed: list
    _diagnoses: dict = field(default_factory=dict, repr=False)
    _knobs: dict = field(default_factory=dict, repr=False)  # number → knobs_of(trial)
    derived: dict = field(default_factory=dict, repr=False)  # what a figure builds once, by name

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def why_no_ok(self) -> str | None:
        """Why the study has no best and no per-trial figure (`autotune.analysis.text.no_ok_trial`),
        or None when a trial finished ``ok``."""
        return None if self.ok else no_ok_trial(outcome_of(t) for t in self.trials)

    @property
    def maximize(self) -> bool:
        """Whether the first objective is maximised."""
        return maximizes(self.study)

    @cached_property
    def attrs(self) -> dict:
        """The study's user attrs, read once (each read of ``study.user_attrs`` is a query)."""
        return self.study.user_attrs

    @cached_property
    def spec(self):
        """The study's model.yaml as a Spec, or None when it cannot be read back."""
        from autotune.spec.model_yaml import parse_spec

        attrs = self.attrs
        try:
            return parse_spec(
                attrs["model_yaml"], Path(attrs.get("model_yaml_path", ".")), stored=True
            )
        except (KeyError, ValueError, OSError):  # SpecError too: an older or moved study
            return None

    @cached_property
    def budget_gb(self) -> float | None:
        """Device memory of one device (on CPU, a worker's RSS budget), GiB."""
        return diagnosis.memory_budget_gb(self.attrs)

    @cached_property
    def searched(self) -> list[str]:
        varying = [k for k in KNOB_NAMES if len({str(self.knobs(t)[k]) for t in self.ok}) > 1]
        return varying or [k for k in KNOB_NAMES if self.ok and k in self.ok[0].params]

    @property
    def noise_floor(self) -> float | None:
        """The study's noise floor: stored by the confirm phase, or from its re-runs so far."""
        stored = self.attrs.get("noise_floor")
        return stored if stored is not None else ranking.noise_floor(self.confirmed)

    def knobs(self, trial) -> dict:
        if trial.number not in self._knobs:
            self._knobs[trial.number] = knobs_of(trial)
        return self._knobs[trial.number]

    def devices(self, trial) -> int:
        """The devices ``trial`` ran on (dp·tp·pp)."""
        knobs = self.knobs(trial)
        return knobs["dp"] * knobs["tp"] * knobs["pp"]

    def diagnosis(self, trial) -> dict | None:
        if trial.number not in self._diagnoses:
            self._diagnoses[trial.number] = diagnosis.of_trial(trial, self.knobs(trial), self.attrs)
        return self._diagnoses[trial.number]

    def estimate(self, trial):
        """The raw cost-model estimate of ``trial``'s candidate (None without the spec)."""
        return (
            None
            if self.spec is None
            else costmodel.estimate(self.spec, Candidate(**self.knobs(trial)))
        )

    def value(self, trial) -> float | None:
        """The first objective of an ``ok`` trial."""
        return trial.values[0] if trial.values else None

    def label(self, trial) -> str:
        """``#12`` plus what the trial is: the baseline, the best."""
        roles = (
            ["baseline"]
            if self.baseline is not None and trial.number == self.baseline.number
            else []
        ) + (["best"] if self.best is not None and trial.number == self.best.number else [])
        return f"#{trial.number}" + (f" ({', '.join(roles)})" if roles else "")


def view(name: str, storage: str | None = None) -> StudyView:
    """Load study ``name`` (SpecError naming it when it does not exist)."""
    study = load_study(name, storage)
    trials = study.get_trials(deepcopy=False)
    ran = search_trials(trials)
    ok = [t for t in ran if outcome_of(t) == "ok" and t.values]
    best_confirmed = ranking.best_confirmed(study)
    by_number = {t.number: t for t in trials}
    best = (
        by_number[best_confirmed.number]
        if best_confirmed is not None
        else next(iter(ranking.best_trials(study)), None)
    )
    objectives = study.user_attrs.get("objectives") or [
        f"objective{i}" for i in range(len(study.directions))
    ]
    return StudyView(
        study,
        trials,
        ran,
        ok,
        objectives,
        best,
        ranking.baseline_of(study),
        ranking.summarize(study),
    )
