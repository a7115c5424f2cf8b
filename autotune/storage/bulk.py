"""A study's trials read from the database in one pass of plain SQL.

Optuna's database storage builds each trial it reads from ORM objects: a row object per param,
value and attribute, about 25 of them per trial of autotune's. Reading a 10,000-trial study so
took 12 s on this machine (`benchmarks/overhead.py --scale`), before ``show``, ``report`` or
``trials_frame`` did anything with it — and every command reading a study reads all of it.

Contract: :func:`read_all` reads every trial of ``study`` — unless its trials were read in this
process already — with one plain SELECT per table (the
same rows Optuna reads: Optuna 5.0's schema, pinned) and puts them into Optuna's trial cache
(`optuna.storages._CachedStorage`, what ``optuna.storages.get_storage`` wraps a database
storage in), exactly as Optuna's own read would have: the same FrozenTrials (numbers, states,
values, datetimes in local time, params with their distributions, user and system attrs,
intermediate values), the unfinished ones read again by Optuna on its next read. The study's
``get_trials`` then answers from memory. On any other storage (in memory, a journal) it does
nothing: those read fast already. It writes nothing.
"""

from __future__ import annotations

import datetime
import json

from optuna.distributions import json_to_distribution
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial
from sqlalchemy import select

TRIALS = models.TrialModel.__table__


def read_all(study) -> None:
    """Read every trial of ``study`` into Optuna's cache (see the module doc)."""
    storage, study_id = study._storage, study._study_id
    if not isinstance(storage, _CachedStorage) or (
        study_id in storage._studies and storage._studies[study_id].trials
    ):
        return  # not a database, or read already: Optuna's next read adds what is new
    ids = select(TRIALS.c.trial_id).where(TRIALS.c.study_id == study_id)
    with storage._backend.engine.connect() as connection:
        rows = connection.execute(
            select(
                TRIALS.c.trial_id,
                TRIALS.c.number,
                TRIALS.c.state,
                TRIALS.c.datetime_start,
                TRIALS.c.datetime_complete,
            )
            .where(TRIALS.c.study_id == study_id)
            .order_by(TRIALS.c.trial_id)
        ).all()
        parts = {trial_id: _Parts() for trial_id, *_ in rows}

        def plain(model, *columns):
            """Rows of a table whose columns need no conversion, straight from the database's
            driver: a SQLAlchemy row per row cost more than the read itself (175,000 rows). In
            the database's order, as Optuna's own read (no ORDER BY: a sort of them all)."""
            table = model.__table__
            query = select(table.c.trial_id, *(table.c[c] for c in columns)).where(
                table.c.trial_id.in_(ids)
            )
            sql = query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
            cursor = connection.connection.cursor()
            try:
                cursor.execute(str(sql))
                return [row for row in cursor.fetchall() if row[0] in parts]  # else created since
            finally:
                cursor.close()

        def typed(model, *columns, order):
            """Rows of a table with enum columns, converted by SQLAlchemy (one per trial or so)."""
            table = model.__table__
            query = select(table.c.trial_id, *(table.c[c] for c in columns))
            return [
                row
                for row in connection.execute(
                    query.where(table.c.trial_id.in_(ids)).order_by(table.c[order])
                ).all()
                if row[0] in parts
            ]

        distributions: dict = {}
        for trial_id, name, value, text in plain(
            models.TrialParamModel,
            "param_name",
            "param_value",
            "distribution_json",
        ):
            if text not in distributions:
                distributions[text] = json_to_distribution(text)
            parts[trial_id].params[name] = (value, distributions[text])
        for trial_id, objective, value, kind in typed(
            models.TrialValueModel, "objective", "value", "value_type", order="trial_value_id"
        ):
            parts[trial_id].values[objective] = models.TrialValueModel.stored_repr_to_value(
                value, kind
            )
        for model, attrs in (
            (models.TrialUserAttributeModel, "user_attrs"),
            (models.TrialSystemAttributeModel, "system_attrs"),
        ):
            found = plain(model, "key", "value_json")
            for (trial_id, key, _), value in zip(found, _parsed([text for *_, text in found])):
                getattr(parts[trial_id], attrs)[key] = value
        for trial_id, step, value, kind in typed(
            models.TrialIntermediateValueModel,
            "step",
            "intermediate_value",
            "intermediate_value_type",
            order="trial_intermediate_value_id",
        ):
            parts[trial_id].intermediate[step] = (
                models.TrialIntermediateValueModel.stored_repr_to_intermediate_value(value, kind)
            )
    trials = [
        parts[trial_id].frozen(trial_id, number, state, start, complete)
        for trial_id, number, state, start, complete in rows
    ]
    with storage._lock:
        info = storage._studies.setdefault(study_id, _StudyInfo())
        storage._add_trials_to_cache(study_id, trials)
        for t in trials:
            if t.state.is_finished():
                info.last_finished_trial_id = max(info.last_finished_trial_id, t._trial_id)
            else:
                info.unfinished_trial_ids.add(t._trial_id)


def _parsed(texts: list[str]) -> list:
    """``[json.loads(t) for t in texts]`` in one call: the texts are Optuna's ``json.dumps`` of
    one value each, so joined by commas they are one JSON array (a third faster for 175,000)."""
    return json.loads("[" + ",".join(texts) + "]")


def _local(utc: datetime.datetime | None) -> datetime.datetime | None:
    """A stored (naive UTC) time as Optuna gives it back: naive local time."""
    if utc is None:
        return None
    return utc.replace(tzinfo=datetime.UTC).astimezone().replace(tzinfo=None)


class _Parts:
    """The rows of one trial, gathered table by table."""

    def __init__(self):
        self.params: dict = {}  # name → (internal value, distribution)
        self.values: dict = {}  # objective → value
        self.user_attrs: dict = {}
        self.system_attrs: dict = {}
        self.intermediate: dict = {}

    def frozen(self, trial_id, number, state, start, complete) -> FrozenTrial:
        values = [self.values[i] for i in range(len(self.values))] if self.values else None
        return FrozenTrial(
            number=number,
            state=state,
            value=None,
            values=values,
            datetime_start=_local(start),
            datetime_complete=_local(complete),
            params={name: d.to_external_repr(v) for name, (v, d) in self.params.items()},
            distributions={name: d for name, (_, d) in self.params.items()},
            user_attrs=self.user_attrs,
            system_attrs=self.system_attrs,
            intermediate_values=self.intermediate,
            trial_id=trial_id,
        )
