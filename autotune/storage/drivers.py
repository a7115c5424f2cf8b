"""Several drivers on one study: who owns a trial, whether its driver still lives, and the
study-wide lock that keeps two drivers from asking past N or running one phase twice.

A driver (one ``autotune search`` process) owns the trials it asks. With SQLite one driver runs
a study; on a server database (PostgreSQL) several may share it, on one machine or several.

Contract:
- :func:`driver_id` names this process: ``host/boot/pidns/pid/start`` (the kernel's boot id,
  the pid namespace it sees its pid in and the process's start time, so a reused pid, a reboot
  or a container that shares this hostname is not mistaken for the same driver).
  :func:`alive` answers True or False only for a driver whose host, boot and pid namespace are
  this process's (its ``/proc`` can tell), and None for any other (another machine, another
  container, an id of an older form): only its heartbeats can tell, on a server storage
  (`autotune.storage.recovery`).
- Every trial a driver asks carries user attr ``driver`` (:meth:`Drivers.claim`). On a storage
  with heartbeats (any RDB but SQLite, `autotune.storage.connection.open_storage`) the driver records an
  Optuna RDB heartbeat for each of its RUNNING trials every :data:`HEARTBEAT_S` seconds from a
  thread of its own (Optuna's heartbeat thread covers ``Study.optimize`` only, not ask/tell),
  and refreshes study attr ``driver:<id>`` (a wall-clock time) so others know it lives.
- :func:`locked` holds a PostgreSQL advisory lock (a no-op elsewhere): creating a study (key
  0, so a second driver never sees a study without its attrs), and per study
  (:meth:`Drivers.lock`) counting toward N and asking, enqueueing the baseline, a warm start,
  claiming the confirm phase — each happens once however many drivers run.
- :meth:`Drivers.confirm_runner` decides who runs the confirm phase, under the lock: the
  driver marks its search part done (study attr ``searched:<id>``); if another live driver is
  still searching, that one will run it (it takes the lock later and finds nobody searching);
  if a live driver already claimed it (study attr ``confirm_by``), it stays with it; else this
  driver claims it. A driver that died leaves it to the next ``--resume``, which recomputes
  what is missing from storage (`autotune.study.confirm.plan`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from optuna.storages import BaseStorage
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

from autotune.procfs import start_ticks

OWNER = "driver"  # trial user attr: the driver that asked it
HEARTBEAT_S = 10  # how often a driver records the heartbeats of its trials
GRACE_S = 60  # a trial (or a driver) silent this long is taken for dead
LOCK_CLASS = 0x4154  # first key of the advisory lock ("AT"); the study id is the second


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "-"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "-"


def driver_id(pid: int | None = None) -> str:
    """The id of process ``pid`` (default: this one), which must share this process's pid
    namespace."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}/{_boot_id()}/{_pid_namespace()}/{pid}/{start_ticks(pid) or '-'}"


def alive(driver: str) -> bool | None:
    """Whether ``driver`` (a :func:`driver_id`) still runs: None when this process's ``/proc``
    cannot tell (another machine, boot or pid namespace, or not an id of this form)."""
    parts = driver.split("/")
    if len(parts) != 5 or parts[:3] != [socket.gethostname(), _boot_id(), _pid_namespace()]:
        return None
    pid, start = parts[3:]
    return pid.isdigit() and str(start_ticks(int(pid))) == start


def heartbeats(storage: BaseStorage) -> bool:
    """Whether ``storage`` keeps RDB heartbeats (several drivers may share its studies)."""
    return is_heartbeat_enabled(storage)


@contextmanager
def locked(storage: BaseStorage, key: int):
    """A PostgreSQL advisory lock (``key``: a study id, or 0 for creating studies), released
    when the block ends or by the server when this process dies; elsewhere nothing: SQLite and
    in-memory storages have one driver."""
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        yield
        return
    from sqlalchemy import text

    keys = {"a": LOCK_CLASS, "b": key}
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:a, :b)"), keys)
        connection.commit()
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:a, :b)"), keys)
            connection.commit()


class Drivers:
    """This driver among those of one study (see the module doc). A context manager: inside,
    on a storage with heartbeats, the heartbeat thread runs."""

    def __init__(self, study):
        self.study = study
        self.storage = study._storage
        self.me = driver_id()
        self.shared = heartbeats(self.storage)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        if self.shared:
            self._beat()
            self._thread = threading.Thread(
                target=self._beating, name="autotune-heartbeat", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def claim(self, trial) -> None:
        """``trial`` was just asked by this driver: mark it, and beat for it at once — through
        the trial's own storage, so that inside `autotune.storage.writes.batched` the mark is
        written before the beat."""
        trial.set_user_attr(OWNER, self.me)
        self.beat(trial)

    def mark(self) -> dict:
        """The user attr that marks a trial as this driver's, for a trial created with it."""
        return {OWNER: self.me}

    def beat(self, trial) -> None:
        """Beat for ``trial``, marked as this driver's, at once (on a storage that keeps beats)."""
        if self.shared:
            trial.storage.record_heartbeat(trial._trial_id)

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except Exception as exc:  # a database hiccup: the next beat may get through
                print(f"autotune: heartbeat not recorded ({type(exc).__name__}: {exc})")

    def _beat(self) -> None:
        for t in self.storage.get_all_trials(
            self.study._study_id, deepcopy=False, states=(TrialState.RUNNING,)
        ):
            if t.user_attrs.get(OWNER) == self.me:
                self.storage.record_heartbeat(t._trial_id)
        self.study.set_user_attr(f"driver:{self.me}", round(time.time(), 1))

    def live(self, driver: str, attrs: dict) -> bool:
        """Whether ``driver`` runs: by its process on this machine, else by its last beat."""
        known = alive(driver)
        if known is not None:
            return known
        beat = attrs.get(f"driver:{driver}")
        return isinstance(beat, (int, float)) and time.time() - beat < GRACE_S

    def lock(self):
        """The study's lock (:func:`locked`)."""
        return locked(self.storage, self.study._study_id)

    def confirm_runner(self) -> str | None:
        """None when this driver runs the confirm phase, else the id of the driver that will
        (see the module doc)."""
        if not self.shared:
            return None
        with self.lock():
            self.study.set_user_attr(f"searched:{self.me}", True)
            attrs = self.study.user_attrs
            for key in attrs:
                other = key.removeprefix("driver:")
                if (
                    key.startswith("driver:")
                    and other != self.me
                    and f"searched:{other}" not in attrs
                    and self.live(other, attrs)
                ):
                    return other
            claimed = attrs.get("confirm_by")
            if claimed and claimed != self.me and self.live(claimed, attrs):
                return claimed
            self.study.set_user_attr("confirm_by", self.me)
            return None
