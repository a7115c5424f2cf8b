"""Opening a study: create or resume it, check that a resume continues the same study, recover
what a dead driver left behind, and put a candidate back in the queue.

Contract:
- :func:`open_storage` opens Optuna's storage for a URL, or raises SpecError naming it (a URL
  SQLAlchemy cannot parse, a database driver not installed, a file that is not a database).
- :func:`open_study` (storage: a URL, or an Optuna storage object) creates the study
  (storing the spec, objectives, backend, :func:`fingerprint` and param encoding), or loads it
  with ``resume``; it refuses to reuse a name without ``resume`` and refuses a resume whose
  fingerprint differs, naming what changed (SpecError).
- :func:`fingerprint` is what makes two runs the same study: the ``model`` and ``train``
  sections, the cluster (backend, devices, devices_per_node, device, device_memory_gb, and a
  replay study's table by its SHA-256), the resolved search space, the objectives and
  ``trial.steps``/``measure_after``. Not ``n_trials``, the sampler, the seed or the timeout:
  those may change between runs of one study.
- :func:`encoding_of` is how the study's knobs are Optuna params (`autotune.encoding`): stored
  on every study when it is created; a study created before ordered knobs has none and keeps
  its categorical params; an encoding this version does not know is a SpecError.
- :func:`open_storage` of a server database (any RDB URL but SQLite) keeps RDB heartbeats
  (`autotune.drivers`: several drivers may share its studies); a trial whose heartbeats stop
  for ``GRACE_S`` is failed by :func:`recover_interrupted` through Optuna's
  ``fail_stale_trials``, and its candidate queued again (the storage's stale-trial callback).
- :func:`recover_interrupted` fails the RUNNING trials whose driver is gone and queues each
  candidate again (:func:`requeue`): a resumed study runs it under a new trial number. Gone
  means: its driver (user attr ``driver``) ran on this machine and its process has ended; or
  its heartbeats are stale; or, a trial without a driver (a study run before drivers were
  recorded, or a driver that died between asking and recording itself), at once on a storage
  without heartbeats (one driver: nobody else can be running it) and after ``GRACE_S`` from
  its start on one with them. A live driver's trials are never touched. A trial failed
  through its heartbeats has no ``outcome`` attr (a finished trial's attrs cannot be set):
  `autotune.records.outcome_of` reads it as ``interrupted``.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import IntegrityError, ProgrammingError, SQLAlchemyError

from autotune import records
from autotune.drivers import GRACE_S, HEARTBEAT_S, OWNER, alive, heartbeats, locked
from autotune.encoding import CATEGORICAL, ENCODINGS
from autotune.spec import Spec, SpecError


def fingerprint(spec: Spec, space) -> dict:
    """The parts of a study that must not change when it is resumed, as plain JSON values."""
    c = spec.cluster
    cluster = {"backend": c.backend, "devices": c.devices, "devices_per_node": c.devices_per_node,
               "device": c.device, "device_memory_gb": c.device_memory_gb}
    if c.replay:  # another table is another world (only replay studies have the key)
        cluster["replay_sha256"] = hashlib.sha256(Path(c.replay).read_bytes()).hexdigest()
    parts = {
        "model": asdict(spec.model),
        "train": asdict(spec.train),
        "cluster": cluster,
        "space": {name: list(values) for name, values in space.domains.items()},
        "objectives": list(spec.search.objectives),
        "trial": {"steps": spec.trial.steps, "measure_after": spec.trial.measure_after},
    }
    return json.loads(json.dumps(parts, default=str))  # what storage gives back


def open_storage(url: str, create: bool = False) -> optuna.storages.BaseStorage:
    """The storage at ``url``. A sqlite file must exist unless ``create`` (then its folder is
    made); anything Optuna cannot open is a SpecError naming the URL, not a traceback."""
    if url.startswith("sqlite:///"):
        file = Path(url.removeprefix("sqlite:///"))
        if create:  # the first study creates trials/ (or its folder)
            file.parent.mkdir(parents=True, exist_ok=True)
        elif not file.exists():
            raise SpecError(f"{url}: no such storage file")
    try:
        if url.startswith("sqlite"):  # one driver: SQLite locks the whole file on each write
            return optuna.storages.get_storage(url)
        return optuna.storages.get_storage(_server_storage(url))
    except (ImportError, ValueError, RuntimeError, OSError, SQLAlchemyError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise SpecError(f"--storage: cannot open {url}: {reason}") from None


def _server_storage(url: str, attempts: int = 4) -> optuna.storages.RDBStorage:
    """A server database's storage, with heartbeats. Two drivers starting at once on an empty
    database both create Optuna's tables; the one that loses that race opens it again."""
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5.0
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=RequeueStale())
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def open_study(spec: Spec, space, storage: str, study_name: str, resume: bool, sampler,
               pruner=None) -> optuna.Study:
    """Create the study, or load it when resuming (see the module doc)."""
    directions = records.directions(spec.search.objectives)
    if isinstance(storage, str):  # else an Optuna storage object (benchmarks: in memory)
        url, storage = storage, open_storage(storage, create=True)
    else:
        url = type(storage).__name__
    with locked(storage, 0):  # two drivers starting at once: one creates, the other resumes
        study, exists = _create_or_load(spec, space, storage, url, study_name, resume, sampler,
                                        pruner)
    if exists and [d.name.lower() for d in study.directions] != directions:
        raise SpecError(f"search.objectives: {study_name!r} was created with other objectives")
    return study


