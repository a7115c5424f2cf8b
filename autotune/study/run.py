"""One run of a study: open it (or resume it), warm-start it, run its loop, confirm its winners.

Contract: :func:`run_study` runs (or resumes) a study until it has ``n_trials`` finished trials
in total (a grid: until every candidate was tried once), fewer when a budget or a flat search
stops it first (`autotune.stopping.budget`). One loop serves every backend
(`autotune.study.loop`):

- the proposer (`autotune.search.proposer`) decides what to try next — the sampler,
  de-duplication, feasibility (constraints, predicted OOM: recorded ``infeasible``, never run);
- an executor (`autotune.execution.executors`) runs what it is given — the cost model's
  estimate on ``simulate``, rows of the replay table on ``replay``, the real MindSpore program
  through Ray on ``cpu``/``gpu``/``ascend``;
- the recorder (`autotune.study.recorder`) stores each outcome, refits the calibration and tells
  the progress display (`autotune.study.progress`).

A new study runs the baseline first (then, for a plain sampler, one trial per other layout); a
study resumed after a crash first fails what its dead drivers left running and queues it again
(`autotune.storage.recovery`). ``warm``: earlier studies whose measurements it starts from
(`autotune.study.warmstart`). On a backend whose runs are noisy the study ends with the confirm
phase (`autotune.study.confirm`) and stores the noise floor. Several drivers may run one study
side by side (`autotune.storage.drivers`): the baseline is enqueued, under the study's lock,
only into a study with no trial, and one driver runs the confirm phase.

This is the only package that brings search, stopping, execution and storage together.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.analysis.ranking import noise_floor, summarize
from autotune.execution.executors import make_executor
from autotune.execution.replay import load_table, with_engine
from autotune.search.layouts import layouts
from autotune.search.proposer import Proposer
from autotune.search.samplers import make_sampler
from autotune.search.study_prior import prior_for
from autotune.spec.backends import backend_of
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.space import SearchSpace
from autotune.spec.specs import Spec
from autotune.stopping.budget import Budget, Stopper, check_budget_backend
from autotune.stopping.pruning import SlowTrialPruner
from autotune.storage.connection import check_storage
from autotune.storage.counting import counted, ran, rejected, wanted
from autotune.storage.drivers import OWNER, Drivers
from autotune.storage.recovery import recover_interrupted
from autotune.storage.schema import knobs_of
from autotune.study import confirm
from autotune.study.bulkgrid import run_bulk_grid
from autotune.study.loop import Loop, load_history
from autotune.study.opening import as_created, older_measurements, open_study
from autotune.study.progress import Progress
from autotune.study.recorder import Recorder
from autotune.study.warmstart import earlier_studies, warm_start
from autotune.train.metrics import MEASUREMENT

optuna.logging.set_verbosity(optuna.logging.WARNING)


def run_study(
    spec: Spec,
    space: SearchSpace,
    *,
    storage: str,
    study_name: str,
    n_trials: int,
    resume: bool,
    artifacts: Path,
    ray_address: str | None = None,
    progress: Progress | None = None,
    confirm_top: int = 2,
    confirm_runs: int = 2,
    budget: Budget | None = None,
    stop_when_flat: bool = False,
    warm: tuple = (),
) -> optuna.Study:
    """Run (or resume) the study to ``n_trials`` finished trials — fewer when ``budget`` or
    ``stop_when_flat`` stops it first — and return it (see the module doc). On a backend whose
    runs are noisy, then re-run the ``confirm_top`` best trials and the baseline
    ``confirm_runs`` times each (0: no confirm phase; within the budget) and store the noise
    floor. ``warm``: earlier studies whose measurements it starts from."""
    sampler = make_sampler(spec.search.sampler, spec.search.seed, n_trials)
    backend = backend_of(spec.cluster.backend)
    if backend.kind == "estimate" and "final_loss" in spec.search.objectives:
        raise SpecError(
            f"search.objectives: final_loss cannot be estimated on backend {backend.name}"
        )
    # Optuna prunes single-objective studies only; goodput is what a slow trial cannot hide. It
    # is judged on no fewer steps than a trial's own interval is (trial.min_steps).
    pruner = (
        SlowTrialPruner(min_steps=spec.trial.min_steps)
        if list(spec.search.objectives) == ["goodput"]
        else None
    )
    # a bad replay table is an input error: read it before the study is created
    table = load_table(spec, space) if backend.kind == "table" else None
    if table is not None:  # the prior prices the program that ran its rows
        spec = with_engine(spec, table)
    check_budget_backend(budget, spec, table)
    if isinstance(storage, str):  # a storage that cannot be opened fails before a pool starts
        check_storage(storage)
    earlier = earlier_studies(spec, space, study_name, warm, storage)
    progress = progress or Progress()
    with make_executor(spec, artifacts / study_name, ray_address, table) as executor:
        # a pool that could never place a trial is refused before the study is written
        executor.check(spec.cluster.devices)
        study = _run_study(
            spec,
            space,
            executor,
            progress,
            table,
            earlier,
            storage=storage,
            study_name=study_name,
            n_trials=n_trials,
            resume=resume,
            sampler=sampler,
            pruner=pruner,
            confirm_top=confirm_top,
            confirm_runs=confirm_runs,
            budget=budget,
            stop_when_flat=stop_when_flat,
        )
    if executor.noisy:
        floor = noise_floor(summarize(study))
        if floor is not None:
            study.set_user_attr("noise_floor", floor)
    progress.finish(study)
    return study


def interrupted_note(study: optuna.Study, number: int, shared: bool) -> str:
    """The line naming one trial a resume took for interrupted, and whose it was."""
    owner = study.get_trials(deepcopy=False)[number].user_attrs.get(OWNER, "unknown")
    why = (
        "its driver is gone"
        if shared
        else "SQLite keeps one driver, so a trial this run did not start is not running"
    )
    return f"resuming: trial #{number} (driver {owner}) was interrupted ({why}); its candidate runs again"


def _run_study(
    spec,
    space,
    executor,
    progress,
    table,
    earlier,
    *,
    storage,
    study_name,
    n_trials,
    resume,
    sampler,
    pruner,
    confirm_top,
    confirm_runs,
    budget,
    stop_when_flat,
) -> optuna.Study:
    """Open the study and run it on the entered ``executor`` (see :func:`run_study`)."""
    study = open_study(spec, space, storage, study_name, resume, sampler, pruner)
    space, kept = as_created(study, space)
    if backend_of(spec.cluster.backend).runs_program:  # the trial program measured its trials
        older = older_measurements(study, MEASUREMENT)
        kept = [*kept, older] if older else kept
    for note in (*(table.notes if table else ()), *kept, *(note for *_, note in earlier if note)):
        progress.note(note)
    drivers = Drivers(study)
    for number in recover_interrupted(study, drivers.me):
        progress.note(interrupted_note(study, number, drivers.shared))
    recorder = Recorder(spec, study, progress, calibrates=executor.measures)
    proposer = Proposer(
        spec,
        space,
        study,
        prior_for(spec, space, progress.note, n_trials),
        recorder.measured,
        drivers,
    )
    if table is not None:  # a candidate without a row is rejected before it is dispatched
        proposer.cannot_run = table.missing
    with drivers.lock():  # another driver starting at once neither copies nor enqueues again
        for candidate, estimate, metrics in warm_start(spec, space, study, earlier):
            recorder.add_measurement(candidate, estimate, metrics)
        synced = load_history(spec, study, proposer, recorder)
        trials = study.get_trials(deepcopy=False)
        executor.continue_from(Counter(Candidate(**knobs_of(t)) for t in trials if ran(t)))
        already = sum(counted(t) for t in trials)
        runs = None  # the runs a grid will count (it ends when it has run through)
        if spec.search.sampler == "grid":
            runs = proposer.start_grid()
            n_trials = already + len(proposer.grid)
        elif not any(
            counted(t) or rejected(t) or t.state in (TrialState.RUNNING, TrialState.WAITING)
            for t in trials
        ):
            study.enqueue_trial(space.params_of(space.baseline()), user_attrs={"baseline": True})
            # then one trial per other layout, as many as the budget holds: the sampler's
            # random start could miss a layout, and the layout is the knob that matters most
            # (the prior chooses its own first candidates, spread over layouts)
            openers = [] if proposer.prior else space.layout_openers(spec)[: max(0, n_trials - 1)]
            for candidate in openers:
                study.enqueue_trial(space.params_of(candidate))
    to_run = wanted(study.get_trials(deepcopy=False), n_trials) if runs is None else runs
    stopper = Stopper(study, budget, stop_when_flat, virtual_clock=executor.virtual_clock)
    progress.status = stopper.used
    progress.start(
        study,
        done=already,
        total=already + to_run,
        objectives=spec.search.objectives,
        searched=space.searched(),
    )
    with drivers:
        loop = Loop(spec, study, proposer, executor, recorder, progress, stopper, drivers, synced)
        if (
            proposer.grid and executor.instant and budget is None and not drivers.shared
        ):  # bulk writes bypass the asking another driver sees
            run_bulk_grid(study, proposer, executor, recorder, progress)
        else:
            loop.run(n_trials)
        if proposer.prior is not None:  # what `autotune show` lists: why a layout never ran
            left = wanted(study.get_trials(deepcopy=False), n_trials)
            study.set_user_attr("layouts", layouts(proposer.prior, recorder.measured, left))
        if executor.noisy and confirm_top:
            runner = drivers.confirm_runner()
            if runner is not None:
                progress.note(
                    f"the confirm phase is left to driver {runner}, which searches this study too"
                )
            originals = confirm.plan(study, confirm_top, confirm_runs) if runner is None else []
            if originals:
                progress.start_confirm(len(originals), confirm_top, confirm_runs)
                loop.run_confirm(originals)
    return study
