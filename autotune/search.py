"""The study loop: a driver runs its part of a study.

Contract: :func:`run_search` runs (or resumes) a study until it has ``n_trials`` finished
trials in total (a grid: until every candidate was tried once). Three parts, one loop for
every backend:

- the proposer (`autotune.proposer`) decides what to try next — the sampler, de-duplication,
  feasibility (constraints, predicted OOM: recorded ``infeasible``, never run);
- an executor (`autotune.executors`) runs what it is given — the cost model's estimate on
  ``simulate``, a row of the replay table on ``replay`` (`autotune.replay`), the real
  MindSpore program through Ray on ``cpu``/``gpu``/``ascend``;
- the recorder (`autotune.recorder`) stores each outcome, refits the calibration and tells the
  progress display.

The loop itself only schedules: it submits proposals while devices are free, hands results to
the recorder, stops clearly slow trials (`autotune.pruning`), and on Ctrl-C or a crash records
the running trials ``interrupted`` (a resume runs them again). A candidate's own failure is
remembered, an infrastructure failure retried once (`autotune.failures`). On a backend whose
runs are noisy the study ends with the confirm phase (`autotune.confirm`).

Several drivers (`autotune.drivers`: on a storage with heartbeats, e.g. PostgreSQL) may run one
study side by side, each owning the trials it asks. Under the study's lock a driver counts,
before it asks, the finished trials and those running in any driver
(`autotune.records.wanted`) and asks only below N; it syncs what the others asked and measured
into its proposer (never proposed again: a proposal of a candidate running elsewhere is
settled as its repeat when that trial ends) and its calibration, and fails the trials of a
dead driver (`autotune.study.recover_interrupted`) so their candidates run again. Its search
part ends when nothing is wanted and nothing that counts runs anywhere. The baseline is
enqueued, under the lock, only into a study with no trial; one driver runs the confirm phase
(`autotune.drivers.Drivers.confirm_runner`).
"""

from __future__ import annotations

from dataclasses import replace
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune import confirm, costmodel, failures, records
from autotune.backends import backend_of
from autotune.budget import Budget, Stopper, check_budget_backend
from autotune.bulkgrid import run_bulk_grid
from autotune.drivers import HEARTBEAT_S, OWNER, Drivers
from autotune.executors import InstantExecutor, make_executor
from autotune.progress import Progress
from autotune.prior import prior_for
from autotune.proposer import RUNNING, Proposer, Settled
from autotune.pruning import SlowTrialPruner, StepWatcher
from autotune.recorder import Recorder
from autotune.replay import load_table
from autotune.samplers import make_sampler
from autotune.space import Candidate, SearchSpace
from autotune.spec import Spec, SpecError
from autotune.study import encoding_of, open_study, recover_interrupted
from autotune.warmstart import earlier_studies, warm_start

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_REPEATS = 100  # consecutive repeats that mean the sampler has nothing new to offer
WAIT_S = 2.0       # how often a driver with nothing to ask looks at the others' trials


def run_search(spec: Spec, space: SearchSpace, *, storage: str, study_name: str, n_trials: int,
               resume: bool, artifacts: Path, ray_address: str | None = None,
               progress: Progress | None = None, confirm_top: int = 2,
               confirm_runs: int = 2, budget: Budget | None = None,
               stop_when_flat: bool = False, warm: tuple = ()) -> optuna.Study:
    """Run (or resume) the study to ``n_trials`` finished trials — fewer when ``budget`` or
    ``stop_when_flat`` stops it first (`autotune.budget`) — and return it. On a backend whose
    runs are noisy, then re-run the ``confirm_top`` best trials and the baseline
    ``confirm_runs`` times each (0: no confirm phase; within the budget) and store the noise
    floor. ``warm``: earlier studies whose measurements it starts from (`autotune.warmstart`)."""
    sampler = make_sampler(spec.search.sampler, spec.search.seed, n_trials)
    backend = backend_of(spec.cluster.backend)
    if backend.kind == "estimate" and "final_loss" in spec.search.objectives:
        raise SpecError(f"search.objectives: final_loss cannot be estimated on backend {backend.name}")
    # Optuna prunes single-objective studies only; goodput is what a slow trial cannot hide.
    pruner = SlowTrialPruner() if list(spec.search.objectives) == ["goodput"] else None
    # a bad replay table is an input error: read it before the study is created
    table = load_table(spec, space) if backend.kind == "table" else None
    check_budget_backend(budget, spec, table)
    earlier = earlier_studies(spec, space, study_name, warm, storage)
    progress = progress or Progress()
    with make_executor(spec, artifacts / study_name, ray_address, table) as executor:
        # a pool that could never place a trial is refused before the study is written
        executor.check(spec.cluster.devices)
        study = _run_study(spec, space, executor, progress, table, earlier, storage=storage,
                           study_name=study_name, n_trials=n_trials, resume=resume,
                           sampler=sampler, pruner=pruner, confirm_top=confirm_top,
                           confirm_runs=confirm_runs, budget=budget,
                           stop_when_flat=stop_when_flat)
    if executor.noisy:
        floor = confirm.noise_floor(confirm.summarize(study))
        if floor is not None:
            study.set_user_attr("noise_floor", floor)
    progress.finish(study)
    return study


