"""The ask/tell loop: one driver owns the study.

Contract: :func:`run_search` asks the sampler for candidates, rejects the infeasible ones
(constraints, predicted OOM) without running them, runs the rest through a dispatcher (or, on
the ``simulate`` backend, takes the cost model's estimate as the trial), and tells each result,
until the study has ``n_trials`` finished trials (a grid: until every candidate was tried once).
Resuming marks the trials a dead driver left RUNNING as ``interrupted`` and runs them again.
A candidate's own failure is remembered, an infrastructure failure retried once
(`autotune.failures`).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune import confirm, costmodel, failures, records
from autotune.progress import Progress
from autotune.samplers import make_sampler
from autotune.pruning import SlowTrialPruner, StepWatcher
from autotune.space import Candidate, SearchSpace, violations
from autotune.spec import Spec, SpecError
from autotune.study import open_study, recover_interrupted, requeue
from autotune.train.config import trial_config

optuna.logging.set_verbosity(optuna.logging.WARNING)


def simulated_metrics(estimate) -> dict:
    """A simulate-backend trial: the cost model's estimate stored as the trial's metrics."""
    return {"goodput": estimate.samples_per_s, "throughput": estimate.samples_per_s,
            "step_time_ms": estimate.step_time_s * 1000,
            "peak_memory_mb": estimate.memory_gb_per_device * 1024}


def run_search(spec: Spec, space: SearchSpace, *, storage: str, study_name: str, n_trials: int,
               resume: bool, artifacts: Path, ray_address: str | None = None,
               progress: Progress | None = None, confirm_top: int = 2,
               confirm_runs: int = 2) -> optuna.Study:
    """Run (or resume) the study to ``n_trials`` finished trials and return it. On a real
    backend, then re-run the ``confirm_top`` best trials and the baseline ``confirm_runs`` times
    each (0: no confirm phase) and store the noise floor (`autotune.confirm`)."""
    sampler = make_sampler(spec.search.sampler, spec.search.seed, n_trials)
    if spec.cluster.backend == "simulate" and "final_loss" in spec.search.objectives:
        raise SpecError("search.objectives: final_loss cannot be estimated on backend simulate")
    # Optuna prunes single-objective studies only; goodput is what a slow trial cannot hide.
    pruner = SlowTrialPruner() if list(spec.search.objectives) == ["goodput"] else None
    study = open_study(spec, space, storage, study_name, resume, sampler, pruner)
    progress = progress or Progress()
    interrupted = recover_interrupted(study)
    if interrupted:
        progress.note(f"resuming: trials {interrupted} were interrupted and will run again")
    already = [t for t in study.get_trials(deepcopy=False) if records.counted(t)]
    loop = _Loop(spec, space, study, artifacts / study_name, progress)
    if spec.search.sampler == "grid":
        loop.grid = deque(_grid_params(space, loop.seen))
        n_trials = len(already) + len(loop.grid)
    elif not already and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.enqueue_trial(space.params_of(space.baseline()), user_attrs={"baseline": True})
        # then one trial per other layout, as many as the budget holds: the sampler's random
        # start could miss a layout, and the layout is the knob that matters most
        for candidate in space.layout_openers(spec)[:max(0, n_trials - 1)]:
            study.enqueue_trial(space.params_of(candidate))
    # every queued candidate runs, even past N (an interrupted one on a finished study)
    to_run = max(n_trials - len(already), len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))))
    progress.start(study, done=len(already), total=len(already) + to_run,
                   objectives=spec.search.objectives, searched=space.searched())
    if spec.cluster.backend == "simulate" and loop.grid:
        loop.run_simulated_grid()
    elif spec.cluster.backend == "simulate":
        loop.run_simulated(to_run)
    else:
        from autotune.dispatch import Dispatcher

        with Dispatcher(spec.cluster.backend, spec.cluster.devices, ray_address) as dispatcher:
            loop.run_dispatched(dispatcher, to_run)
            originals = confirm.plan(study, confirm_top, confirm_runs) if confirm_top else []
            if originals:
                progress.start_confirm(len(originals), confirm_top, confirm_runs)
                loop.run_confirm(dispatcher, originals)
        floor = confirm.noise_floor(confirm.summarize(study))
        if floor is not None:
            study.set_user_attr("noise_floor", floor)
    progress.finish(study)
    return study


def _grid_params(space: SearchSpace, seen) -> list[tuple[Candidate, dict]]:
    """Every candidate not tried yet, with the params a trial of it suggests."""
    return [(candidate, space.params_of(candidate)) for candidate in space.candidates()
            if candidate not in seen]


REPEAT, INFEASIBLE = object(), object()
MAX_REPEATS = 100  # consecutive repeats that mean the sampler has nothing new to offer


class _Loop:
    """Ask → feasibility → run → tell, with the study's calibration kept up to date."""

    def __init__(self, spec, space, study, study_dir: Path, progress: Progress):
        self.spec, self.space, self.study, self.progress = spec, space, study, progress
        self.study_dir = study_dir
        self.objectives = spec.search.objectives
        self.profile = costmodel.resolve_profile(spec.cluster)
        self.live: dict = {}  # number → (trial, candidate, estimate dict, driver seconds)
        self.repeats = 0      # consecutive re-sampled candidates
        self.retries = 0      # infrastructure failures queued again and not asked yet
        self.grid: deque = deque()  # (candidate, params) still to try, for --sampler grid
        self.watchers: dict = {}  # number → StepWatcher of a running trial
        self.prunable = isinstance(study.pruner, SlowTrialPruner)
        # candidate → (number, outcome, metrics, detail) of a finished trial: a repeat is
        # answered from here, without reading storage again
        self.seen: dict = {}
        self.pairs = []
        for t in study.get_trials(deepcopy=False):
            if not failures.remembered_after_restart(t):
                continue
            candidate, metrics = Candidate(**records.knobs_of(t)), records.metrics_of(t)
            self.seen[candidate] = (t.number, records.outcome_of(t), metrics,
                                    t.user_attrs.get("detail", ""))
            if records.outcome_of(t) == "ok" and spec.cluster.backend != "simulate":
                # earlier sessions' measurements refit the calibration too (their estimates
                # are recomputed: the cost model is deterministic)
                self.pairs.append((costmodel.estimate(spec, candidate),
                                   metrics.get("peak_memory_mb"), metrics.get("step_time_ms")))
        self.calibration = costmodel.Calibration.from_pairs(self.pairs) if self.pairs else None

    def _verdict(self, candidate) -> tuple:
        """(estimate, reason): the reason is empty when the candidate may run."""
        reasons = violations(self.spec, candidate)
        estimate = costmodel.estimate(self.spec, candidate, self.calibration)
        infeasible = reasons or not estimate.feasible
        return estimate, ("; ".join(reasons) or estimate.reason) if infeasible else ""

    def _remember(self, candidate, number: int, outcome: str, metrics=None, detail="") -> None:
        self.seen[candidate] = (number, outcome, metrics or {}, detail)

    def _ask(self):
        """Ask one candidate and settle it at once when it needs no run: infeasible (recorded),
        or a repeat of a finished candidate (answered from storage). Returns
        (trial, candidate, estimate, driver seconds), ``INFEASIBLE`` or ``REPEAT``."""
        started = time.perf_counter()
        if self.grid:  # enqueued one at a time: Optuna scans every waiting trial on each ask
            self.study.enqueue_trial(self.grid.popleft()[1])
        trial = self.study.ask()
        candidate, fixed = self.space.sample(trial)
        for name, value in fixed.items():
            trial.set_user_attr(name, value)
        if candidate in self.seen:
            self._repeat(trial, *self.seen[candidate])
            return REPEAT
        estimate, reason = self._verdict(candidate)
        if reason:
            records.record(self.study, trial, self.objectives, "infeasible", detail=reason,
                           extra={"estimate": estimate.as_dict()})
            self._remember(candidate, trial.number, "infeasible", detail=reason)
            self.progress.trial_done(trial.number, "infeasible", {}, reason)
            return INFEASIBLE
        return trial, candidate, estimate, time.perf_counter() - started

    def _repeat(self, trial, number: int, outcome: str, metrics: dict, detail: str) -> None:
        """Tell a re-sampled candidate the result it already has, so the sampler learns it
        without spending a run (such trials don't count toward n_trials)."""
        records.record(self.study, trial, self.objectives, outcome, metrics, detail,
                       extra={"repeat_of": number})
        self.repeats += 1
        if self.repeats == MAX_REPEATS:
            self.progress.note(f"the sampler proposed {MAX_REPEATS} tried candidates in a row: "
                               "the space looks exhausted, stopping")

    def _settled(self, asked) -> bool:
        """Whether ``_ask``'s answer needs no run; counts it against the remaining trials."""
        if asked is REPEAT:
            return True
        self.repeats = 0
        return asked is INFEASIBLE

    def run_simulated(self, remaining: int) -> None:
        while remaining > 0 and self.repeats < MAX_REPEATS:
            asked = self._ask()
            if self._settled(asked):
                remaining -= asked is INFEASIBLE
                continue
            remaining -= 1
            trial, candidate, estimate, _ = asked
            metrics = simulated_metrics(estimate)
            records.record(self.study, trial, self.objectives, "ok", metrics,
                           extra={"estimate": estimate.as_dict()})
            self._remember(candidate, trial.number, "ok", metrics)
            self.progress.trial_done(trial.number, "ok", metrics)

    def run_simulated_grid(self, batch: int = 250) -> None:
        """Estimate every grid candidate and store the trials in bulk: a grid needs no sampler,
        so each trial is one storage write instead of an ask, a dozen attrs and a tell."""
        distributions = {name: optuna.distributions.CategoricalDistribution(list(domain))
                         for name, domain in self.space.domains.items()}
        number = len(self.study.get_trials(deepcopy=False))
        while self.grid:
            chunk = [self.grid.popleft() for _ in range(min(batch, len(self.grid)))]
            trials, ok_values = [], []
            for candidate, params in chunk:
                estimate, reason = self._verdict(candidate)
                extra = {"estimate": estimate.as_dict()}
                extra.update({k: v for k, v in candidate.as_dict().items() if k not in params})
                if reason:
                    settled = records.settle(self.objectives, "infeasible", detail=reason,
                                             extra=extra)
                else:
                    settled = records.settle(self.objectives, "ok", simulated_metrics(estimate),
                                             extra=extra)
                state, values, attrs = settled
                if values:
                    ok_values.append((values[0], number + len(trials)))
                trials.append(optuna.trial.create_trial(
                    state=state, values=values, params=params, user_attrs=attrs,
                    distributions={k: distributions[k] for k in params}))
            self.study.add_trials(trials)
            number += len(trials)
            self.progress.batch_done(len(trials), ok_values)

    def run_dispatched(self, dispatcher, remaining: int) -> None:
        """Ask, run and tell until ``remaining`` trials have been asked (repeats excepted)."""
        def next_job():
            nonlocal remaining
            retrying, self.retries = self.retries, 0  # a retried failure did not count toward
            remaining += retrying                     # N: one more ask, even past MAX_REPEATS
            while remaining > 0 and (self.repeats < MAX_REPEATS or retrying):
                retrying = 0
                asked = self._ask()
                if self._settled(asked):
                    remaining -= asked is INFEASIBLE
                    continue
                remaining -= 1
                return asked
            return None

        self._drive(dispatcher, next_job)

    def run_confirm(self, dispatcher, originals: list) -> None:
        """Run each trial of ``originals`` again (in order), as a confirm-phase re-run."""
        queue = deque(originals)

        def next_job():
            if self.retries:  # a re-run lost to the infrastructure, queued again
                self.retries -= 1
                return self._ask_queued()
            return self._ask_again(queue.popleft()) if queue else None

        self._drive(dispatcher, next_job)

    def _ask_again(self, original):
        """A new trial with ``original``'s params, user attr ``confirm_of`` = its number."""
        self.study.enqueue_trial(original.params, user_attrs={"confirm_of": original.number})
        return self._ask_queued()

    def _ask_queued(self):
        """Ask the queued trial and run it as it is (no repeat or feasibility check)."""
        started = time.perf_counter()
        trial = self.study.ask()
        candidate, fixed = self.space.sample(trial)
        for name, value in fixed.items():
            trial.set_user_attr(name, value)
        estimate, _ = self._verdict(candidate)
        return trial, candidate, estimate, time.perf_counter() - started

    def _drive(self, dispatcher, next_job) -> None:
        """Submit ``next_job()``s while devices are free, tell results, until it returns None
        and nothing runs."""
        free = dispatcher.capacity()
        if free < self.spec.cluster.devices:
            raise SpecError(f"cluster.devices: a trial needs {self.spec.cluster.devices} devices "
                            f"but the Ray cluster has {free}")
        held, exhausted = None, False
        try:
            while True:
                while free > 0 and (held is not None or not exhausted):
                    held = held or next_job()
                    if held is None:
                        exhausted = True
                        break
                    if held[1].devices > free:
                        break  # wait for devices to free up
                    self._submit(dispatcher, *held)
                    free -= held[1].devices
                    held = None
                if exhausted and held is None and not self.live:
                    return
                for finished in dispatcher.wait(timeout_s=1.0):
                    free += self._tell(finished)
                exhausted = exhausted and not self.retries  # a retry is one more job
                free += self._prune_slow(dispatcher)
        except BaseException:
            # Ctrl-C or a crash: the running trials are cancelled and recorded as interrupted
            # and their candidates re-enqueued, so a later --resume runs them again.
            cancelled = [self.live.pop(n)[0] for n in dispatcher.cancel_all()]
            for trial in cancelled + ([held[0]] if held else []):
                self._interrupt(trial)
            raise

    def _interrupt(self, trial) -> None:
        requeue(self.study, trial.params, records.role_of(trial))
        records.record(self.study, trial, self.objectives, "interrupted",
                       detail="the driver stopped before this trial finished")

    def _submit(self, dispatcher, trial, candidate, estimate, driver_s) -> None:
        trial_dir = self.study_dir / str(trial.number)
        config = trial_config(self.spec, candidate, study=self.spec.study, number=trial.number,
                              out_dir=trial_dir.resolve(), steps=self.spec.trial.steps,
                              measure_after=self.spec.trial.measure_after)
        # On CPU a device is a worker process: its RSS budget is enforced by the runner.
        cpu = self.spec.cluster.backend == "cpu"
        memory_mb = self.profile.memory_gb * 1024 if cpu else None
        dispatcher.submit(trial.number, config, trial_dir, candidate.devices,
                          self.spec.trial.timeout_s, memory_mb)
        self.live[trial.number] = (trial, candidate, estimate, driver_s)
        if self.prunable and "confirm_of" not in trial.user_attrs:  # a re-run is measured whole
            self.watchers[trial.number] = StepWatcher(
                trial, trial_dir, self.spec.train.global_batch_size, self.spec.trial.measure_after)
        self.progress.trial_started(trial.number, candidate)

    def _prune_slow(self, dispatcher) -> int:
        """Stop running trials the pruner finds clearly slow; return the devices freed."""
        freed = 0
        for number, watcher in list(self.watchers.items()):
            if number in self.live and watcher.report():
                dispatcher.cancel(number)
                trial, candidate, estimate, _ = self.live.pop(number)
                del self.watchers[number]
                step, goodput = watcher.last
                detail = (f"goodput {goodput:.4g} after step {step} is below "
                          f"{self.study.pruner.ratio:g}× the best finished trial's; stopped early")
                records.record(self.study, trial, self.objectives, "pruned", detail=detail,
                               extra={"estimate": estimate.as_dict()})
                self._remember(candidate, number, "pruned", detail=detail)
                self.progress.trial_done(number, "pruned", {}, detail)
                freed += candidate.devices
        return freed

    def _tell(self, finished) -> int:
        """Record a finished trial; return the devices it frees."""
        trial, candidate, estimate, driver_s = self.live.pop(finished.number)
        self.watchers.pop(finished.number, None)
        result = finished.result
        if result.outcome == "ok":
            self._calibrate(estimate, result.metrics)
        extra = {"estimate": estimate.as_dict(), "run_s": round(result.run_s, 3),
                 "wall_s": round(finished.wall_s, 3), "queued_s": round(finished.queued_s, 3),
                 "driver_s": round(driver_s, 4), **failures.attrs(result)}
        started = time.perf_counter()
        records.record(self.study, trial, self.objectives, result.outcome, result.metrics,
                       result.detail, extra)
        self.progress.driver_seconds += time.perf_counter() - started + driver_s
        if failures.needs_retry(trial, result):  # not counted: its candidate runs once more
            failures.retry(self.study, trial)
            self.retries += 1
            self.progress.note(failures.retry_note(trial.number, result))
            return candidate.devices
        if failures.remembered(trial, result):
            self._remember(candidate, trial.number, result.outcome, result.metrics,
                           result.detail)
        self.progress.trial_done(trial.number, result.outcome, result.metrics, result.detail,
                                 again_of=trial.user_attrs.get("confirm_of"))
        return candidate.devices

    def _calibrate(self, estimate, metrics: dict) -> None:
        """Fit the per-study correction of the cost model from measured trials."""
        if "peak_memory_mb" not in metrics or "step_time_ms" not in metrics:
            return
        self.pairs.append((estimate, metrics["peak_memory_mb"], metrics["step_time_ms"]))
        self.calibration = costmodel.Calibration.from_pairs(self.pairs)
        self.study.set_user_attr("calibration", self.calibration.as_dict())
