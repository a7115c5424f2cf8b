"""A trial's writes in one transaction (`autotune.storage.writes.batched`): what is stored is
what Optuna's one-by-one writes and its tell store (the study's attrs given with them too), in
one commit, on SQLite and PostgreSQL alike; a failed write writes none; other storages write as
before."""

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState
from sqlalchemy import event

from autotune.storage.writes import batched, create_running


def _fill(trial) -> None:
    """Params and attrs as a proposer writes them: an attr written twice, a param read back."""
    trial.set_user_attr("driver", "me")
    trial.suggest_int("log2_tp", 0, 3)
    trial.suggest_categorical("recompute", ["none", "full"])
    trial.set_user_attr("dp", 8)
    trial.set_user_attr("estimate", {"feasible": True, "breakdown": {"time_s": {"compute": 1.5}}})
    trial.set_user_attr("dp", 4)
    assert trial.params["log2_tp"] == trial.suggest_int("log2_tp", 0, 3)  # read back, held
    assert trial.user_attrs["dp"] == 4


def _stored(study, number: int) -> tuple:
    frozen = study._storage.get_trial(study.trials[number]._trial_id)  # not the cache
    return frozen.params, frozen.distributions, frozen.user_attrs, list(frozen.params)


def _commits(study) -> list:
    """A list that counts the transactions that wrote, from now on."""
    engine, wrote, commits = study._storage._backend.engine, set(), []

    @event.listens_for(engine, "before_cursor_execute")
    def statement(connection, cursor, sql, *rest):
        if sql.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            wrote.add(id(connection))

    @event.listens_for(engine, "commit")
    def commit(connection):
        if id(connection) in wrote:
            wrote.discard(id(connection))
            commits.append(1)

    return commits


def _same_as_one_by_one(url: str) -> None:
    study = optuna.create_study(
        storage=url, study_name="w", sampler=optuna.samplers.RandomSampler(seed=1)
    )
    plain = study.ask()
    _fill(plain)
    held = study.ask()
    commits = _commits(study)
    with batched(held, {"calibration": {"time_factor": 1.5}}):
        _fill(held)
        assert not commits  # nothing written yet
    assert len(commits) == 1  # every param and attr, and the study's attr, in one transaction
    assert study.user_attrs["calibration"] == {"time_factor": 1.5}
    params, distributions, attrs, order = _stored(study, held.number)
    plain_params, plain_distributions, plain_attrs, plain_order = _stored(study, plain.number)
    assert distributions == plain_distributions and order == plain_order
    assert attrs.keys() == plain_attrs.keys() and attrs["dp"] == 4 and attrs["driver"] == "me"
    assert attrs["estimate"] == {"feasible": True, "breakdown": {"time_s": {"compute": 1.5}}}
    assert set(params) == {"log2_tp", "recompute"}
    study.tell(held, 1.0)
    assert study.trials[held.number].state == TrialState.COMPLETE


def test_a_batched_trial_stores_what_one_by_one_writes_store_in_one_commit_on_sqlite(tmp_path):
    _same_as_one_by_one(f"sqlite:///{tmp_path}/s.db")


@pytest.mark.slow
def test_a_batched_trial_stores_what_one_by_one_writes_store_in_one_commit_on_postgresql(postgres):
    _same_as_one_by_one(postgres)


def _ended_as_tell_ends(url: str) -> None:
    study = optuna.create_study(storage=url, study_name="e", direction="maximize")
    cases = [
        (TrialState.COMPLETE, [2.5], {}),
        (TrialState.PRUNED, None, {0: 1.0, 3: 4.0}),
        (TrialState.PRUNED, None, {}),
        (TrialState.FAIL, None, {}),
    ]
    for state, values, reported in cases:
        told, held = study.ask(), study.ask()
        for trial in (told, held):
            trial.suggest_int("x", 0, 3)
            for step, value in reported.items():
                trial.report(value, step)
        told.set_user_attr("outcome", "x")
        study.tell(told, values, state=state)
        commits = _commits(study)
        with batched(held, end=(state, values)):
            held.set_user_attr("outcome", "x")
        assert len(commits) == 1  # its attrs and its end together
        a, b = study._storage.get_trial(told._trial_id), study._storage.get_trial(held._trial_id)
        assert (b.state, b.values, b.user_attrs) == (a.state, a.values, a.user_attrs), state
        assert b.datetime_complete is not None
    with pytest.raises(ValueError):  # as tell refuses it
        with batched(study.ask(), end=(TrialState.COMPLETE, [float("nan")])):
            pass


def test_a_trial_ended_with_its_writes_is_stored_as_tell_stores_it_on_sqlite(tmp_path):
    _ended_as_tell_ends(f"sqlite:///{tmp_path}/s.db")


@pytest.mark.slow
def test_a_trial_ended_with_its_writes_is_stored_as_tell_stores_it_on_postgresql(postgres):
    _ended_as_tell_ends(postgres)


