"""A trial's writes in one transaction.

A database storage commits every write on its own — one transaction, and on SQLite one fsync,
per param and per user attr — and a trial writes about twenty of them when it is asked (its
params, its driver, the knobs it keeps as user attrs) and as many when it is recorded, then a
``tell`` that reads the trial back twice: that was most of the driver's time per trial
(`benchmarks/overhead.py --driver`). On a disk shared with a busy neighbour one fsync took 8 to
20 ms there.

Contract: :func:`create_running` creates a trial whose every param is known already (the
prior's candidate, an untried one) with its params and attrs in the one transaction that
creates it. Inside ``with batched(trial):`` the params (``trial.suggest_*``) and user attrs
(``trial.set_user_attr``) written for the live Optuna ``trial`` are held, and written when the
block ends in one transaction on an RDB storage (one by one on any other, as before), params in
the order they were made. ``batched(trial, study_attrs, end=(state, values))`` writes the
study's user attrs ``study_attrs`` in it too (the calibration the trial's result refit), and
ends the trial there as ``study.tell(trial, values, state=state)`` does — a pruned trial
without values takes its last intermediate value, the sampler hears ``after_trial`` first —
without reading the trial back: autotune's samplers read nothing of it there (no constraints).

What the trial reads of itself meanwhile (``trial.params``, ``trial.user_attrs``) is already up
to date (Optuna's live trial keeps them), and anything else the trial asks of its storage writes
what is held first. Other readers of the study — the sampler sampling this very trial, another
driver — see the trial's held writes when the block ends, not one by one: Optuna's samplers read
no running trial's params but other trials' (TPE leaves the trial it samples out), so the same
seed proposes the same candidates. The writes are atomic: when one fails (the trial was finished
meanwhile: ``UpdateFinishedTrialError``) the block raises at its end and none is written; an
integrity error, which Optuna's own writes ignore one by one, makes them go one by one as
Optuna's.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from datetime import datetime

from optuna.distributions import (
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.study._tell import _check_values_are_feasible
from optuna.trial import TrialState, create_trial
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError


@contextmanager
def batched(trial, study_attrs: dict | None = None, end: tuple | None = None):
    """Hold ``trial``'s params and user attrs until the block ends, then write them with
    ``study_attrs`` and, ``end`` = (state, values), the trial's end (see the module doc)."""
    if isinstance(trial.storage, _Held):  # nested: the outer block writes them
        assert end is None, "a trial ends with the outermost block"
        trial.storage.study_attrs.update(study_attrs or {})
        yield
        return
    held = _Held(trial, study_attrs)
    trial.storage = held
    try:
        yield
    finally:
        trial.storage = held.storage
        held.flush(end)


class _Held:
    """The storage a trial writes through inside :func:`batched`: its own params and user attrs
    held, anything else passed on once they are written."""

    def __init__(self, trial, study_attrs: dict | None):
        self.trial, self.storage, self.trial_id = trial, trial.storage, trial._trial_id
        self.params: list = []  # (name, internal value, distribution) in the order they came
        self.attrs: dict = {}  # key → value: its first write's place, its last write's value
        self.study_attrs = dict(study_attrs or {})

    def set_trial_param(self, trial_id, param_name, param_value_internal, distribution) -> None:
        if trial_id != self.trial_id:
            self.flush()
            self.storage.set_trial_param(trial_id, param_name, param_value_internal, distribution)
        else:
            self.params.append((param_name, param_value_internal, distribution))

    def set_trial_user_attr(self, trial_id, key, value) -> None:
        if trial_id != self.trial_id:
            self.flush()
            self.storage.set_trial_user_attr(trial_id, key, value)
        else:
            self.attrs[key] = value

    def __getattr__(self, name: str):
        self.flush()  # whatever else is asked sees the writes made before it
        return getattr(self.storage, name)

    def flush(self, end: tuple | None = None) -> None:
        """Write what is held, and with ``end`` end the trial (see the module doc)."""
        params, attrs, study_attrs = self.params, self.attrs, self.study_attrs
        self.params, self.attrs, self.study_attrs = [], {}, {}
        if end is None and not (params or attrs or study_attrs):
            return
        if end is not None:
            end = _ending(self.trial, *end)
        backend = getattr(self.storage, "_backend", self.storage)  # optuna's cache over an RDB
        try:
            if isinstance(backend, RDBStorage):
                try:
                    _in_one_transaction(
                        self.storage, backend, self.trial, params, attrs, study_attrs, end
                    )
                    return
                except IntegrityError:
                    pass  # as Optuna's own writes would meet it: one by one (each ignores it)
            for param in params:
                self.storage.set_trial_param(self.trial_id, *param)
            for key, value in attrs.items():
                self.storage.set_trial_user_attr(self.trial_id, key, value)
            for key, value in study_attrs.items():
                self.storage.set_study_user_attr(self.trial.study._study_id, key, value)
            if end is not None:
                self.storage.set_trial_state_values(self.trial_id, *end)
        finally:
            if end is not None:
                self.trial.study._thread_local.cached_all_trials = None  # as tell


