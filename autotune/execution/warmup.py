"""The driver's kernel JIT cache, and one warm-up process per node before its first trial.

MindSpore 2.10's GPU plugin carries no code for Hopper (SASS for sm_60–80, PTX for compute_60/86):
every fresh process on an H100/H200 JIT-compiles its 407 kernel modules when it creates its CUDA
context, unless the driver's JIT cache already holds them (docs/accelerators.md, "Kernel JIT on
Hopper"). So, for a backend with ``jit_cache`` (`autotune.spec.backends`):

Contract:

- :func:`kernel_targets` reads what a plugin library's CUDA kernels are compiled for (the fact
  above; the device check prints it, and tests/execution/test_first_device_run.py checks the installed
  wheel against it).

- :func:`jit_environment` is what every trial process (and the warm-up) gets: the cache's folder,
  one per backend under the user's cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``, made
  here), and its settings (a size that holds every module) — each unless the environment already
  names one.
- :func:`warm_up` (``Backend.warm_up_per_node``) runs, before a node's first trial, one process
  that brings the device up and makes the first op (``python -m autotune.train --warm-up
  BACKEND``): it fills the cache once, where the trial's ranks would each compile everything at
  once. It runs before the trial's clock starts (`autotune.execution.runner.run_trial`,
  `autotune.execution.warm.WarmPool`), so neither ``trial.timeout_s`` nor the launch limit pays
  for it. A node is warm once a marker for this MindSpore version sits in the cache's folder;
  trials of one node that start together wait for one warm-up (a file lock). It returns one line
  for the trial's launch log; a warm-up that fails or passes `WARM_UP_LIMIT_S` is said there and
  the trial runs anyway (its own bring-up then says what is wrong, as the infrastructure's).
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

WARM_UP_LIMIT_S = 1800.0  # 407 modules JIT-compiled by one process: minutes, not hours
MARKER = "autotune-warm-mindspore-"
FATBIN_MAGIC = 0xBA55ED50  # the header of one CUDA fat binary (one kernel module)


def _cache_home(env: dict) -> str:
    return env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def jit_environment(backend, env: dict) -> dict:
    """The JIT cache's variables for ``backend``'s trials, those ``env`` does not set already
    (see the module doc); the cache's folder is made."""
    wanted = backend.jit_environment(_cache_home(env))
    given = {name: value for name, value in wanted.items() if name not in env}
    if backend.jit_cache:
        os.makedirs(env.get(backend.jit_cache) or given[backend.jit_cache], exist_ok=True)
    return given


def warm_up(backend, env: dict, project_root: str) -> str:
    """Warm this node's JIT cache for ``backend`` once (see the module doc); ``env``: the trial
    processes' environment (its devices, the cache's variables). Returns the launch log's line,
    "" for a backend that needs none."""
    if not backend.warm_up_per_node:
        return ""
    folder = Path(env[backend.jit_cache])
    marker = folder / f"{MARKER}{metadata.version('mindspore')}"
    if marker.exists():
        return f"warm-up: this node's JIT cache is warm ({folder})\n"
    with open(folder / ".warm-up.lock", "w") as lock:
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)  # another trial of this node may be warming it now
        waited = time.monotonic() - waited
        if marker.exists():
            return (
                f"warm-up: this node's JIT cache was warmed by another trial meanwhile "
                f"(waited {waited:.1f} s; {folder})\n"
            )
        argv = [sys.executable, "-m", "autotune.train", "--warm-up", backend.name]
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=env,
                cwd=project_root,
                capture_output=True,
                text=True,
                timeout=WARM_UP_LIMIT_S,
            )
        except subprocess.TimeoutExpired:
            return (
                f"warm-up: no first op within {WARM_UP_LIMIT_S:.0f} s ({folder}); the trial "
                "runs without it\n"
            )
        took = time.monotonic() - started
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            return (
                f"warm-up: failed after {took:.1f} s (exit code {done.returncode}: {last}); "
                "the trial runs without it\n"
            )
        marker.write_text(f"{time.time():.0f} {took:.1f}\n")
        said = (done.stdout.strip().splitlines() or [""])[-1]
        return f"warm-up: {said} ({took:.1f} s in all; {folder} holds its kernels now)\n"


def kernel_targets(library: Path) -> tuple[int, dict]:
    """The CUDA kernel modules an ELF shared library carries (its ``.nv_fatbin`` section: one
    fat binary per module) and the targets they hold: ``{"sass": [sm…], "ptx": [compute…]}``."""
    data = library.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[names_index][4]
    sections = {
        data[names + h[0] : data.index(b"\0", names + h[0])].decode(): (h[4], h[5]) for h in headers
    }
    offset, size = sections.get(".nv_fatbin", (0, 0))
    end, modules, targets = offset + size, 0, {"sass": set(), "ptx": set()}
    while offset + 16 <= end:
        magic, _, header, body = struct.unpack_from("<IHHQ", data, offset)
        if magic != FATBIN_MAGIC:
            offset += 8  # modules are 8-byte aligned
            continue
        modules += 1
        entry, stop = offset + header, offset + header + body
        while entry < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            targets["ptx" if kind == 1 else "sass"].add(arch)
            entry += entry_header + payload
        offset = stop
    return modules, {kind: sorted(archs) for kind, archs in targets.items()}
