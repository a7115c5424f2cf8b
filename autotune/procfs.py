"""What Linux's ``/proc`` says of a process: the one reader of ``/proc/PID/stat``.

Contract (pure Python; where ``/proc`` is missing every reader answers "no such process"):

- :func:`stat` is one process's parent, start time (clock ticks since boot: with the pid it
  names one process, so a reused pid is never taken for it), resident set and whether it has
  ended (a zombie); None when there is no such process.
- :func:`snapshot` is every process visible now; :func:`start_ticks` the start time of a
  process that still runs (None for a zombie or no process); :func:`cmdline` its arguments.
- :func:`started_at` is when the calling process started, in wall-clock (epoch) seconds.
- :func:`kernel_oom_kills` is what the kernel's log (``/dev/kmsg``) says its out-of-memory
  killer killed: pid → (seconds since boot, the line); None when the log cannot be read here
  (``kernel.dmesg_restrict``, a container without it). :func:`start_seconds` puts a process's
  start time on the same clock, so a kill is matched to a process by pid *and* time.

Driver identity (`autotune.storage.drivers`), the process trees a trial owns
(`autotune.execution.processes`), the trial program's own clock (`autotune.train`) and the
tests read processes only through here.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20
KMSG = "/dev/kmsg"
# "Out of memory: Killed process 4242 (python) …", "Memory cgroup out of memory: Killed process
# 4242 …", "oom-kill:constraint=…,task=python,pid=4242,uid=0" (Linux mm/oom_kill.c)
OOM_KILL = re.compile(r"(?:Killed process |oom-kill:.*\bpid=)(\d+)")


@dataclass(frozen=True)
class Stat:
    ppid: int
    start: int  # start time in clock ticks since boot: with the pid, names one process
    rss_mb: float
    zombie: bool  # exited, not yet reaped: holds no memory, cannot be signalled


def stat(pid: int | str) -> Stat | None:
    """One process's ``/proc/PID/stat`` (``"self"`` for the caller), or None when there is no
    such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        return Stat(
            int(fields[1]), int(fields[19]), int(fields[21]) * PAGE_MB, fields[0] in (b"Z", b"X")
        )
    except (OSError, ValueError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when it does not run (a
    zombie has ended too)."""
    info = stat(pid)
    return None if info is None or info.zombie else info.start


def snapshot() -> dict[int, Stat]:
    """Every process visible in /proc right now."""
    found = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return found
    for entry in entries:
        if entry.name.isdigit():
            info = stat(int(entry.name))
            if info is not None:
                found[int(entry.name)] = info
    return found


def cmdline(pid: int) -> str:
    """The arguments process ``pid`` was started with, joined by spaces ("" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with ({} when gone or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().decode(errors="replace").split("\0")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in items if "=" in item)


def started_at() -> float:
    """Wall-clock time (epoch s) the calling process started; now where /proc is unavailable."""
    info = stat("self")
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    if info is None:
        return time.time()
    return time.time() - (uptime - info.start / os.sysconf("SC_CLK_TCK"))


def start_seconds(start: int) -> float:
    """A process start time (clock ticks since boot, `Stat.start`) in seconds since boot."""
    return start / os.sysconf("SC_CLK_TCK")


def oom_kills(records) -> dict[int, tuple[float, str]]:
    """The out-of-memory kills among ``/dev/kmsg`` records (``PRI,SEQ,USEC,FLAGS;text``):
    pid → (seconds since boot, text), the latest kill of each pid."""
    kills = {}
    for record in records:
        head, _, text = record.partition(";")
        fields = head.split(",")
        match = OOM_KILL.search(text)
        if match and len(fields) >= 3 and fields[2].isdigit():
            kills[int(match.group(1))] = (int(fields[2]) / 1e6, text.strip())
    return kills


def kernel_oom_kills(path: str = KMSG) -> dict[int, tuple[float, str]] | None:
    """The kernel log's out-of-memory kills (:func:`oom_kills`), or None when it is unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records = []
    try:
        while True:
            try:
                data = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # read to the end
            except BrokenPipeError:
                continue  # records overwritten while reading: carry on from the oldest kept
            except OSError:
                return None
            if not data:
                break
            records.append(data.decode(errors="replace"))
    finally:
        os.close(fd)
    return oom_kills(records)