def _ending(trial, state: TrialState, values) -> tuple:
    """(state, values) as ``study.tell`` stores them — complete values checked, a pruned trial
    without values given its last intermediate value — once the sampler heard ``after_trial``
    (Optuna 5.0's ``_tell_with_warning``, which then writes them)."""
    study, frozen = trial.study, trial._get_latest_trial()
    if state == TrialState.COMPLETE:
        failure = _check_values_are_feasible(study, values)
        if failure is not None:
            raise ValueError(failure)
    elif state == TrialState.PRUNED and values is None and frozen.last_step is not None:
        last = frozen.intermediate_values[frozen.last_step]
        if _check_values_are_feasible(study, [last]) is None:
            values = [last]
    values = None if values is None else [float(v) for v in values]
    study.sampler.after_trial(study, frozen, state, values)
    return state, values


def _in_one_transaction(
    storage,
    backend: RDBStorage,
    trial,
    params: list,
    attrs: dict,
    study_attrs: dict,
    end: tuple | None,
) -> None:
    """The held writes of one trial, committed together (rolled back together on an error):
    what `RDBStorage.set_trial_param`, ``set_trial_user_attr``, ``set_study_user_attr`` and
    ``set_trial_state_values`` write (Optuna 5.0, pinned) — the trial checked updatable (and
    locked for its end), each param's distribution checked against the study's — in a few
    statements instead of two or three per write; a database error is Optuna's
    ``StorageInternalError``, as theirs."""
    trial_id, study_id = trial._trial_id, trial.study._study_id
    known = _known_distributions(storage, trial_id)
    failed = "a trial's batched writes failed to commit"
    with _committed(backend, failed, unwrapped=(IntegrityError,)) as session:
        trials = models.TrialModel.__table__
        query = select(trials.c.state).where(trials.c.trial_id == trial_id)
        state = session.execute(query.with_for_update() if end else query).scalar_one_or_none()
        if state is None:  # as Optuna's find_or_raise_by_id
            raise KeyError(models.NOT_FOUND_MSG)
        backend.check_trial_is_updatable(trial_id, state)
        _insert_params(session, study_id, trial_id, params, known)
        if attrs:
            _upsert(session, backend, models.TrialUserAttributeModel, "trial_id", trial_id, attrs)
        if study_attrs:
            _upsert(
                session, backend, models.StudyUserAttributeModel, "study_id", study_id, study_attrs
            )
        if end is not None:  # a running trial has no values yet: inserted, not upserted
            state, values = end
            stored = models.TrialValueModel.value_to_stored_repr
            if values:
                session.execute(
                    insert(models.TrialValueModel.__table__),
                    [
                        dict(
                            zip(
                                ("trial_id", "objective", "value", "value_type"),
                                (trial_id, objective, *stored(value)),
                            )
                        )
                        for objective, value in enumerate(values)
                    ],
                )
            session.execute(
                update(trials)
                .where(trials.c.trial_id == trial_id)
                .values(state=state, datetime_complete=datetime.now())
            )
    for name, _, distribution in params:  # as Optuna's cache learns a param's distribution
        known.setdefault(name, distribution)


@contextmanager
def _committed(backend: RDBStorage, failed: str, unwrapped: tuple = ()):
    """A session of ``backend``, committed when the block ends and rolled back on any error,
    then closed; a database error is raised as Optuna's ``StorageInternalError`` (``failed``:
    what failed) but for the ``unwrapped`` kinds, raised as they are."""
    session = backend.scoped_session()
    try:
        yield session
        session.commit()
    except unwrapped:
        session.rollback()
        raise
    except SQLAlchemyError as exc:
        session.rollback()
        raise StorageInternalError(failed) from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _insert_params(session, study_id: int, trial_id: int, params: list, known: dict) -> None:
    """Insert ``params`` ([(name, internal value, distribution)]) of a trial, each distribution
    checked against the study's (``known``, else the stored one) as Optuna checks it: in one
    statement, rows in this order — the order params are read back in."""
    for name, _, distribution in params:
        previous = known.get(name) or _stored_distribution(session, study_id, name)
        if previous is not None:
            check_distribution_compatibility(previous, distribution)
    if params:
        session.execute(
            insert(models.TrialParamModel.__table__),
            [
                {
                    "trial_id": trial_id,
                    "param_name": name,
                    "param_value": value,
                    "distribution_json": distribution_to_json(distribution),
                }
                for name, value, distribution in params
            ],
        )


