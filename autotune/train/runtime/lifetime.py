"""A process that dies with the one that started it — even when that one is SIGKILLed.

Contract (Linux; elsewhere nothing happens):
- :func:`die_with_parent` makes the calling process end (SIGKILL) when its parent does, via
  ``prctl(PR_SET_PDEATHSIG)``; for a process that has a launcher (msrun's workers), a parent that
  is already init means it was orphaned before it got here, and it ends at once.
- :func:`die_with_parent_hook` does the same for a child started with
  ``subprocess.Popen(preexec_fn=...)``. The signal fires when the parent *thread* that started
  the child ends, so start children from a thread that outlives them.

The trial program calls the first under msrun (`autotune.train.__main__`); the runner that
launches a trial uses the second (`autotune.execution.runner`).
"""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1


def _prctl():
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends (Linux; elsewhere nothing). For a process that
    has a launcher (msrun's workers): a parent that is already init means it was orphaned
    before it got here, and it ends at once."""
    parent = os.getppid()
    try:
        prctl = _prctl()
    except (OSError, AttributeError):
        return
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before the prctl took hold


def die_with_parent_hook():
    """A ``preexec_fn`` that makes the child die with the calling process, or None off Linux."""
    try:
        prctl = _prctl()  # looked up before the fork: the child only makes the call
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
