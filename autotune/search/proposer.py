"""What to try next: the sampler, de-duplication and feasibility.

Contract: a :class:`Proposer` turns the study's sampler into runnable jobs. :meth:`propose`
asks one trial and returns an `autotune.jobs.Job`: a new candidate that may run, or one
``settled`` by an answer that needs no run — a candidate already tried (answered from memory,
``repeat_of``), one running now in a trial of :attr:`running` (outcome
`autotune.jobs.RUNNING`, answered when that trial ends), or one that breaks a constraint or is
predicted out of memory (``infeasible``, with the reason). It may ask and enqueue; it never
runs anything and never records an outcome: the study's loop hands settled answers and results
to its recorder and tells the proposer what it learnt with :meth:`remember`. Each trial it
asks is claimed by this driver (`autotune.storage.drivers.Drivers.claim`) before anything else
is written to it, its claim, params and knob attrs in one transaction
(`autotune.storage.writes.batched`).

- Feasibility is :func:`autotune.spec.constraints.violations` and the cost model's memory
  screen, with the study's calibration (:attr:`calibration`, kept up to date by the loop) —
  the screen but for what the prior proposes: the prior weighs the memory risk itself — and
  :attr:`cannot_run` (the reason the pool cannot run a candidate: a replay table without it).
- Spaces that end: once the sampler has proposed `autotune.search.untried.STALL` candidates in
  a row that needed no run, untried candidates of the space take turns with it
  (`autotune.search.untried`: drawn in a seeded order, screened as above, each asked as a new
  trial with every param fixed and user attr ``proposed_by: untried``). When no candidate of
  the space is left untried but those the screen rejects — or a grid has run through — the
  space is exhausted: :meth:`propose` returns None and :attr:`exhausted` says so in one line.
- ``search.sampler: auto``: a :class:`~autotune.search.prior.Prior` chooses the candidates
  (each asked as a new trial with its knobs fixed as Optuna's queue fixes them and user attr
  ``proposed_by: prior``, the sampler filling in the knobs the prior leaves to it — none while
  the prior explores a layout: user attr ``exploring``) whenever nothing else is queued, taking
  the objectives it ranks by in turn; the sampler proposes alone once the prior has nothing
  left. Every proposed candidate is marked in the prior, and every ended one with how it
  ended, so it never comes again; the prior reads the measurements (:attr:`measurements`).
- ``--sampler grid``: :meth:`start_grid` queues every candidate not tried yet; each is enqueued
  just before its ask (Optuna scans every waiting trial on each ask).
- :meth:`again` (a confirm-phase re-run, asked as a new trial with the original's params) and
  :meth:`rerun` (a retry queued for a failed trial) ask exactly the trial they are for — never
  merely the oldest waiting one, which may be another job's — and run it as it is: no repeat or
  feasibility check.
"""

from __future__ import annotations

import time
import warnings
from collections import deque

import optuna
from optuna.trial import TrialState

from autotune import costmodel
from autotune.jobs import RUNNING, Job, Result
from autotune.search.prior import layout_of
from autotune.search.untried import Turns, Untried
from autotune.spec.constraints import violations
from autotune.spec.space import SearchSpace
from autotune.storage.writes import batched, create_running


