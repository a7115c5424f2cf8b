"""The report's own Optuna study of a view, which Optuna's plots are fed.

Contract: :func:`view_study` is an in-memory study of a
:class:`~autotune.analysis.view.StudyView`'s ``ok`` trials with the knobs that vary as their
params (categorical, sorted; whatever the sampler's encoding) and their trial numbers kept (the
numbers in between are FAIL placeholders, which every plot leaves out), built once per view.
:func:`copy_of` is a study holding copies of some of its trials, renumbered. Their trials are
handed to Optuna's plots as they are, never copied, and making one logs nothing.
"""

from __future__ import annotations

import datetime

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" per figure


class _Unshared(optuna.storages.InMemoryStorage):
    """An in-memory storage whose trials are taken and handed out as they are, never copied:
    the figures' own study, made of trials made for it, which Optuna's plots only read (one of
    them copied all 10,000 trials of a long study eight times over)."""

    def get_all_trials(self, study_id, deepcopy=True, states=None):
        return super().get_all_trials(study_id, deepcopy=False, states=states)

    def create_new_trial(self, study_id, template_trial=None):
        if template_trial is None:
            return super().create_new_trial(study_id)
        with self._lock:  # Optuna 5.0's (pinned), but for the copy of the template
            self._check_study_id(study_id)
            self._max_trial_id += 1
            trial, trial_id = template_trial, self._max_trial_id
            trial.number = len(self._studies[study_id].trials)
            trial._trial_id = trial_id
            self._trial_id_to_study_id_and_number[trial_id] = (study_id, trial.number)
            self._studies[study_id].trials.append(trial)
            self._update_cache(trial_id, study_id)
            return trial_id


def view_study(v) -> optuna.Study:
    """An in-memory study of ``v.ok`` with the varying knobs as params, trial numbers kept (the
    numbers in between are FAIL placeholders, which every plot leaves out); built once per
    view."""
    if "study" not in v.derived:
        v.derived["study"] = _build_view_study(v)
    return v.derived["study"]


def _build_view_study(v) -> optuna.Study:
    # Categorical, sorted: knob values are few and mostly powers of two, which read best evenly
    # spaced (1, 2, 4, 8) rather than on a log axis
    distributions = {
        knob: optuna.distributions.CategoricalDistribution(
            sorted({v.knobs(t)[knob] for t in v.ok}, key=lambda x: (isinstance(x, str), x))
        )
        for knob in v.searched
    }
    ok = {t.number: t for t in v.ok}
    trials = [
        _trial(ok[n].values, {k: v.knobs(ok[n])[k] for k in distributions}, distributions)
        if n in ok
        else _trial(None, {}, {})
        for n in range(max(ok, default=-1) + 1)
    ]
    study = optuna.create_study(storage=_Unshared(), directions=v.study.directions)
    study.add_trials(trials)
    return study


def _trial(values, params: dict, distributions: dict):
    """A finished trial of the figures' study: COMPLETE with ``values``, or a FAIL placeholder
    (None). Made as ``optuna.trial.create_trial`` makes it, less its conversion of
    distributions from before Optuna 3 (these are new), which took seconds per 10,000 trials."""
    now = datetime.datetime.now()
    state = optuna.trial.TrialState.COMPLETE if values else optuna.trial.TrialState.FAIL
    return optuna.trial.FrozenTrial(
        number=-1,
        state=state,
        value=None,
        values=values,
        datetime_start=now,
        datetime_complete=now,
        params=params,
        distributions=distributions,
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )


def copy_of(study: optuna.Study, trials: list) -> optuna.Study:
    """An in-memory study of ``study``'s directions holding copies of ``trials`` (renumbered)."""
    copy = optuna.create_study(storage=_Unshared(), directions=study.directions)
    copy.add_trials([_trial(t.values, t.params, t.distributions) for t in trials])
    return copy
