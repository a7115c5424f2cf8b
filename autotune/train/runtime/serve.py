"""Workers that stay up between trials: one process per rank runs trial after trial.

``msrun … autotune/train/__main__.py --serve POOL_DIR`` (or one process without msrun for a
world of one) starts the ranks once — MindSpore imported, the cluster joined, communication
initialised — and each trial then builds its own network and graphs in them. The launcher
(`autotune.execution.warm`) and the ranks talk through files in POOL_DIR, each written whole
(write, then rename):

- ``trial.<n>.json`` (the launcher; n = 0, 1, …): ``{"config": CONFIG_JSON, "log_dir": DIR}``,
  the n-th trial of this pool. Every rank runs it (:func:`serve`); while it runs, the rank's
  stdout and stderr — MindSpore's own C++ log included — go to ``DIR/worker_<rank>.log``, so the
  trial's folder holds its own logs, as a trial in processes of its own does.
- ``done.<n>.<rank>`` (each rank): ``{"code": C}`` once the trial's outputs are written, C the
  exit code a process of its own would have ended with (`autotune.train.__main__`): 0 done, 2
  the config cannot be run, 1 the run failed, 3 the launch failed. A rank whose trial did not
  end with 0 exits with that code right after (the pool retires: a failed trial may leave a
  collective half done, and the next trial starts in fresh processes); one whose trial ended
  well first frees what the trial held (:func:`release`) and says, with ``leftover_mb``, how
  much more it keeps resident than after the pool's first trial, then waits for the next.
- ``stop`` (the launcher): exit 0 before the next trial.

What a fresh process guarantees still holds per trial: its folder and logs are its own, its peak
memory is its own — the last trial's memory freed (:func:`release`), the high-water mark reset
once the network is built (`autotune.train.program.run_trial`), and on CPU what MindSpore keeps
resident of earlier trials anyway (measured: ~15 MB a trial of the tiny GPT model; docs/
mindspore-cpu.md) taken off the peak: the growth of the resident set after release since the
pool's first trial (``leftover_mb``). That holds for trials of one size only: MindSpore's CPU
memory pool keeps what a trial's activations took and a smaller trial reuses it unseen, so the
launcher runs one size of trial per pool (`autotune.execution.warm.SAME_SIZE`) — and its time is measured
from when the rank took it (``init_s``; the pool's first trial from the process's start, so it
carries the imports and the cluster join).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import time
import traceback

from autotune.files import write_json

POLL_S = 0.01


def _next(pool_dir: str, number: int) -> dict | None:
    """Wait for trial ``number``'s handover (its dict), or the launcher's stop (None)."""
    handover = os.path.join(pool_dir, f"trial.{number}.json")
    stop = os.path.join(pool_dir, "stop")
    while True:
        if os.path.exists(handover):
            with open(handover) as f:
                return json.load(f)
        if os.path.exists(stop):
            return None
        time.sleep(POLL_S)


class _Logs:
    """This process's stdout and stderr sent to a trial's log while it runs, then back."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)


def release(session) -> None:
    """Free what the last trial held before the next one is measured: its cells and graphs
    (MindSpore's ``ms_memory_recycle``), the host allocator's free pages (``malloc_trim``) and,
    on a backend whose pool can give them back (``Backend.empties_pool``: Ascend), the memory
    pool's cached blocks (``runtime.empty_cache``). What outlives that
    (MindSpore's modules and caches, the session) is frozen out of the garbage collector's
    walks (``gc.freeze``): a collection then walks only what the next trial makes — measured,
    ~30 ms a full collection over MindSpore's 164,000 objects, none once frozen
    (docs/mindspore-cpu.md, "Warm workers")."""
    ms = session.ms
    gc.collect()
    ms.ms_memory_recycle()
    if session.backend.empties_pool:
        ms.runtime.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: what was freed stays with the allocator
        pass
    gc.freeze()


def serve(pool_dir: str, process_started: float, run_one) -> int:
    """Run the pool's trials until the launcher says stop (0) or one does not end with 0 (its
    code). ``run_one(config, session, started, leftover_mb) -> (code, session)`` runs one
    trial, printing its verdict (`autotune.train.__main__`); ``session`` is None until the
    first trial opens it."""
    from autotune.train.metrics import resident_mb

    rank = os.environ.get("RANK_ID", "0")  # msrun's rank of this worker; one process: 0
    session, number, settled = None, 0, None
    while True:
        handover = _next(pool_dir, number)
        if handover is None:
            return 0
        started = process_started if session is None else time.time()
        with _Logs(os.path.join(handover["log_dir"], f"worker_{rank}.log")):
            try:
                leftover = max(0.0, resident_mb() - settled) if settled is not None else 0.0
                code, session = run_one(handover["config"], session, started, leftover)
            except BaseException:  # noqa: BLE001  (run_one's verdict failed: still say done)
                traceback.print_exc()
                code = 1
        if code:
            write_json(os.path.join(pool_dir, f"done.{number}.{rank}"), {"code": code})
            return code
        release(session)
        resident = resident_mb()
        settled = resident if settled is None else settled
        write_json(
            os.path.join(pool_dir, f"done.{number}.{rank}"),
            {"code": 0, "leftover_mb": resident - settled},
        )
        number += 1
