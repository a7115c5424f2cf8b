"""A study read in one pass of plain SQL (`autotune.storage.bulk`) is the study Optuna reads:
every trial equal field by field to Optuna's own read of the same SQLite file, and Optuna's
later reads go on from it (a trial finished or added by another process afterwards is seen)."""

import math

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.storage.bulk import read_all

DISTRIBUTIONS = {
    "tp": IntDistribution(0, 3),
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "recompute": CategoricalDistribution(["none", "selective", "full"]),
    "flag": CategoricalDistribution([False, True]),
}


def make(url: str, name: str = "s") -> optuna.Study:
    """A study with a trial of every state, every kind of value and attribute."""
    study = optuna.create_study(
        study_name=name,
        storage=url,
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    for i in range(12):
        study.enqueue_trial({"tp": i % 4})
        trial = study.ask()
        trial.suggest_int("tp", 0, 3)
        trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        if i % 3:
            trial.suggest_categorical("recompute", ["none", "selective", "full"])
        trial.suggest_categorical("flag", [False, True])
        trial.set_user_attr("outcome", ["ok", "oom", "error"][i % 3])
        trial.set_user_attr("estimate", {"breakdown": {"time_s": {"compute": 0.5 * i}}, "n": [i]})
        trial.set_user_attr("detail", "x" * i)
        trial.set_user_attr("baseline", i == 0)
        trial.set_user_attr("run_s", None if i % 5 else 1.5 * i)
        trial.set_user_attr("bound", [math.inf, -math.inf, 0.1 * i, "x\n,]"][i % 4])
        study._storage.set_trial_system_attr(trial._trial_id, "fixed_params", {"tp": i % 4})
        for step, value in enumerate([1.0, math.inf, -math.inf, math.nan][: i % 5]):
            # (trial.report refuses a study of two objectives)
            study._storage.set_trial_intermediate_value(trial._trial_id, step, value)
        if i % 6 == 0:
            study.tell(trial, [float(i), math.inf if i == 6 else -float(i)])
        elif i % 6 in (1, 2):  # (tell would give a pruned trial of two objectives a value)
            study._storage.set_trial_state_values(
                trial._trial_id, TrialState.PRUNED if i % 6 == 1 else TrialState.FAIL
            )
        # else: left running
    study.enqueue_trial({"tp": 1})  # and one waiting
    return study


def test_one_pass_reads_what_optuna_reads(tmp_path):
    _reads_what_optuna_reads(f"sqlite:///{tmp_path}/s.db", "s")


def test_one_pass_reads_what_optuna_reads_on_postgresql(postgres):
    _reads_what_optuna_reads(postgres, "bulk")  # its rows come from psycopg2's cursor


def _reads_what_optuna_reads(url: str, name: str):
    make(url, name)
    optunas = optuna.storages.get_storage(url)
    theirs = optunas.get_all_trials(optunas.get_study_id_from_name(name), deepcopy=False)
    study = optuna.load_study(study_name=name, storage=url)  # a fresh cache: nothing read yet
    read_all(study)
    mine = study._storage._studies[study._study_id].trials
    assert len(mine) == len(theirs) == 13
    for t in theirs:
        ours = mine[t.number]
        for field in (
            "number",
            "state",
            "values",
            "datetime_start",
            "datetime_complete",
            "params",
            "distributions",
            "user_attrs",
            "system_attrs",
            "_trial_id",
        ):
            assert getattr(ours, field) == getattr(t, field), (t.number, field)
        assert repr(ours.intermediate_values) == repr(t.intermediate_values)  # nan == nan
    assert {t.state for t in theirs} == {
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.WAITING,
    }


def test_optuna_goes_on_from_it(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    make(url)
    study = optuna.load_study(study_name="s", storage=url)
    read_all(study)
    running = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    # another process finishes a running trial and adds one
    other = optuna.load_study(study_name="s", storage=url)
    other.tell(running[0].number, [1.0, 2.0])
    other.add_trial(optuna.trial.create_trial(values=[3.0, 4.0], params={}, distributions={}))
    now = study.get_trials(deepcopy=False)
    assert len(now) == 14 and now[-1].values == [3.0, 4.0]
    assert now[running[0].number].state == TrialState.COMPLETE
    read_all(study)  # read already: Optuna's reads keep it up to date
    assert study.get_trials(deepcopy=False)[running[0].number].values == [1.0, 2.0]