def _run_study(spec, space, executor, progress, table, earlier, *, storage, study_name, n_trials,
               resume, sampler, pruner, confirm_top, confirm_runs, budget,
               stop_when_flat) -> optuna.Study:
    """Open the study and run it on the entered ``executor`` (see :func:`run_search`)."""
    study = open_study(spec, space, storage, study_name, resume, sampler, pruner)
    for note in table.notes if table else ():
        progress.note(note)
    if encoding_of(study) != space.encoding:
        space = replace(space, encoding=encoding_of(study))
        progress.note(f"{study_name!r} was created before ordered knobs: its knobs stay "
                      f"{space.encoding} params")
    drivers = Drivers(study)
    interrupted = recover_interrupted(study, drivers.me)
    if interrupted:
        progress.note(f"resuming: trials {interrupted} were interrupted and will run again")
    recorder = Recorder(spec, study, progress, calibrates=executor.measures)
    proposer = Proposer(spec, space, study, prior_for(spec, space, progress.note), recorder.pairs,
                        drivers)
    with drivers.lock():  # another driver starting at once neither copies nor enqueues again
        for estimate, memory_mb, step_ms in warm_start(spec, space, study, earlier):
            recorder.add_measurement(estimate, {"peak_memory_mb": memory_mb,
                                                "step_time_ms": step_ms}, store=False)
        synced = _load_history(spec, study, proposer, recorder)
        trials = study.get_trials(deepcopy=False)
        already = sum(records.counted(t) for t in trials)
        if spec.search.sampler == "grid":
            n_trials = already + proposer.start_grid()
        elif not any(records.counted(t) or t.state in (TrialState.RUNNING, TrialState.WAITING)
                     for t in trials):
            study.enqueue_trial(space.params_of(space.baseline()), user_attrs={"baseline": True})
            # then one trial per other layout, as many as the budget holds: the sampler's
            # random start could miss a layout, and the layout is the knob that matters most
            # (the prior chooses its own first candidates, spread over layouts)
            openers = [] if proposer.prior else space.layout_openers(spec)[:max(0, n_trials - 1)]
            for candidate in openers:
                study.enqueue_trial(space.params_of(candidate))
    to_run = records.wanted(study, n_trials)
    stopper = Stopper(study, budget, stop_when_flat,
                      virtual_clock=isinstance(executor, InstantExecutor))
    progress.status = stopper.used
    progress.start(study, done=already, total=already + to_run,
                   objectives=spec.search.objectives, searched=space.searched())
    with drivers:
        loop = _Loop(spec, study, proposer, executor, recorder, progress, stopper, drivers,
                     synced)
        if (proposer.grid and isinstance(executor, InstantExecutor) and budget is None
                and not drivers.shared):  # bulk writes bypass the asking another driver sees
            run_bulk_grid(study, proposer, executor, recorder, progress)
        else:
            loop.run(n_trials)
        if executor.noisy and confirm_top:
            runner = drivers.confirm_runner()
            if runner is not None:
                progress.note(f"the confirm phase is left to driver {runner}, which searches "
                              "this study too")
            originals = confirm.plan(study, confirm_top, confirm_runs) if runner is None else []
            if originals:
                progress.start_confirm(len(originals), confirm_top, confirm_runs)
                loop.run_confirm(originals)
    return study


def _load_history(spec, study, proposer: Proposer, recorder: Recorder,
                  trials=None) -> set[int]:
    """What earlier sessions of this study (or, ``trials``, other drivers) tried: remembered by
    the proposer, and their measurements refit the calibration (estimates recomputed: the cost
    model is deterministic). Returns the numbers of the finished trials it read."""
    read = set()
    for t in study.get_trials(deepcopy=False) if trials is None else trials:
        if not t.state.is_finished():
            continue
        read.add(t.number)
        if not failures.remembered_after_restart(t):
            continue
        candidate, metrics = Candidate(**records.knobs_of(t)), records.metrics_of(t)
        proposer.remember(candidate, t.number, records.outcome_of(t), metrics,
                          t.user_attrs.get("detail", ""))
        if records.outcome_of(t) == "ok":
            recorder.add_measurement(costmodel.estimate(spec, candidate), metrics, store=False)
    proposer.calibration = recorder.calibration
    return read