class Proposer:
    """Asks the study's sampler for candidates and screens them (see the module doc)."""

    def __init__(
        self, spec, space: SearchSpace, study, prior=None, measurements=None, drivers=None
    ):
        self.spec, self.space, self.study = spec, space, study
        self.drivers = (
            drivers  # autotune.storage.drivers.Drivers: marks each asked trial as its own
        )
        self.calibration = None
        self.prior = prior
        # (candidate, peak MB, step ms) of the measured trials: the recorder appends to it
        self.measurements = measurements if measurements is not None else []
        self._turn = 0  # several objectives the prior ranks by: they take turns
        # candidate → (number, outcome, metrics, detail) of a finished trial: a repeat is
        # answered from here, without reading storage again
        self.seen: dict = {}
        self.grid: deque = deque()  # (candidate, params) still to try, for --sampler grid
        # candidate → number of a trial running now (any driver's; kept by the search loop
        # when several drivers share the study)
        self.running: dict = {}
        self.cannot_run = None  # candidate → why the pool cannot run it ("": it can), or None
        self.untried = Untried(space, spec.search.seed)
        self.turns = Turns()
        self.gridded = False  # --sampler grid: the space ends with the grid
        self.exhausted = ""  # why propose returned None: the space is exhausted

    def remember(self, candidate, number: int, outcome: str, metrics=None, detail="") -> None:
        """``candidate`` ended so: a later proposal of it (the same run: `Candidate.canonical`)
        is answered with this."""
        candidate = candidate.canonical()
        self.seen[candidate] = (number, outcome, metrics or {}, detail)
        if self.prior is not None:
            self.prior.mark(candidate, outcome)

    def start_grid(self) -> int:
        """Queue every candidate of the space not tried yet, the baseline first (so the study
        has the ratio every gain is printed against); returns how many of them the screen lets
        run now (the runs the grid will count)."""
        baseline = self.space.baseline()
        todo = sorted(
            (c for c in self.space.candidates() if c not in self.seen), key=lambda c: c != baseline
        )  # stable: the space's order otherwise
        self.grid = deque((c, self.space.params_of(c)) for c in todo)
        self.gridded = True
        return sum(not self.verdict(c)[1] for c in todo)

    def verdict(self, candidate, memory: bool = True) -> tuple:
        """(estimate, reason): the reason is empty when the candidate may run. Without
        ``memory`` the memory screen is left out (the prior weighed the risk itself)."""
        reasons = violations(self.spec, candidate)
        estimate = costmodel.estimate(self.spec, candidate, self.calibration)
        infeasible = reasons or not estimate.feasible and (memory or not estimate.breakdown)
        if infeasible:
            return estimate, "; ".join(reasons) or estimate.reason
        return estimate, self.cannot_run(candidate) if self.cannot_run is not None else ""

    def _ask(self, match=None, fixed=None, fresh=False):
        """Ask a trial: Optuna's next (the oldest waiting, else a new one; ``fresh``: the caller
        knows none waits, so a new one without reading the queue); with ``match`` the oldest
        waiting trial it accepts (LookupError when none waits); with ``fixed`` = (params, user
        attrs) a new one with those params fixed (:meth:`_new`) and those attrs."""
        with warnings.catch_warnings():  # autotune's driver beats for its asked trials itself
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
            if fixed is not None:
                whole = self._whole(*fixed)
                if whole is not None:
                    return whole
                trial = self._new(fixed[0])
            elif fresh:  # what study.ask does when nothing waits
                self.study._thread_local.cached_all_trials = None
                trial_id = self.study._storage.create_new_trial(self.study._study_id)
                trial = optuna.Trial(self.study, trial_id)
            else:
                trial = self.study.ask() if match is None else self._pop(match)
        # its driver, role, params and knob attrs: one transaction, not twenty
        with batched(trial):
            if self.drivers is not None:
                self.drivers.claim(trial)
            for name, value in (fixed[1] if fixed is not None else {}).items():
                trial.set_user_attr(name, value)
            candidate, attrs = self.space.sample(trial)
            for name, value in attrs.items():
                trial.set_user_attr(name, value)
        return trial, candidate

    def _new(self, params: dict) -> optuna.Trial:
        """What ``study.enqueue_trial(params)`` and the ``study.ask()`` that pops it do, in one
        write instead of two and no read of the queue: a RUNNING trial whose params are fixed
        as Optuna's queue fixes them (system attr ``fixed_params``)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, system_attrs={"fixed_params": params}
        )
        self.study._thread_local.cached_all_trials = None  # as ask: the sampler reads afresh
        trial_id = self.study._storage.create_new_trial(self.study._study_id, template)
        return optuna.Trial(self.study, trial_id)

    def _whole(self, params: dict, user_attrs: dict):
        """(trial, candidate) of a new trial whose every param ``params`` fixes, created with
        its params, its driver's mark, ``user_attrs`` and its knob attrs in the one write that
        creates it (what :meth:`_ask` writes in two); None when some param is left to the
        sampler."""
        try:
            candidate, attrs = self.space.sample(optuna.trial.FixedTrial(params))
        except ValueError:  # a param the sampler fills in
            return None
        mark = self.drivers.mark() if self.drivers is not None else {}
        distributions = self.space.distributions()
        self.study._thread_local.cached_all_trials = None  # as ask: the sampler reads afresh
        trial_id = create_running(
            self.study,
            params,
            {name: distributions[name] for name in params},
            {**mark, **user_attrs, **attrs},
        )
        trial = optuna.Trial(self.study, trial_id)
        if self.drivers is not None:
            self.drivers.beat(trial)
        return trial, candidate

    def _pop(self, match) -> optuna.Trial:
        """What ``study.ask`` does with its queue, for the waiting trial ``match`` accepts."""
        storage = self.study._storage
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            try:
                if match(frozen) and storage.set_trial_state_values(
                    frozen._trial_id, TrialState.RUNNING
                ):
                    return optuna.Trial(self.study, frozen._trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # withdrawn meanwhile
        raise LookupError("no such trial waits in the queue")

    def propose(self, trials=None) -> Job | None:
        """Ask one candidate; settle it at once when it needs no run (see the module doc);
        None when the space is exhausted. ``trials``: the study's trials (or just its
        unfinished ones) as the caller just read them (frozen), so they are not read again."""
        started = time.perf_counter()
        queued = bool(self.grid)
        if self.grid:
            candidate, params = self.grid.popleft()
            baseline = candidate == self.space.baseline()
            self.study.enqueue_trial(params, user_attrs={"baseline": True} if baseline else None)
        # what is queued (the baseline, a retry, a re-run) runs first
        queued = queued or self._queued_any(trials)
        fixed = self._from_prior() if not queued and self.prior is not None else None
        by_prior = fixed is not None
        sampled = not queued and not by_prior  # the sampler's own proposal, unless untried
        if sampled and (self.gridded or self.exhausted or self.turns.untried_due()):
            fixed, sampled = self._from_untried(), False
            if fixed is None:
                return None
        trial, candidate = self._ask(fixed=fixed, fresh=not queued)
        job = self._screen(trial, candidate, started, memory=not by_prior)
        if sampled:
            self.turns.sampler_proposed(runs=job.settled is None)
        return job

    def _screen(self, trial, candidate, started: float, memory: bool) -> Job:
        """The job of ``trial``, asked for ``candidate``: settled when it needs no run."""
        if self.prior is not None:
            self.prior.mark(candidate)
        if candidate in self.seen:
            number, outcome, metrics, detail = self.seen[candidate]
            return Job(trial, candidate, settled=Result(outcome, metrics, detail, repeat_of=number))
        if candidate in self.running:  # its outcome is known once that trial ends
            return Job(trial, candidate, settled=Result(RUNNING, repeat_of=self.running[candidate]))
        estimate, reason = self.verdict(candidate, memory=memory)
        driver_s = time.perf_counter() - started
        if reason:
            return Job(trial, candidate, estimate, driver_s, Result("infeasible", detail=reason))
        return Job(trial, candidate, estimate, driver_s)

    def _from_untried(self) -> tuple | None:
        """(params, user attrs) of the next untried candidate of the space (all params fixed);
        None — and :attr:`exhausted` says so — when every candidate ran or is rejected (a grid:
        when it ran through)."""
        candidate = None
        if not self.gridded:
            self.turns.took_untried()
            candidate = self.untried.next(
                lambda c: c in self.seen or c in self.running,
                lambda c: self.verdict(c)[1],
                self.calibration,
            )
        if candidate is not None:  # (a screen that changed may open a rejected one again)
            self.exhausted = ""
            return self.space.params_of(candidate), {"proposed_by": "untried"}
        ran = sum(outcome != "infeasible" for _, outcome, *_ in self.seen.values())
        rejected = len(self.seen) - ran + self.untried.rejected
        self.exhausted = (
            f"the space is exhausted: every candidate has run or is infeasible ({ran} ran"
            + (f", {len(self.running)} running" if self.running else "")
            + f", {rejected} infeasible): stopping"
        )
        return None

    def _queued_any(self, trials) -> bool:
        """Whether a trial waits in the study's queue (``trials``: as just read, or None)."""
        if trials is None:
            return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return any(t.state == TrialState.WAITING for t in trials)

    def _from_prior(self) -> tuple | None:
        """(params, user attrs) of the prior's next candidate, by the objective whose turn it
        is; None when the prior has nothing left (then the sampler proposes). A layout being
        explored has every param fixed (user attr ``exploring``: its layout)."""
        objective = self.prior.objectives[self._turn % len(self.prior.objectives)]
        self._turn += 1
        chosen = self.prior.next(self.measurements, objective, pending=list(self.running))
        if chosen is None:
            return None
        candidate, fixed = chosen
        attrs = {"proposed_by": "prior"}
        if fixed:
            attrs["exploring"] = "dp{}·tp{}·pp{}·m{}".format(*layout_of(candidate))
        return self.prior.params(candidate, fixed), attrs

    def _run_as_is(self, **how) -> Job:
        """Ask a trial as :meth:`_ask` does with ``how`` and run it as it is (no repeat or
        feasibility check)."""
        started = time.perf_counter()
        trial, candidate = self._ask(**how)
        estimate, _ = self.verdict(candidate)
        return Job(trial, candidate, estimate, time.perf_counter() - started)

    def again(self, original) -> Job:
        """A new trial with ``original``'s params, user attr ``confirm_of`` = its number."""
        return self._run_as_is(fixed=(original.params, {"confirm_of": original.number}))

    def rerun(self, failed: int) -> Job:
        """The retry queued for trial ``failed`` (user attr ``retry_of``)."""
        return self._run_as_is(match=lambda t: t.user_attrs.get("retry_of") == failed)
