"""MindFormers' run side (``trial.program: mindformers``): its trials prepared, launched and read
back as `autotune.execution.program_run.ProgramRun` says, with what `autotune.mindformers` writes
and reads.

Contract:
- driver: each trial in processes of its own (one-shot: MindFormers keeps global state), never
  in warm pools nor autotune's compile cache. :meth:`MindFormersRun.start` checks that
  ``trial.python`` finds MindFormers and MindSpore (their versions key the compile cache) and
  writes the study's synthetic dataset when it asks for one (`autotune.mindformers.data`);
  :meth:`~MindFormersRun.configure` adds the trial's ``mindformers`` section
  (`autotune.mindformers.trial.trial_section`) and MindSpore's compile cache in a folder of the
  candidate's own (`autotune.mindformers.trial.compile_cache_key`: a re-run of it, as the confirm
  phase's, loads its graphs; one trial of a candidate at a time uses it).
- node: :func:`node_launch` writes the trial's ``trial.yaml`` and returns msrun of MindFormers'
  interpreter (always msrun: `autotune.mindformers.launch`), following the stop rule from its
  live steps on rank 0's node (`autotune.mindformers.results.StopPlan`);
  :meth:`~MindFormersRun.finish` reads the recorder's files into ``metrics.json``, and a trial
  whose ranks' files are not all in its folder ends as the infrastructure's ``error``.
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.execution.environment import device_environment
from autotune.execution.nodes import free_port
from autotune.execution.program_run import COMPILE_CACHE, Launch, ProgramRun
from autotune.files import write_text
from autotune.jobs import Result
from autotune.mindformers.launch import launch as mindformers_launch
from autotune.mindformers.results import MissingRanks, StopPlan, write_metrics
from autotune.mindformers.trial import SECTION, TRIAL_FILE, compile_cache_key, trial_section
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_trial import mindformers_versions
from autotune.spec.programs import MindFormers


class MindFormersRun(ProgramRun):
    """MindFormers' ``run_mindformer.py`` as a study's trials (see the module doc)."""

    name = MindFormers.name
    warm_pools = compile_cache = False

    def __init__(self, spec, study_dir: Path):
        super().__init__(spec, study_dir)
        self.data = None  # the study's synthetic dataset, once written
        # MindSpore's compile cache under MindFormers: a folder per candidate, filled by its
        # first run and loaded by its re-runs, one trial at a time (number → its folder's key)
        self.cache = (
            None
            if os.environ.get(COMPILE_CACHE) == "0"
            else (study_dir.parent / ".mindformers-cache").resolve()
        )
        self.versions = ""  # MindFormers' and MindSpore's, as the trials' interpreter finds them
        self._caching: dict[int, str] = {}

    def start(self) -> None:
        spec = self.spec
        versions = mindformers_versions(spec.trial.python, Path(spec.trial.run_mindformer).parent)
        if versions is None:  # a driver whose trials' interpreter cannot run fails here
            raise SpecError(
                f"{spec.source}: trial.python: {spec.trial.python} does not run, or finds no "
                "mindformers and mindspore packages"
            )
        self.versions = versions
        if spec.trial.data == "synthetic":
            from autotune.mindformers.data import synthetic_dataset

            self.data = synthetic_dataset(spec, self.study_dir.parent / ".mindformers-data")

    def configure(self, job, trial_dir: Path, config: dict) -> None:
        mf = trial_section(
            self.spec,
            job.candidate,
            job.number,
            trial_dir.resolve(),
            self.data,
            stop_rule=self.spec.stop_rule() is not None,
        )
        key = compile_cache_key(mf, self.versions)
        if self.cache is not None and key not in self._caching.values():
            mf["compile_cache"] = str(self.cache / key)
            self._caching[job.number] = key
        config[SECTION] = mf

    def ended(self, number: int) -> None:
        self._caching.pop(number, None)

    @staticmethod
    def launch(config, trial_dir, log_dir, env, workers, node, pins, backend, timeout_s) -> Launch:
        argv, full_env, cwd = node_launch(
            config[SECTION], trial_dir, log_dir, env, workers, node, pins, backend, timeout_s
        )
        plan = StopPlan(config, trial_dir) if node is None or node.launch.index == 0 else None
        return Launch(argv, full_env, cwd, msrun=True, poll=plan.poll if plan else None)

    @staticmethod
    def finish(config: dict, trial_dir: Path) -> Result | None:
        try:
            write_metrics(trial_dir, config)  # the recorder's files → metrics.json
        except MissingRanks as missing:  # the trial folder is not the nodes' shared one
            return Result("error", detail=f"infrastructure: {missing}", infrastructure=True)
        return None


def node_launch(
    mf: dict,
    trial_dir: Path,
    log_dir: Path,
    env: dict | None,
    workers: int,
    node,
    pins: bool,
    backend,
    timeout_s: float,
) -> tuple[list[str], dict, Path]:
    """A MindFormers trial's ``(argv, environment, cwd)`` on this node, its trial.yaml written
    whole (nodes sharing the folder each write it; a reader never sees half of it:
    `autotune.files.write_text`) (`autotune.mindformers.launch`): from ours plus ``env``, the
    backend's own variables and what an accelerator's trial gets beside its devices, as
    autotune's own trials do (`autotune.execution.environment.device_environment`)."""
    write_text(trial_dir / TRIAL_FILE, mf["trial_yaml"])
    local = node.launch.local_workers if node else workers
    base = {**os.environ, **(env or {}), **dict(backend.environment)}
    base.update(device_environment(backend, base, local, timeout_s))
    place = (
        {"master_port": free_port()}
        if node is None
        else {
            "master_port": node.master_port,
            "master_addr": node.master_addr,
            "node_rank": node.launch.msrun_node_rank,
        }
    )
    return mindformers_launch(
        mf, trial_dir, log_dir, base, workers=workers, local_workers=local, bind_core=pins, **place
    )
