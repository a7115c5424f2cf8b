"""Which trial of a stored study is exported, and exporting it.

Contract:
- :func:`select_trial` is the export's selection policy: ``--trial N`` when given (it must exist
  and be ``ok``); else the configuration with the best confirmed mean, where the confirm phase
  ran; else the best trial the search ran (several objectives: the Pareto point best on the
  first) — all by the ranking of `autotune.analysis.ranking`. SpecError when there is none.
- :func:`export_study` loads the study (`autotune.storage.connection`), selects the trial, rebuilds
  the spec the study was created with and writes the export (`autotune.export.writer`);
  returns the trial and the files written. mindformers.yaml merges into ``mindformers_base``
  (``--mindformers-base``) or else the model.yaml's ``export.mindformers_base`` (written by
  ``autotune init --mindformers``); a base that is not there is a SpecError naming it.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.analysis.ranking import best_confirmed, best_trials
from autotune.export.writer import write_export
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import parse_spec
from autotune.storage.connection import load_study
from autotune.storage.schema import knobs_of, metrics_of, outcome_of


def select_trial(study: optuna.Study, number: int | None = None):
    """The trial to export (see the module doc)."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number is not None:
        trial = trials.get(number)
        if trial is None:
            raise SpecError(f"--trial {number}: study {study.study_name!r} has no such trial")
        if outcome_of(trial) != "ok":
            raise SpecError(f"--trial {number}: its outcome is {outcome_of(trial)}, not ok")
        return trial
    confirmed = best_confirmed(study)
    best = [trials[confirmed.number]] if confirmed else best_trials(study)
    if not best:
        raise SpecError(f"study {study.study_name!r} has no ok trial to export")
    return best[0]


def export_study(
    name: str,
    storage: str | None,
    out: Path,
    number: int | None = None,
    reshard_from: str | None = None,
    overwrite: bool = False,
    mindformers_base: str | None = None,
) -> tuple:
    """Export trial ``number`` (default: :func:`select_trial`'s) of study ``name`` to ``out``;
    returns (the trial, the files written)."""
    study = load_study(name, storage)
    trial = select_trial(study, number)
    spec = parse_spec(
        study.user_attrs["model_yaml"], Path(study.user_attrs["model_yaml_path"]), stored=True
    )  # the stored copy: nothing read at the original path
    if mindformers_base is None and spec.mindformers_base is not None:
        mindformers_base = spec.mindformers_base
        if not Path(mindformers_base).is_file():
            raise SpecError(
                f"{spec.source}: export.mindformers_base: {mindformers_base}: no such "
                "file (the MindFormers config to merge into); pass --mindformers-base "
                "PATH.yaml"
            )
    record = {
        "number": trial.number,
        "study": study.study_name,
        "metrics": metrics_of(trial),
        "estimate": trial.user_attrs.get("estimate"),
    }
    files = write_export(
        spec,
        Candidate(**knobs_of(trial)),
        record,
        out,
        reshard_from=reshard_from,
        overwrite=overwrite,
        mindformers_base=mindformers_base,
    )
    return trial, files
