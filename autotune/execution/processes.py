"""Own every process a trial or a study starts, and end them all, however the driver ends.

Contract (Linux, no root needed):

- :class:`ProcessTree` follows every descendant of one root process through ``/proc`` (parent
  links, each polled; every process ever seen is remembered by pid *and* start time, so a worker
  whose parent died — re-parented, no longer found by ancestry — stays tracked and a reused pid
  is never mistaken for it). It reports the largest resident set among them and stops them all
  (SIGTERM, then SIGKILL), signalling through pidfds where the kernel has them.
- A process launched for a trial dies with its launcher (`autotune.train.runtime.lifetime`).
- :class:`Guard` (``python -m autotune.execution.processes OWNER_PID``) outlives its owner: it tracks the
  owner's descendants and, when the owner dies without saying goodbye, stops them all. The
  embedded Ray needs it: Ray kills its raylet and GCS with the driver, but its agents then wait
  60 s on the dead GCS before they exit.

msrun starts each worker in its own session, so process groups do not reach them; ancestry does.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.procfs import Stat, environ, snapshot, stat

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GUARD_POLL_S = 0.5
GOODBYE = b"done\n"


def send(pid: int, start: int, sig: int) -> None:
    """Signal the process (pid, start) if it is still that process; never a reuser of its pid."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (OSError, AttributeError):  # no pidfd (kernel < 5.3): check, then kill at once
        info = stat(pid)
        if info is not None and info.start == start:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return
    try:
        info = stat(pid)  # the pidfd pins the process it was opened on: check that one
        if info is not None and info.start == start:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


class ProcessTree:
    """The root process and every process descended from it since this object was made."""

    def __init__(self, root: int, include_root: bool = True, ignore: set[int] = frozenset()):
        info = stat(root)
        self.root = root
        self.include_root = include_root
        self.ignore = set(ignore)
        self.known: dict[int, int] = {root: info.start} if info else {}  # pid → start time
        self.live: dict[int, Stat] = {}

    def refresh(self) -> dict[int, Stat]:
        """Find new descendants; return the tracked processes alive now (zombies excluded)."""
        procs = snapshot()
        children: dict[int, list[int]] = {}
        for pid, info in procs.items():
            children.setdefault(info.ppid, []).append(pid)
        # still the processes we know (same start time), then everything below them
        alive = [
            pid for pid, start in self.known.items() if pid in procs and procs[pid].start == start
        ]
        stack = list(alive)
        while stack:
            parent = stack.pop()
            for child in children.get(parent, ()):
                info = procs[child]
                if child in self.known and self.known[child] == info.start:
                    continue
                if child in self.ignore or info.start < procs[parent].start:
                    continue  # a child never starts before its parent: not ours
                self.known[child] = info.start
                alive.append(child)
                stack.append(child)
        self.live = {
            pid: procs[pid]
            for pid in alive
            if not procs[pid].zombie and (self.include_root or pid != self.root)
        }
        return self.live

    def largest_rss(self, exclude: int | None = None) -> tuple[int, float]:
        """(pid, MB) of the largest resident set among the live processes (last refresh)."""
        sizes = [(info.rss_mb, pid) for pid, info in self.live.items() if pid != exclude]
        rss, pid = max(sizes, default=(0.0, 0))
        return pid, rss

    def signal(self, sig: int, skip: set | None = None) -> None:
        """Send ``sig`` to every live process (last refresh) not in ``skip`` (pid, start) pairs;
        add those signalled to ``skip``."""
        for pid, info in list(self.live.items()):
            if skip is None or (pid, info.start) not in skip:
                send(pid, info.start, sig)
                if skip is not None:
                    skip.add((pid, info.start))

    def stop(self, grace_s: float, reap=None, kill_wait_s: float = 5.0) -> bool:
        """End every process of the tree: SIGTERM and up to ``grace_s`` to exit (none when 0),
        then SIGKILL. ``reap`` (e.g. ``Popen.poll``) is called while waiting so a child of the
        caller does not linger as a zombie. True when none is left."""
        phases = ([(signal.SIGTERM, grace_s)] if grace_s > 0 else []) + [
            (signal.SIGKILL, kill_wait_s)
        ]
        for sig, wait_s in phases:
            deadline = time.monotonic() + wait_s
            signalled: set = set()
            while self.refresh():
                if time.monotonic() > deadline:
                    break
                self.signal(sig, signalled)  # each round: a late-found descendant gets it too
                if reap:
                    reap()
                time.sleep(0.02)
            else:
                return True
        return not self.refresh()


def msrun_workers_gone(tree: ProcessTree) -> bool:
    """True when no live process of ``tree`` (last refresh) is one of msrun's workers (``MS_ROLE``
    ``MS_WORKER``, as msrun starts them): what is left is msrun and its scheduler."""
    return not any(
        environ(pid).get("MS_ROLE") == "MS_WORKER" for pid in tree.live if pid != tree.root
    )


class Guard:
    """A watchdog process that stops the caller's descendants if the caller dies first.

    ``with Guard(remove=[folder]): ...`` — on a clean exit it is told so and ends without
    touching anything; if this process ends any other way (SIGKILL included), within ~1 s it
    sends every process it has seen descend from this one SIGTERM, then SIGKILL, and removes
    ``remove`` (folders the caller would have cleaned up). It looks every ``GUARD_POLL_S``:
    long-lived descendants (Ray's, msrun's) are all seen."""

    def __init__(self, remove: list[str] | None = None):
        self.remove = list(remove or [])
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Guard:
        if stat("self") is None:  # no /proc: nothing to follow
            return self
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.execution.processes", str(os.getpid()), *self.remove],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.proc.stdout.readline()  # "ready": it has taken its first look
        return self

    def __exit__(self, *exc) -> None:
        if not self.proc:
            return
        try:
            self.proc.stdin.write(GOODBYE)
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def _guard(owner: int, remove: list[str]) -> int:
    """The guard process's loop (see :class:`Guard`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the owner's end ends the guard
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tree = ProcessTree(owner, include_root=False, ignore={os.getpid()})
    owner_start = tree.known.get(owner)
    tree.refresh()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    buffer = b""
    while True:
        readable, _, _ = select.select([0], [], [], GUARD_POLL_S)
        tree.refresh()
        if readable:
            data = os.read(0, 4096)
            if not data:
                break  # the pipe closed without a goodbye: the owner died
            buffer += data
            if GOODBYE in buffer:
                return 0  # the owner is closing cleanly: what it started, it stops
        else:
            info = stat(owner)
            if info is None or info.start != owner_start or info.zombie:
                break  # the owner is gone (and something else holds the pipe open)
    tree.stop(grace_s=1.0)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(_guard(int(sys.argv[1]), sys.argv[2:]))