class _Loop:
    """Proposals → executor → recorder, while devices are free (see the module doc)."""

    def __init__(self, spec, study, proposer: Proposer, executor, recorder: Recorder,
                 progress: Progress, stopper: Stopper, drivers: Drivers, synced=()):
        self.spec, self.study, self.progress = spec, study, progress
        self.proposer, self.executor, self.recorder = proposer, executor, recorder
        self.stopper, self.noted = stopper, set()
        self.drivers = drivers
        self.synced = set(synced)  # finished trials the proposer and the calibration know
        self.parked: dict = {}     # number → Settled repeat of a trial running elsewhere
        self.recovered = time.monotonic()
        self.live: dict = {}      # number → Job running
        self.watchers: dict = {}  # number → StepWatcher of a running trial
        self.repeats = 0          # consecutive re-sampled candidates
        self.retries = 0          # infrastructure failures queued again and not asked yet
        self.prunable = isinstance(study.pruner, SlowTrialPruner)

    def _settle(self, settled: Settled) -> None:
        if settled.outcome == RUNNING:  # answered when that trial ends (:meth:`_sync`)
            settled.trial.set_user_attr("repeat_of", settled.repeat_of)  # it does not count
            self.parked[settled.trial.number] = settled
        else:
            self.recorder.settled(settled)
        if settled.repeat_of is not None:
            self.repeats += 1
            if self.repeats == MAX_REPEATS:
                self.progress.note(f"the sampler proposed {MAX_REPEATS} tried candidates in a "
                                   "row: the space looks exhausted, stopping")
            return
        self.repeats = 0
        self.proposer.remember(settled.candidate, settled.trial.number, settled.outcome,
                               detail=settled.detail)

    def _stop(self, flat: bool = True) -> bool:
        """Whether the budget (or, ``flat``, a flat search) says dispatch no more; each kind
        of reason is noted once."""
        reason = self.stopper.reason(len(self.live), flat)
        if reason and reason.split(":")[0] not in self.noted:
            self.noted.add(reason.split(":")[0])
            self.progress.note(reason)
        return reason is not None

    def run(self, n_trials: int) -> None:
        """Propose, run and record until the study has ``n_trials`` trials that count, finished
        (or running in another driver, which is then waited for)."""
        def next_job():
            # a retried failure did not count toward N: one more ask, even past MAX_REPEATS
            retrying, self.retries = self.retries, 0
            while (self.repeats < MAX_REPEATS or retrying) and not self._stop():
                retrying = 0
                with self.drivers.lock():
                    self._sync()
                    if records.wanted(self.study, n_trials) <= 0:
                        return None
                    proposal = self.proposer.propose()
                if isinstance(proposal, Settled):
                    self._settle(proposal)
                    continue
                self.repeats = 0
                return proposal
            return None

        try:
            while True:
                self._drive(next_job)
                if self.repeats >= MAX_REPEATS or self._stop():
                    return
                self._sync()
                if records.wanted(self.study, n_trials) > 0:
                    continue  # a trial elsewhere ended without counting (or was interrupted)
                running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if not self.parked and not any(map(records.will_count, running)):
                    return
                time.sleep(WAIT_S)  # other drivers run the last trials: wait for them
        except BaseException:
            for settled in self.parked.values():  # never ran: nothing to run again
                records.record(self.study, settled.trial, self.recorder.objectives,
                               "interrupted", extra={"repeat_of": settled.repeat_of})
            raise

    def _sync(self) -> None:
        """With several drivers: what the others asked and finished, into the proposer and the
        calibration; the repeats parked until their original ended, settled; every
        ``HEARTBEAT_S``, the trials of a dead driver failed and queued again."""
        if not self.drivers.shared:
            return
        if time.monotonic() - self.recovered > HEARTBEAT_S:
            self.recovered = time.monotonic()
            gone = recover_interrupted(self.study, self.drivers.me)
            if gone:
                self.progress.note(f"trials {gone} lost their driver and will run again")
        trials = self.study.get_trials(deepcopy=False)
        new = [t for t in trials if t.number not in self.synced]
        # this driver's own trials were remembered and measured when they ended
        self.synced |= _load_history(self.spec, self.study, self.proposer, self.recorder,
                                     [t for t in new if t.user_attrs.get(OWNER) != self.drivers.me])
        self.synced |= {t.number for t in new if t.state.is_finished()}
        self.proposer.running = {}
        for t in filter(records.will_count, trials):
            knobs = records.knobs_of(t)
            if None not in knobs.values():  # else still being sampled
                candidate = Candidate(**knobs)
                self.proposer.running[candidate] = t.number
                if self.proposer.prior is not None:
                    self.proposer.prior.mark(candidate)
        for number, settled in list(self.parked.items()):
            original = trials[settled.repeat_of]
            if original.state.is_finished():
                settled.outcome = records.outcome_of(original)
                settled.metrics = records.metrics_of(original)
                settled.detail = original.user_attrs.get("detail", "")
                self.recorder.settled(settled)
                del self.parked[number]

    def run_confirm(self, originals: list) -> None:
        """Run each trial of ``originals`` again (in order), as a confirm-phase re-run."""
        queue = list(originals)

        def next_job():
            if self._stop(flat=False):
                return None
            with self.drivers.lock():  # no other driver pops the queued re-run
                if self.retries:  # a re-run lost to the infrastructure, queued again
                    self.retries -= 1
                    return self.proposer.ask_queued()
                return self.proposer.again(queue.pop(0)) if queue else None

        self._drive(next_job)

    def _drive(self, next_job) -> None:
        """Submit ``next_job()``s while devices are free, record results, until it returns
        None and nothing runs."""
        free = self.executor.capacity()  # at least one trial's worth: executor.check said so
        held, exhausted = None, False
        try:
            while True:
                while free > 0 and (held is not None or not exhausted):
                    held = held or next_job()
                    if held is None:
                        exhausted = True
                        break
                    if held.candidate.devices > free:
                        break  # wait for devices to free up
                    self._submit(held)
                    free -= held.candidate.devices
                    held = None
                if exhausted and held is None and not self.live:
                    return
                for done in self.executor.wait(timeout_s=1.0):
                    free += self._finished(done)
                exhausted = exhausted and not self.retries  # a retry is one more job
                free += self._prune_slow()
        except BaseException:
            # Ctrl-C or a crash: the running trials are cancelled and recorded as interrupted
            # and their candidates re-enqueued, so a later --resume runs them again.
            cancelled = [self.live.pop(n).trial for n in self.executor.cancel_all()]
            for trial in cancelled + ([held.trial] if held else []):
                self.recorder.interrupted(trial)
            raise

    def _submit(self, job) -> None:
        self.executor.submit(job)
        self.live[job.number] = job
        steps = self.executor.steps_dir(job.number)
        if self.prunable and steps is not None and "confirm_of" not in job.trial.user_attrs:
            # a confirm re-run is measured whole
            self.watchers[job.number] = StepWatcher(
                job.trial, steps, self.spec.train.global_batch_size, self.spec.trial.measure_after)
        self.progress.trial_started(job.number, job.candidate)

    def _finished(self, done) -> int:
        """Record a finished trial; return the devices it frees."""
        job = self.live.pop(done.number)
        self.watchers.pop(done.number, None)
        retry = self.recorder.finished(job, done)
        values = records.objective_values(self.recorder.objectives, done.result.metrics)
        if done.result.outcome != "infeasible":  # a replay table without the candidate: no run
            self.stopper.finished(done.timing.get("run_s") or 0.0, job.candidate.devices,
                                  values[0] if values and done.result.outcome == "ok" else None,
                                  counted=not retry and "confirm_of" not in job.trial.user_attrs)
        if retry:
            self.retries += 1
        elif failures.remembered(job.trial, done.result):
            self.proposer.remember(job.candidate, job.number, done.result.outcome,
                                   done.result.metrics, done.result.detail)
        self.proposer.calibration = self.recorder.calibration
        return job.candidate.devices

    def _prune_slow(self) -> int:
        """Stop running trials the pruner finds clearly slow; return the devices freed."""
        freed = 0
        for number, watcher in list(self.watchers.items()):
            if number in self.live and watcher.report():
                self.executor.cancel(number)
                job = self.live.pop(number)
                del self.watchers[number]
                step, goodput = watcher.last
                detail = (f"goodput {goodput:.4g} after step {step} is below "
                          f"{self.study.pruner.ratio:g}× the best finished trial's; stopped early")
                self.recorder.pruned(job, detail)
                self.proposer.remember(job.candidate, number, "pruned", detail=detail)
                freed += job.candidate.devices
        return freed
