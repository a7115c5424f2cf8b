"""Where studies live: the storage URL, opening it, and loading a study by name.

Contract:
- :func:`resolve_storage` is the URL a command uses: ``--storage``, else ``$AUTOTUNE_STORAGE``,
  else :data:`DEFAULT_STORAGE` (relative to the current folder).
- :func:`open_storage` opens Optuna's storage for a URL, or raises SpecError naming it (a URL
  SQLAlchemy cannot parse, a database driver not installed, a file that is not a database, a
  SQLite file that does not exist unless ``create``). A server database (any RDB URL but
  SQLite) keeps RDB heartbeats (`autotune.storage.drivers`: several drivers may share its
  studies); a trial whose heartbeats stop for ``GRACE_S`` is failed by
  `autotune.storage.recovery.recover_interrupted` and its candidate queued again.
- :func:`check_storage` raises the SpecError :func:`open_storage` would, creating nothing: a
  search checks its storage before it starts a pool.
- :func:`load_study` loads an existing study, its trials read in one pass
  (`autotune.storage.bulk`), or raises SpecError naming it and the studies the storage has.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import optuna
from sqlalchemy.exc import IntegrityError, ProgrammingError, SQLAlchemyError

from autotune.spec.errors import SpecError
from autotune.storage.bulk import read_all
from autotune.storage.drivers import GRACE_S, HEARTBEAT_S

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"


def resolve_storage(storage: str | None) -> str:
    return storage or os.environ.get("AUTOTUNE_STORAGE") or DEFAULT_STORAGE


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
        reason = next(
            (line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__
        )
        raise SpecError(f"--storage: cannot open {url}: {reason}") from None


def check_storage(url: str) -> None:
    """Raise :func:`open_storage`'s SpecError for ``url`` if it has one. A SQLite file that is
    not there yet passes (the study's creation makes it), and nothing is created."""
    if not url.startswith("sqlite:///") or Path(url.removeprefix("sqlite:///")).exists():
        open_storage(url)


def _server_storage(url: str, attempts: int = 4) -> optuna.storages.RDBStorage:
    """A server database's storage, with heartbeats. Two drivers starting at once on an empty
    database both create Optuna's tables; the one that loses that race opens it again."""
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5.0
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
                )
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def load_study(name: str, storage: str | None = None) -> optuna.Study:
    """Load an existing study; SpecError naming it when there is no such study."""
    url = resolve_storage(storage)
    opened = open_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        names = optuna.get_all_study_names(opened)
        raise SpecError(
            f"study {name!r} not found in {url} (studies: {', '.join(names) or 'none'})"
        ) from None
    read_all(study)  # every reader of a study reads all of it: one pass, not Optuna's ORM
    return study