def test_a_trial_ended_on_a_storage_without_transactions_is_told_by_optuna():
    study = optuna.create_study()  # in memory
    trial = study.ask()
    trial.report(3.0, 1)
    with batched(trial, end=(TrialState.PRUNED, None)):
        trial.set_user_attr("outcome", "pruned")
    assert (study.trials[0].state, study.trials[0].values) == (TrialState.PRUNED, [3.0])


def test_a_write_that_fails_raises_at_the_end_and_writes_none(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="w")
    trial = study.ask()
    trial.suggest_int("x", 0, 3)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        with batched(trial, end=(TrialState.COMPLETE, [1.0])):
            trial.set_user_attr("outcome", "ok")
            # another driver takes this one for dead and fails it meanwhile
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    assert "outcome" not in study.trials[trial.number].user_attrs
    assert study.trials[trial.number].state == TrialState.FAIL


def test_a_param_of_another_kind_than_the_studys_is_refused_as_optuna_refuses_it(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="w")
    study.ask().suggest_int("x", 0, 3)
    other = optuna.create_study(
        storage=f"sqlite:///{tmp_path}/s.db", study_name="w", load_if_exists=True
    )  # a driver that has not seen x yet
    for asking in (study, other):  # known to Optuna's cache, or read from the database
        trial = asking.ask()
        with pytest.raises(ValueError, match="different distribution kind"):
            with batched(trial):
                trial.suggest_categorical("x", ["a", "b"])
        assert "x" not in asking._storage.get_trial(trial._trial_id).params


def test_anything_else_the_trial_asks_of_its_storage_sees_the_held_writes_first(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="w")
    trial = study.ask()
    with batched(trial):
        trial.set_user_attr("driver", "me")
        # what Drivers.claim does on a server storage: the beat comes after the mark
        system = trial.storage.get_trial_system_attrs(trial._trial_id)
        assert study._storage.get_trial(trial._trial_id).user_attrs == {"driver": "me"}
        assert system == {}
        with batched(trial):  # nested: the outer block writes
            trial.set_user_attr("dp", 2)
        assert "dp" not in study._storage.get_trial(trial._trial_id).user_attrs
    assert study._storage.get_trial(trial._trial_id).user_attrs == {"driver": "me", "dp": 2}


def test_a_storage_without_transactions_writes_as_before():
    study = optuna.create_study()  # in memory
    trial = study.ask()
    with batched(trial, {"calibration": 1}):
        trial.suggest_int("x", 0, 3, step=1)
        trial.set_user_attr("dp", 2)
    assert study.user_attrs == {"calibration": 1}
    frozen = study.trials[0]
    assert frozen.user_attrs == {"dp": 2} and frozen.distributions == {"x": IntDistribution(0, 3)}


def _created_as_optuna_creates(url: str) -> None:
    study = optuna.create_study(storage=url, study_name="c")
    study.ask().suggest_int("log2_tp", 0, 3)  # the study knows one of the params already
    params = {"log2_tp": 2, "recompute": "full"}
    distributions = {
        "log2_tp": IntDistribution(0, 3),
        "recompute": optuna.distributions.CategoricalDistribution(["none", "full"]),
    }
    attrs = {"driver": "me", "proposed_by": "untried", "dp": 2, "estimate": {"a": [1, 2]}}
    theirs = study._storage.create_new_trial(
        study._study_id,
        optuna.trial.create_trial(
            state=TrialState.RUNNING,
            params=params,
            distributions=distributions,
            user_attrs=attrs,
            system_attrs={"fixed_params": params},
        ),
    )
    commits = _commits(study)
    mine = create_running(study, params, distributions, attrs)
    assert len(commits) == 1
    a, b = study._storage.get_trial(theirs), study._storage.get_trial(mine)  # the cache's
    fresh = optuna.load_study(study_name="c", storage=url)._storage.get_trial(mine)
    for frozen in (b, fresh):
        assert frozen.number == a.number + 1 and frozen.state == TrialState.RUNNING
        assert (frozen.params, frozen.distributions, list(frozen.params)) == (
            a.params,
            a.distributions,
            list(a.params),
        )
        assert (frozen.user_attrs, frozen.system_attrs) == (a.user_attrs, a.system_attrs)
    trial = optuna.Trial(study, mine)  # the sampler is not asked again: the params are set
    assert trial.suggest_int("log2_tp", 0, 3) == 2 and not commits[1:]
    with pytest.raises(ValueError, match="different distribution kind"):
        create_running(
            study,
            {"log2_tp": "a"},
            {"log2_tp": optuna.distributions.CategoricalDistribution(["a"])},
            {},
        )


def test_a_trial_created_with_its_params_is_stored_as_optuna_creates_it_on_sqlite(tmp_path):
    _created_as_optuna_creates(f"sqlite:///{tmp_path}/s.db")


@pytest.mark.slow
def test_a_trial_created_with_its_params_is_stored_as_optuna_creates_it_on_postgresql(postgres):
    _created_as_optuna_creates(postgres)