def create_running(study, params: dict, distributions: dict, user_attrs: dict) -> int:
    """A new RUNNING trial of ``study`` with ``params`` set — and fixed, as Optuna's queue fixes
    them (system attr ``fixed_params``) — and ``user_attrs``: on an RDB storage in one
    transaction of a few statements (what ``create_new_trial`` with such a template writes,
    Optuna 5.0, pinned, there in three statements per param and two per attr, one of which
    searched the study's params), put in Optuna's cache as ``create_new_trial`` puts it; on
    any other storage, ``create_new_trial`` with that template. Returns the trial's id."""
    storage, study_id = study._storage, study._study_id
    template = create_trial(
        state=TrialState.RUNNING,
        params=params,
        distributions=distributions,
        user_attrs=user_attrs,
        system_attrs={"fixed_params": params},
    )
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, RDBStorage) or not isinstance(storage, _CachedStorage):
        return storage.create_new_trial(study_id, template)
    internal = [
        (k, distributions[k].to_internal_repr(v), distributions[k]) for k, v in params.items()
    ]
    known = storage._studies[study_id].param_distribution if study_id in storage._studies else {}
    with _committed(backend, "a new trial failed to commit") as session:
        # the study's row locked, as Optuna's creation locks it: trial numbers one at a time
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        row = models.TrialModel(
            study_id=study_id,
            number=None,
            state=TrialState.RUNNING,
            datetime_start=template.datetime_start,
        )
        session.add(row)
        session.flush()
        row.number = row.count_past_trials(session)
        trial_id = row.trial_id
        _insert_params(session, study_id, trial_id, internal, known)
        for model, attrs in (
            (models.TrialUserAttributeModel, template.user_attrs),
            (models.TrialSystemAttributeModel, template.system_attrs),
        ):
            if attrs:  # a new trial's: inserted, not upserted
                session.execute(
                    insert(model.__table__),
                    [
                        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                        for key, value in attrs.items()
                    ],
                )
        number = row.number
    template.number, template._trial_id = number, trial_id
    with storage._lock:  # as create_new_trial caches it
        storage._add_trials_to_cache(study_id, [template])
    for name, _, distribution in internal:
        known.setdefault(name, distribution)
    return trial_id


def _known_distributions(storage, trial_id: int) -> dict:
    """The param distributions Optuna's cache (`_CachedStorage`) knows for ``trial_id``'s
    study, a dict it updates too; {} when there is no such cache."""
    if not isinstance(storage, _CachedStorage):
        return {}
    with storage._lock:
        study = storage._trial_id_to_study_id_and_number.get(trial_id)
        return storage._studies[study[0]].param_distribution if study else {}


def _stored_distribution(session, study_id: int, name: str):
    """The distribution some trial of the study stored param ``name`` with, or None."""
    record = (
        session.query(models.TrialParamModel)
        .join(models.TrialModel)
        .filter(models.TrialModel.study_id == study_id, models.TrialParamModel.param_name == name)
        .first()
    )
    return json_to_distribution(record.distribution_json) if record is not None else None


def _upsert(session, backend: RDBStorage, model, owner: str, owner_id: int, attrs: dict) -> None:
    """Every attr of one trial or study (``owner``: its id column) in one upsert where Optuna
    upserts (SQLite ≥ 3.24, PostgreSQL), else each as Optuna writes it."""
    name = backend.engine.name
    if name == "postgresql" or (name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)):
        # imported here, by writers only: PostgreSQL's dialect costs a reader 0.1 s to import
        from sqlalchemy.dialects import postgresql, sqlite

        upsert = (postgresql if name == "postgresql" else sqlite).insert(model.__table__)
        session.execute(
            upsert.on_conflict_do_update(
                index_elements=[owner, "key"], set_={"value_json": upsert.excluded.value_json}
            ),
            [
                {owner: owner_id, "key": key, "value_json": json.dumps(value)}
                for key, value in attrs.items()
            ],
        )
        return
    for key, value in attrs.items():
        if model is models.TrialUserAttributeModel:
            backend._set_trial_attr_without_commit(session, model, owner_id, key, value)
            continue
        study = models.StudyModel.find_or_raise_by_id(owner_id, session)
        attribute = model.find_by_study_and_key(study, key, session)
        if attribute is None:
            session.add(model(study_id=owner_id, key=key, value_json=json.dumps(value)))
        else:
            attribute.value_json = json.dumps(value)
