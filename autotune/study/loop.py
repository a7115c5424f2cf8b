"""The loop of one study run: proposals → executor → recorder, while devices are free.

Contract: a :class:`Loop` only schedules. It asks the proposer (`autotune.search.proposer`) for
jobs while the executor has devices free, submits them, hands every settled answer and finished
result to the recorder (`autotune.study.recorder`), stops clearly slow trials
(`autotune.stopping.pruning`), and stops dispatching when the stopper says so
(`autotune.stopping.budget`). On Ctrl-C or a crash it records the running trials
``interrupted`` (a resume runs them again). A candidate's own failure is remembered, an
infrastructure failure retried once (`autotune.study.retry`); when every run failed that way,
a retry among them, the stopper ends the run with one line (`autotune.stopping.budget`).

- :meth:`Loop.run` runs until the study has N trials that count (runs: finished, or running in
  another driver, which is then waited for; `autotune.storage.counting`), or until the space is
  exhausted — every candidate ran or is rejected: the proposer says so in one line, noted here
  (`autotune.search.proposer`). What counts is tallied from the study read before each ask,
  each finished trial judged once (`autotune.storage.counting.Tally`), so an ask costs the same
  at the 10,000th trial as at the 10th. A candidate running now — in this driver, or with
  several drivers in any — is never proposed again (`autotune.search.proposer.Proposer.running`):
  a proposal of it is parked as its repeat, settled when that trial ends, and no other ask is
  made until a trial ends. With several drivers (on a storage with
  heartbeats, `autotune.storage.drivers`) it counts, under the study's lock before each ask,
  the finished trials and those running in any driver (`autotune.storage.counting.wanted`); it
  syncs what the others asked and measured into its proposer (never proposed again: a proposal
  of a candidate running elsewhere is settled as its repeat when that trial ends) and its
  calibration, and fails the trials of a dead driver (`autotune.storage.recovery`) so their
  candidates run again.
- :meth:`Loop.run_confirm` runs the confirm phase's re-runs (`autotune.study.confirm`).
- :func:`load_history` is what earlier sessions (or other drivers) tried, into the proposer and
  the calibration.
"""

from __future__ import annotations

import time

from autotune import costmodel
from autotune.jobs import RUNNING, Job, Result
from autotune.search.proposer import Proposer
from autotune.spec.candidate import Candidate
from autotune.spec.objectives import objective_values
from autotune.stopping.budget import Stopper
from autotune.stopping.pruning import SlowTrialPruner, StepWatcher
from autotune.storage import counting, schema
from autotune.storage.drivers import HEARTBEAT_S, OWNER, Drivers
from autotune.storage.recovery import recover_interrupted
from autotune.study import retry
from autotune.study.progress import Progress
from autotune.study.recorder import Recorder

WAIT_S = 2.0  # how often a driver with nothing to ask looks at the others' trials


def load_history(spec, study, proposer: Proposer, recorder: Recorder, trials=None) -> set[int]:
    """What earlier sessions of this study (or, ``trials``, other drivers) tried: remembered by
    the proposer, and their measurements refit the calibration (estimates recomputed: the cost
    model is deterministic). Returns the numbers of the finished trials it read."""
    read = set()
    for t in study.get_trials(deepcopy=False) if trials is None else trials:
        if not t.state.is_finished():
            continue
        read.add(t.number)
        if not retry.remembered_after_restart(t):
            continue
        candidate, metrics = Candidate(**schema.knobs_of(t)), schema.metrics_of(t)
        proposer.remember(
            candidate, t.number, schema.outcome_of(t), metrics, t.user_attrs.get("detail", "")
        )
        if schema.outcome_of(t) == "ok" and recorder.calibrates:  # (the estimate costs 1 ms)
            recorder.add_measurement(candidate, costmodel.estimate(spec, candidate), metrics)
    proposer.calibration = recorder.calibration
    return read


