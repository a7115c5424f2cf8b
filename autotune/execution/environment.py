"""The environment a trial's processes start with, on the node that runs them.

Contract:

- :func:`environment` is the trial program's (autotune's trainer, fresh or in a warm pool):
  ours plus the caller's ``extra`` (the devices Ray gave), the project and an entry model's
  folders on PYTHONPATH, this interpreter first on PATH, the backend's own variables and
  :func:`device_environment`'s.
- :func:`device_environment` is what every trial program on an accelerator gets beside its
  devices, a MindFormers trial's included (`autotune.execution.runner`): an explicit
  ``OMP_NUM_THREADS`` for the node's workers (:func:`host_threads`) and the collective
  library's variables (:func:`collective_environment`).
- :func:`collective_environment`: per trial slot of a node — the trial's lowest device there,
  which no other trial on the node holds while it runs — its own block of the backend's host
  ports (``Backend.slot_ports``: HCCL's base port and LCCL's bootstrap port on Ascend), so
  trials side by side never bind each other's; and the collective library's timeouts set to the
  trial's own timeout within the library's range (``Backend.collective_timeouts``), so it never
  gives up on a peer before autotune's clock gives up on the trial (pipeline stages compile
  different graphs and reach their first collective minutes apart; the nodes of a trial start
  from Ray tasks of their own). A variable the environment already holds is the user's and is
  kept.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from autotune.execution.warmup import jit_environment
from autotune.spec import entry as entry_loader
from autotune.spec.backends import DEFAULT_BACKEND, Backend, backend_of

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def host_threads(local_workers: int) -> int:
    """OpenMP threads for each of ``local_workers`` trial workers on an accelerator node: this
    process's cores shared among them (at least 1). Ray sets ``OMP_NUM_THREADS`` to a task's
    ``num_cpus`` — 1 for an accelerator trial, which holds one CPU for its launcher — and msrun's
    workers would inherit that, leaving the host side of every device (data, kernel launch) on
    one thread."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_workers))


def trial_slot(backend: Backend, env: dict) -> int | None:
    """The trial's slot on this node: the lowest of the devices ``env`` gives it (the backend's
    visibility variable, set from Ray's assignment), None when it names none."""
    ids = (env.get(backend.visible_devices or "") or "").split(",")
    numbers = [int(i) for i in ids if i.strip().isdigit()]
    return min(numbers) if numbers else None


def collective_environment(backend: Backend, env: dict, timeout_s: float | None) -> dict:
    """The collective library's variables for a trial whose environment so far is ``env`` (see
    the module doc); those ``env`` holds already are left out."""
    wanted = {}
    slot = trial_slot(backend, env)
    if backend.slot_ports and slot is not None:
        start = backend.host_ports[0] + slot * backend.slot_ports
        for name, offset, form in backend.slot_variables:
            wanted[name] = form.format(port=start + offset)
    if timeout_s:
        for name, floor, ceiling in backend.collective_timeouts:
            wanted[name] = str(min(ceiling, max(floor, math.ceil(timeout_s))))
    return {name: value for name, value in wanted.items() if name not in env}


def device_environment(
    backend: Backend, env: dict, local_workers: int, timeout_s: float | None
) -> dict:
    """What a trial program on an accelerator gets beside ``env`` (see the module doc); nothing
    elsewhere."""
    if not backend.accelerator:
        return {}
    return {
        "OMP_NUM_THREADS": str(host_threads(local_workers)),
        **collective_environment(backend, env, timeout_s),
    }


def environment(
    extra: dict | None = None,
    config: dict | None = None,
    local_workers: int = 1,
    timeout_s: float | None = None,
) -> dict:
    """The trial program's environment (see the module doc): the backend's own variables
    (``Backend.environment``, and its kernel JIT cache's unless set:
    `autotune.execution.warmup.jit_environment`), :func:`device_environment` for the
    ``local_workers`` of this node and a trial of ``timeout_s``."""
    backend = backend_of((config or {}).get("backend", DEFAULT_BACKEND))
    env = {**os.environ, **(extra or {}), **dict(backend.environment)}
    env.update(jit_environment(backend, env))
    env.update(device_environment(backend, env, local_workers, timeout_s))
    # an entry model imports from model.yaml's folder (and its file's): `autotune.spec.entry`
    entry = (config or {}).get("model", {}).get("entry")
    imports = entry_loader.import_dirs(entry, config.get("model_dir")) if entry else []
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PROJECT_ROOT), *imports, env.get("PYTHONPATH")])
    )
    # msrun starts its workers with the `python` on PATH: make it this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("GLOG_v", "3")  # MindSpore C++ logs: errors only
    return env
