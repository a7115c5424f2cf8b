"""A trial process's MindSpore session: what it sets up once, and what each trial sets anew.

Contract:

- :func:`open_session` brings the device up, making the process-wide launch calls in the order
  tests/train/test_launch_order.py checks (each announced on stderr, `autotune.train.runtime.device.launch_step`):
  ``set_device`` (no id: msrun hands each worker its device), the first trial's context mode, on
  an accelerator ``runtime.set_memory(max_size=…, increase_size=…)`` from the config's
  ``device_memory`` section, then ``communication.init()`` before any op — except on CPU, where
  the numpy-2 throw-away op (:func:`numpy2_workaround`) comes before init
  (`autotune.spec.backends.Backend.first_op_before_init` says why). One process (a world of one)
  makes no init. Then a backend that runs only some chips refuses the others, and a device that
  reports another size than the profile's is warned about (a world of one too). Any failure of
  the bring-up — MindSpore's import, ``set_device`` (a plugin that cannot load: "Unsupported
  device target GPU"), ``set_memory``, ``init``, the first op (a device still held by another
  process), a refused chip — is the launch's (:class:`LaunchError`), never the candidate's. It
  returns the :class:`Session`: this rank, the world, the backend, and on a device its
  `autotune.train.runtime.device.DeviceMemory`.
- :meth:`Session.place` is a trial's part: the context's mode (graph or PyNative), this rank's
  `autotune.train.parallel.groups.Placement` for the trial's (dp, tp, pp), the process groups it
  names (each made once per process: a group's name is its ranks, so a later trial of another
  layout makes only the groups it lacks; a group that cannot be made — a communicator the
  collective library does not create — is the launch's too) and the parallel context (reset,
  then data parallel with the ``comm_fusion`` threshold when dp > 1). Workers that stay up
  between trials (`autotune.train.runtime.serve`) open one session and place each trial in it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from autotune.spec.backends import BACKENDS, DEFAULT_BACKEND, Backend
from autotune.train.config import ConfigError
from autotune.train.runtime.device import (
    DeviceMemory,
    chip_refusal,
    device_total_bytes,
    launch_step,
    reported_memory_warning,
)
from autotune.train.runtime.device_memory import memory_settings


class LaunchError(RuntimeError):
    """This process could not bring its device up or join the launch (the device, its plugin,
    ``communication.init``, the cluster, the launcher's environment): nothing of the candidate
    ran. Exit code 3."""


def _first_line(exc: BaseException) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"


def _launch(call: str, action, announce: bool = True):
    """Make one call of the launch (announced on stderr unless ``announce`` is False); any
    failure of it is the launch's, a :class:`LaunchError` naming the call."""
    if announce:
        launch_step(call)
    try:
        return action()
    except Exception as exc:  # noqa: BLE001  (whatever the device or cluster says, it is the launch's)
        raise LaunchError(f"{call} failed: {_first_line(exc)}") from exc


def numpy2_workaround(ms) -> None:
    """Absorb MindSpore's failure on the first eager op that parses a Python sequence.

    MindSpore 2.10's C++ side was built against numpy 1.x: under numpy 2.x the first such op in a
    process raises ``SystemError: numpy.core.multiarray failed to import`` (and prints a long
    warning); later ops work and compiled graphs are unaffected. One throw-away reshape at start
    takes the hit, with stderr silenced so worker logs stay readable.
    """
    if int(np.__version__.split(".")[0]) < 2:
        return
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                ms.Tensor(np.zeros(1, np.float32)).reshape((1,))
            except SystemError:
                pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class Session:
    """One process's launch (see the module doc)."""

    ms: object
    backend: Backend
    rank: int
    world: int
    groups: set = field(default_factory=set)  # the process groups made so far
    cache: object = (
        None  # autotune.train.runtime.compile_cache.GraphCache, when graphs may be reused
    )
    memory: DeviceMemory | None = None  # a device's readings (None: host RSS on CPU)

    def place(self, knobs: dict):
        """Set the context and parallel context for a trial of ``knobs``; returns this rank's
        Placement. A layout of another world size than the session's is a ConfigError."""
        from autotune.train.parallel import groups as parallel

        ms = self.ms
        dp, tp, pp = knobs["dp"], knobs["tp"], knobs["pp"]
        if dp * tp * pp != self.world:
            raise ConfigError(
                f"knobs: dp·tp·pp = {dp * tp * pp} but the launcher started {self.world} processes"
            )
        ms.set_context(mode=ms.PYNATIVE_MODE if knobs["jit_level"] == "pynative" else ms.GRAPH_MODE)
        placement = parallel.Placement.of(self.rank, dp, tp, pp, knobs.get("ep", 1))
        if self.world == 1:
            return placement
        _launch(
            f"create_group({', '.join(sorted(placement.groups())) or 'none'})",
            lambda: parallel.create_groups(placement, self.groups),
            announce=False,
        )
        ms.reset_auto_parallel_context()
        if dp > 1:
            # The DP gradient reducer buckets its all-reduces by this threshold, over any group.
            ms.set_auto_parallel_context(
                parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                gradients_mean=True,
                device_num=self.world,
                comm_fusion={"allreduce": {"mode": "size", "config": int(knobs["fusion_mb"])}},
            )
        return placement


def open_session(cfg: dict, world: int, ms=None) -> Session:
    """The process's launch for ``world`` ranks, configured by ``cfg``'s backend and device
    memory (see the module doc). ``ms``: the mindspore module (default: imported here)."""
    backend = BACKENDS[cfg.get("backend", DEFAULT_BACKEND)]
    if ms is None:
        ms = _launch("import mindspore", lambda: __import__("mindspore"), announce=False)
    _launch(f"set_device({backend.device_target})", lambda: ms.set_device(backend.device_target))
    # the first trial's mode before init, as a fresh trial always set it (Session.place sets
    # each trial's own)
    mode = ms.PYNATIVE_MODE if cfg["knobs"]["jit_level"] == "pynative" else ms.GRAPH_MODE
    _launch("set_context(mode)", lambda: ms.set_context(mode=mode), announce=False)
    settings = memory_settings(cfg, backend)
    if settings:
        shown = ", ".join(f"{name}={value}" for name, value in settings.items())
        _launch(f"runtime.set_memory({shown})", lambda: ms.runtime.set_memory(**settings))
    early = world == 1 or backend.first_op_before_init
    if early:
        _launch("first op", lambda: numpy2_workaround(ms))
    size, rank = 1, 0
    if world > 1:

        def join():
            ms.communication.init()
            return ms.communication.get_group_size(), ms.communication.get_rank()

        size, rank = _launch("communication.init()", join)
        if not early:
            _launch("first op", lambda: numpy2_workaround(ms))
    refused = _launch("the chip", lambda: chip_refusal(ms, backend), announce=False)
    if refused:
        raise LaunchError(f"backend {backend.name} refuses this device: {refused}")
    if backend.device_memory:
        warning = reported_memory_warning(cfg, device_total_bytes(ms))
        if warning:
            print(warning, file=sys.stderr, flush=True)
    if size != world:
        raise ConfigError(f"knobs: dp·tp·pp = {world} but the launcher started {size} processes")
    memory = DeviceMemory(ms, backend, os.getpid()) if backend.device_memory else None
    return Session(ms, backend, rank, size, memory=memory)


def warm_up(backend_name: str) -> str:
    """Bring ``backend_name``'s device up and make a first op (a real kernel on the device), as a
    node's warm-up before its first trial (`autotune.execution.warmup`); returns what it took.
    A failure is a :class:`LaunchError`."""
    backend = BACKENDS[backend_name]
    started = time.perf_counter()
    ms = _launch("import mindspore", lambda: __import__("mindspore"), announce=False)
    _launch(f"set_device({backend.device_target})", lambda: ms.set_device(backend.device_target))
    up = time.perf_counter()

    def first_op():
        numpy2_workaround(ms)
        return float((ms.Tensor(np.ones(4, np.float32)) * 2).sum().asnumpy())

    _launch("first op", first_op)
    done = time.perf_counter()
    return (
        f"first op on {backend.device_target} in {done - up:.1f} s (MindSpore's import and "
        f"set_device {up - started:.1f} s)"
    )