class Loop:
    """Proposals → executor → recorder, while devices are free (see the module doc)."""

    def __init__(
        self,
        spec,
        study,
        proposer: Proposer,
        executor,
        recorder: Recorder,
        progress: Progress,
        stopper: Stopper,
        drivers: Drivers,
        synced=(),
    ):
        self.spec, self.study, self.progress = spec, study, progress
        self.proposer, self.executor, self.recorder = proposer, executor, recorder
        self.stopper, self.noted = stopper, set()
        self.drivers = drivers
        self.synced = set(synced)  # finished trials the proposer and the calibration know
        self.parked: dict = {}  # number → settled Job repeating a trial running elsewhere
        self.recovered = time.monotonic()
        self.live: dict = {}  # number → Job running
        self.submitted: dict = {}  # number → the driver's clock when it was submitted
        self.watchers: dict = {}  # number → StepWatcher of a running trial
        self.tally = counting.Tally()  # what counts toward N, from each read of the study
        self.exhausted = False  # the proposer found no candidate left to try
        self.retries: list = []  # trials failed by infrastructure whose retry waits, unasked
        self.prunable = isinstance(study.pruner, SlowTrialPruner)
        self.paused = False  # a proposal was parked: ask again once a trial ended

    def _settle(self, job: Job) -> None:
        self.progress.driver_trials += 1
        settled = job.settled
        if settled.outcome == RUNNING:  # answered when that trial ends (:meth:`_sync`)
            job.trial.set_user_attr("repeat_of", settled.repeat_of)  # it does not count
            self.parked[job.number] = job
        else:
            self.recorder.settled(job)
        if settled.repeat_of is None:  # a rejection: remembered, never proposed again
            self.proposer.remember(
                job.candidate, job.number, settled.outcome, detail=settled.detail
            )

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
            self.retries = []  # a retried failure did not count toward N: it is asked below
            while not self._stop():
                with self.drivers.lock():
                    # one read of the study per ask: what counts, and whether anything waits
                    unfinished = self._sync()
                    if self.tally.wanted(n_trials) <= 0:
                        return None
                    proposal = self.proposer.propose(unfinished)
                if proposal is None:  # every candidate ran or is rejected
                    if not self.exhausted:
                        self.exhausted = True
                        self.progress.note(self.proposer.exhausted)
                    return None
                if proposal.settled is not None:
                    self._settle(proposal)
                    if proposal.settled.outcome == RUNNING:
                        self.paused = True  # the sampler wants what runs: ask after it ends
                        return None
                    continue
                return proposal
            return None

        try:
            while True:
                self._drive(next_job)
                # settles the repeats of this driver's trials, all ended now
                self._driving(self._sync)
                if self._stop() or self.exhausted and not self.parked:
                    return
                paused, self.paused = self.paused, False
                shared = self.drivers.shared
                if self.tally.wanted(n_trials) > 0 and not (paused and shared or self.exhausted):
                    continue  # a trial elsewhere ended without counting (or was interrupted)
                if (
                    not self.parked
                    and not (paused and shared)
                    and (not shared or not any(map(counting.will_count, self.tally.running())))
                ):
                    return  # one driver: nobody to wait for
                time.sleep(WAIT_S)  # other drivers run the last trials: wait for them
        finally:
            for job in self.parked.values():  # never ran: nothing to run again
                schema.record(
                    self.study,
                    job.trial,
                    self.recorder.objectives,
                    "interrupted",
                    extra={"repeat_of": job.settled.repeat_of},
                )
            self.parked.clear()

    def _sync(self) -> list:
        """The study read once: what counts into the tally; the candidates running now into
        the proposer (this driver's, and with several drivers every driver's); the repeats
        parked until their original ended, settled. With several drivers also: what the others
        asked and finished, into the proposer and the calibration, and every ``HEARTBEAT_S``
        the trials of a dead driver failed and queued again. Returns the trials unfinished at
        that read (frozen)."""
        self.proposer.running = {job.candidate: number for number, job in self.live.items()}
        if self.drivers.shared:
            self._recover()
        finished = self.tally.read(self.study)  # what changed only, not all 10,000 in order
        if self.drivers.shared:
            self._sync_others(finished)
        # (a repeat parked: several trials in flight, each of which is minutes long)
        trials = self.study.get_trials(deepcopy=False) if self.parked else []
        for number, job in list(self.parked.items()):
            original = trials[job.settled.repeat_of]
            if original.state.is_finished():
                job.settled = Result(
                    schema.outcome_of(original),
                    schema.metrics_of(original),
                    original.user_attrs.get("detail", ""),
                    repeat_of=original.number,
                )
                self.recorder.settled(job)
                del self.parked[number]
        return list(self.tally.feed.unfinished.values())

    def _recover(self) -> None:
        """Every ``HEARTBEAT_S``: the trials of a dead driver failed and queued again."""
        if time.monotonic() - self.recovered > HEARTBEAT_S:
            self.recovered = time.monotonic()
            gone = recover_interrupted(self.study, self.drivers.me)
            if gone:
                self.progress.note(f"trials {gone} lost their driver and will run again")

    def _sync_others(self, finished: list) -> None:
        """The several-drivers part of :meth:`_sync`: ``finished``, the trials that finished
        since the last read, into the proposer and the calibration (those of other drivers
        not synced yet: this driver's own were remembered and measured when they ended), and
        the candidates running in any driver into the proposer and the prior."""
        new = [t for t in finished if t.number not in self.synced]
        self.synced |= load_history(
            self.spec,
            self.study,
            self.proposer,
            self.recorder,
            [t for t in new if t.user_attrs.get(OWNER) != self.drivers.me],
        )
        self.synced |= {t.number for t in new}
        for t in filter(counting.will_count, self.tally.running()):
            knobs = schema.knobs_of(t)
            if None not in knobs.values():  # else still being sampled
                candidate = Candidate(**knobs)
                self.proposer.running[candidate] = t.number
                if self.proposer.prior is not None:
                    self.proposer.prior.mark(candidate)

    def run_confirm(self, originals: list) -> None:
        """Run each trial of ``originals`` again (in order), as a confirm-phase re-run."""
        queue = list(originals)

        def next_job():
            if self._stop(flat=False):
                return None
            with self.drivers.lock():  # no other driver pops the queued re-run
                if self.retries:  # a re-run lost to the infrastructure, queued again
                    return self.proposer.rerun(self.retries.pop(0))
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
                    held = held or self._driving(next_job)
                    if held is None:
                        exhausted = True
                        break
                    if held.candidate.devices > free:
                        break  # wait for devices to free up
                    self._driving(self._submit, held)
                    free -= held.candidate.devices
                    held = None
                if exhausted and held is None and not self.live:
                    return
                ended = self.executor.wait(timeout_s=1.0)
                for number, result in ended:
                    free += self._driving(self._finished, number, result)
                if ended and self.paused:  # what the sampler wanted may have ended: ask again
                    exhausted = self.paused = False
                exhausted = exhausted and not self.retries  # a retry is one more job
                free += self._driving(self._prune_slow)
        except BaseException:
            # Ctrl-C or a crash: the running trials are cancelled and recorded as interrupted
            # and their candidates re-enqueued, so a later --resume runs them again.
            cancelled = [self.live.pop(n).trial for n in self.executor.cancel_all()]
            for trial in cancelled + ([held.trial] if held else []):
                self.recorder.interrupted(trial)
            raise

    def _driving(self, work, *args):
        """``work(*args)``, its seconds the driver's own (`Progress.driver_seconds`): all the
        loop does but wait for trials to end."""
        started = time.perf_counter()
        try:
            return work(*args)
        finally:
            self.progress.driver_seconds += time.perf_counter() - started

    def _submit(self, job) -> None:
        self.progress.driver_trials += 1
        self.executor.submit(job)
        self.live[job.number] = job
        self.submitted[job.number] = time.monotonic()
        steps = self.executor.steps_dir(job.number)
        if self.prunable and steps is not None and "confirm_of" not in job.trial.user_attrs:
            # a confirm re-run is measured whole
            self.watchers[job.number] = StepWatcher(
                job.trial, steps, self.spec.train.global_batch_size, self.spec.trial.measure_after
            )
        self.progress.trial_started(job.number, job.candidate)

    def _finished(self, number: int, result: Result) -> int:
        """Record a finished trial; return the devices it frees."""
        job = self.live.pop(number)
        self.watchers.pop(number, None)
        self.submitted.pop(number, None)
        again = self.recorder.finished(job, result)
        values = objective_values(self.recorder.objectives, result.metrics)
        # a replay table without the candidate ran nothing; a program's refusal at start-up ran
        if result.outcome != "infeasible" or result.run_s is not None:
            lost = (
                ((result.detail.strip().splitlines() or [""])[0][:200] or "no reason given")
                if retry.attrs(result)
                else None
            )
            self.stopper.finished(
                result.run_s or 0.0,
                job.candidate.devices,
                values[0] if values and result.outcome == "ok" else None,
                counted=not again and "confirm_of" not in job.trial.user_attrs,
                infrastructure=lost,
                retry=retry.RETRY_OF in job.trial.user_attrs,
            )
        if again:
            self.retries.append(number)
        elif retry.remembered(job.trial, result):
            self.proposer.remember(
                job.candidate,
                self.recorder.late.get(number, number),
                result.outcome,
                result.metrics,
                result.detail,
            )
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
                pruner = self.study.pruner
                upper = pruner.upper_bound(goodput, watcher.half_width)
                detail = (
                    f"goodput {goodput:.4g} after step {step} (at most {upper:.4g}, 95%) "
                    f"is below {pruner.ratio:g}× the best finished trial's; stopped early"
                )
                run_s = time.monotonic() - self.submitted.pop(number)  # its devices were held
                self.recorder.pruned(job, detail, run_s)
                self.stopper.finished(run_s, job.candidate.devices, None, counted=True)
                self.proposer.remember(job.candidate, number, "pruned", detail=detail)
                freed += job.candidate.devices
        return freed