def _create_or_load(spec, space, storage, url, study_name, resume, sampler, pruner):
    """(the study, whether it existed before)."""
    directions = records.directions(spec.search.objectives)
    exists = study_name in optuna.get_all_study_names(storage)
    if exists and not resume:
        raise SpecError(f"--study: study {study_name!r} already exists in {url}; "
                        "pass --resume to continue it or choose another name")
    mine = fingerprint(spec, space)
    if exists:
        stored = optuna.load_study(study_name=study_name, storage=storage).user_attrs.get("fingerprint")
        changed = [part for part in mine if stored is not None and stored.get(part) != mine[part]]
        if changed:
            raise SpecError(f"--resume: {study_name!r} was run with other {', '.join(changed)} "
                            f"({spec.source} changed since); resume it with the file it was "
                            "created with, or start a new study")
    study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler,
                                directions=directions, load_if_exists=True, pruner=pruner)
    if not exists:
        study.set_user_attr("model_yaml", spec.raw)
        study.set_user_attr("model_yaml_path", spec.source)
        study.set_user_attr("objectives", list(spec.search.objectives))
        study.set_user_attr("backend", spec.cluster.backend)
        study.set_user_attr("fingerprint", mine)
        study.set_user_attr("param_encoding", space.encoding)
    return study, exists


def encoding_of(study: optuna.Study) -> str:
    """How ``study`` samples its knobs (see the module doc)."""
    encoding = study.user_attrs.get("param_encoding", CATEGORICAL)
    if encoding not in ENCODINGS:
        raise SpecError(f"--resume: {study.study_name!r} samples its knobs as {encoding!r}, which "
                        f"this autotune does not know ({', '.join(ENCODINGS)}); resume it with "
                        "the autotune that created it")
    return encoding


def requeue(study: optuna.Study, params: dict, user_attrs: dict | None = None) -> None:
    """Queue ``params`` to run again, unless they already wait. (Optuna's own
    ``skip_if_exists`` also skips params that merely *ran* before — the very trial being
    re-run — so it cannot be used here.)"""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if params and not any(t.params == params for t in waiting):
        study.enqueue_trial(params, user_attrs=user_attrs)


class RequeueStale:
    """The storage's stale-trial callback: queues the candidate of each trial Optuna's
    ``fail_stale_trials`` failed, and keeps their numbers for the caller to report."""

    def __init__(self):
        self.numbers: list[int] = []

    def __call__(self, study: optuna.Study, frozen) -> None:
        if "repeat_of" not in frozen.user_attrs:  # a repeat's candidate is its original's
            requeue(study, frozen.params, records.role_of(frozen))
        self.numbers.append(frozen.number)


def _gone(frozen, shared: bool) -> bool:
    """Whether the driver of a RUNNING trial is gone (see the module doc)."""
    owner = frozen.user_attrs.get(OWNER)
    if owner is not None:
        return alive(owner) is False
    return not shared or datetime.now() - frozen.datetime_start > timedelta(seconds=GRACE_S)


def recover_interrupted(study: optuna.Study, me: str | None = None) -> list[int]:
    """Fail the RUNNING trials whose driver is gone (never those of ``me``, this driver) and
    queue their candidates again; return their numbers."""
    storage, numbers = study._storage, []
    shared = heartbeats(storage)
    callback = storage.get_heartbeat_stale_trial_callback() if shared else None
    if isinstance(callback, RequeueStale):
        before = len(callback.numbers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        numbers += callback.numbers[before:]
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        mine = me is not None and frozen.user_attrs.get(OWNER) == me
        if mine or not _gone(frozen, shared):
            continue
        try:
            optuna.Trial(study, frozen._trial_id).set_user_attr("outcome", "interrupted")
            study.tell(frozen.number, state=TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another driver recovered it first, or its driver finished it after all
        if "repeat_of" not in frozen.user_attrs:
            requeue(study, frozen.params, records.role_of(frozen))
        numbers.append(frozen.number)
    return sorted(numbers)
