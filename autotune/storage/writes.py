"""A trial's writes in one transaction.

A database storage commits every write on its own — one transaction, and on SQLite one fsync,
per param and per user attr — and a trial writes about twenty of them when it is asked (its
params, its driver, the knobs it keeps as user attrs) and as many when it is recorded: that was
most of the driver's time per trial (`benchmarks/overhead.py --driver`).

Contract: inside ``with batched(trial):`` the params (``trial.suggest_*``) and user attrs
(``trial.set_user_attr``) written for the live Optuna ``trial`` are held, and written when the
block ends, in the order they were made, in one transaction on an RDB storage (one by one on any
other, as before). What the trial reads of itself meanwhile (``trial.params``,
``trial.user_attrs``) is already up to date (Optuna's live trial keeps them), and anything else
the trial asks of its storage writes what is held first. Other readers of the study — the
sampler sampling this very trial, another driver — see the trial's held writes when the block
ends, not one by one: Optuna's samplers read no running trial's params but other trials' (TPE
leaves the trial it samples out), so the same seed proposes the same candidates. The writes are
atomic: a write that fails (the trial was finished meanwhile: ``UpdateFinishedTrialError``)
raises at the end of the block and writes none of them; an integrity error, which Optuna's own
writes ignore one by one, makes them go one by one as Optuna's.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager

from optuna.distributions import (check_distribution_compatibility, distribution_to_json,
                                  json_to_distribution)
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from sqlalchemy import insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError


@contextmanager
def batched(trial):
    """Hold ``trial``'s params and user attrs until the block ends (see the module doc)."""
    if isinstance(trial.storage, _Held):  # nested: the outer block writes them
        yield
        return
    held = _Held(trial.storage, trial._trial_id)
    trial.storage = held
    try:
        yield
    finally:
        trial.storage = held.storage
        held.flush()


class _Held:
    """The storage a trial writes through inside :func:`batched`: its own params and user attrs
    held, anything else passed on once they are written."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self.pending: list = []  # (method name, args) in the order Optuna made them

    def set_trial_param(self, trial_id, param_name, param_value_internal, distribution) -> None:
        self._write("set_trial_param", trial_id, param_name, param_value_internal, distribution)

    def set_trial_user_attr(self, trial_id, key, value) -> None:
        self._write("set_trial_user_attr", trial_id, key, value)

    def _write(self, method: str, trial_id: int, *args) -> None:
        if trial_id != self.trial_id:
            self.flush()
            getattr(self.storage, method)(trial_id, *args)
        else:
            self.pending.append((method, args))

    def __getattr__(self, name: str):
        self.flush()  # whatever else is asked sees the writes made before it
        return getattr(self.storage, name)

    def flush(self) -> None:
        """Write what is held (see the module doc)."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        backend = getattr(self.storage, "_backend", self.storage)  # optuna's cache over an RDB
        if isinstance(backend, RDBStorage):
            try:
                _in_one_transaction(self.storage, backend, self.trial_id, pending)
                return
            except IntegrityError:
                pass  # as Optuna's own writes would meet it: one by one (each ignores it)
        for method, args in pending:
            getattr(self.storage, method)(self.trial_id, *args)


def _in_one_transaction(storage, backend: RDBStorage, trial_id: int, pending: list) -> None:
    """``pending`` writes of one trial, committed together (rolled back together on an error):
    what `RDBStorage.set_trial_param` and ``set_trial_user_attr`` write (Optuna 5.0, pinned) —
    the trial checked updatable, each param's distribution checked against the study's — in a
    few statements instead of two or three per write; a database error is Optuna's
    ``StorageInternalError``, as theirs."""
    params = [args for method, args in pending if method == "set_trial_param"]
    attrs = {}  # key → value: the place of its first write, the value of its last (as in turn)
    for method, args in pending:
        if method == "set_trial_user_attr":
            attrs[args[0]] = args[1]
    known = _known_distributions(storage, trial_id)
    session = backend.scoped_session()
    try:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
        backend.check_trial_is_updatable(trial_id, trial.state)
        for name, _, distribution in params:
            previous = known.get(name) or _stored_distribution(session, trial.study_id, name)
            if previous is not None:
                check_distribution_compatibility(previous, distribution)
        if params:  # one statement; ids in this order, the order params are read back in
            session.execute(insert(models.TrialParamModel).values([
                {"trial_id": trial_id, "param_name": name, "param_value": value,
                 "distribution_json": distribution_to_json(distribution)}
                for name, value, distribution in params]))
        if attrs:
            _write_attrs(session, backend, trial_id, attrs)
        session.commit()
    except IntegrityError:
        session.rollback()
        raise
    except SQLAlchemyError as exc:
        session.rollback()
        raise StorageInternalError("a trial's batched writes failed to commit") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
    for name, _, distribution in params:  # as Optuna's cache learns a param's distribution
        known.setdefault(name, distribution)


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
    record = (session.query(models.TrialParamModel).join(models.TrialModel)
              .filter(models.TrialModel.study_id == study_id,
                      models.TrialParamModel.param_name == name).first())
    return json_to_distribution(record.distribution_json) if record is not None else None


def _write_attrs(session, backend: RDBStorage, trial_id: int, attrs: dict) -> None:
    """Every attr in one upsert where Optuna upserts (SQLite ≥ 3.24, PostgreSQL), else each
    as Optuna writes it."""
    model = models.TrialUserAttributeModel
    name = backend.engine.name
    if name == "postgresql" or (name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)):
        dialect = postgresql if name == "postgresql" else sqlite
        insert = dialect.insert(model).values([
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()])
        session.execute(insert.on_conflict_do_update(
            index_elements=[model.trial_id, model.key],
            set_={"value_json": insert.excluded.value_json}))
        return
    for key, value in attrs.items():
        backend._set_trial_attr_without_commit(session, model, trial_id, key, value)
