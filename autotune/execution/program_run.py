"""A trial program's run side: how its real trials are prepared, launched and read back — one
:class:`ProgramRun` per program, registered under the program's name (its driver-side rules:
`autotune.spec.programs`).

Contract: :data:`RUNS` maps ``trial.program`` names to their :class:`ProgramRun` class; the
built-in ones (autotune's trainer, MindFormers) are registered where trials are launched
(`autotune.execution.runner`), :func:`register_run` adds one. A run side has two halves:

- the driver's (an instance per study, made and driven by
  `autotune.execution.executors.DispatchedExecutor`): ``warm_pools`` (its trials may run in
  workers that stay up, `autotune.execution.warm`; else each in processes of its own),
  ``compile_cache`` (its trials reuse autotune's cache of compiled graphs,
  `autotune.train.runtime.compile_cache`), :meth:`~ProgramRun.start` before the first trial
  (SpecError when the study cannot run here), :meth:`~ProgramRun.configure` its part of each
  trial's ``config.json`` (the executor sets ``program``, this name), and
  :meth:`~ProgramRun.ended` once a trial it configured ended or was cancelled;
- the node's (static: the runner, in Ray's workers, has the trial's ``config.json`` only):
  :meth:`~ProgramRun.launch` returns the :class:`Launch` of this node's share of a trial, and
  :meth:`~ProgramRun.finish` turns what its program left into the trainer's ``metrics.json``
  after a clean exit on rank 0's node (`autotune.execution.classify` reads it), or returns the
  `autotune.jobs.Result` that ends the trial instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.jobs import Result
from autotune.spec.backends import Backend
from autotune.spec.specs import DEFAULT_PROGRAM

COMPILE_CACHE = "AUTOTUNE_COMPILE_CACHE"  # "0": every trial compiles all of its graphs


@dataclass
class Launch:
    """One node's launch of a trial: the command, its environment and working folder;
    ``msrun``: the command is msrun (logs in ``msrun.log``, its own memory not a device's), else
    the one worker itself (``worker_0.log``); ``warmed``: the warm-up's line for the log;
    ``poll``: called at every look while it runs; ``done``: whether its outputs are complete
    (msrun is then stopped once its workers exited, rather than waited for)."""

    argv: list[str]
    env: dict
    cwd: Path
    msrun: bool
    warmed: str = ""
    poll: Callable[[], None] | None = None
    done: Callable[[], bool] | None = None


class ProgramRun(ABC):
    """One trial program's run side (see the module doc)."""

    name: str
    warm_pools: bool
    compile_cache: bool

    def __init__(self, spec, study_dir: Path):
        self.spec, self.study_dir = spec, study_dir

    @abstractmethod
    def start(self) -> None:
        """Before the study's first trial (in the driver)."""

    @abstractmethod
    def configure(self, job, trial_dir: Path, config: dict) -> None:
        """Add to ``config`` (trial ``job.number``'s ``config.json``, to run in ``trial_dir``)
        what this program's launch and results need."""

    @abstractmethod
    def ended(self, number: int) -> None:
        """Trial ``number`` ended or was cancelled: free what was held for it."""

    @staticmethod
    @abstractmethod
    def launch(
        config: dict,
        trial_dir: Path,
        log_dir: Path,
        env: dict | None,
        workers: int,
        node,
        pins: bool,
        backend: Backend,
        timeout_s: float,
    ) -> Launch:
        """This node's launch of the trial whose ``config.json`` (written) is ``config``:
        ``workers`` ranks in all, this node's share with ``node`` (an
        `autotune.execution.nodes.NodeRun`, None for a trial on one node), ``env`` the variables
        to add (the devices Ray gave), ``pins``: pin each worker to its cores."""

    @staticmethod
    @abstractmethod
    def finish(config: dict, trial_dir: Path) -> Result | None:
        """After the program exited cleanly on rank 0's node: its results into the trainer's
        ``metrics.json``; a Result when the trial ends otherwise (run_s set by the caller)."""


RUNS: dict[str, type[ProgramRun]] = {}


def register_run(run: type[ProgramRun]) -> type[ProgramRun]:
    """Add ``run`` (a complete class) under its program's name; ValueError for a taken name."""
    if run.name in RUNS:
        raise ValueError(f"the run side of trial program {run.name!r} is registered already")
    if run.__abstractmethods__:
        raise ValueError(f"{run.__name__}: does not implement {', '.join(run.__abstractmethods__)}")
    RUNS[run.name] = run
    return run


def run_of(config: dict) -> type[ProgramRun]:
    """The run side of the program a trial's ``config.json`` names (autotune's trainer when it
    names none: a config written without the key)."""
    return RUNS[config.get("program", DEFAULT_PROGRAM)]
