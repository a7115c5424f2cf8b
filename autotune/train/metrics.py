"""Per-step records and the trial's metrics (pure Python: no MindSpore).

``steps.jsonl`` gets one flushed line per optimizer step as it completes, so the driver can
follow progress and prune early: ``{"step", "step_time_ms", "loss", "overflow", "loss_scale"}``
where ``loss`` is the global-batch mean loss and ``loss_scale`` the scale the step used. A
non-finite loss is written as ``NaN``/``Infinity``, which Python's json reads back.

``metrics.json`` (written atomically, so a reader never sees half a file) has exactly
`METRIC_KEYS`:

- ``steps``: optimizer steps run; ``samples_per_step``: the global batch size (one step =
  grad_accum micro-steps on each of dp ranks).
- ``step_time_ms``: median wall time of the measured steps (steps ``measure_after`` … end).
- ``step_time_ci``: how precisely the trial knows its mean step time — the relative 95%
  half-width of its estimate of the mean over the n measured steps' times (every measured step,
  applied or skipped: the steps ``throughput`` divides by), Student-t with n − 1 degrees of
  freedom: ``t(0.975, n − 1) · s / √n / mean`` with ``s`` their sample standard deviation
  (`autotune.train.intervals.step_time_ci`); None below two measured steps. Under the stop rule's estimate
  (:class:`StepLog`, below) ``√n`` becomes ``1 / √(w²/m + (1 − w)²/(n − m))``. ``goodput`` is
  proportional to 1 / the mean step time, so its own relative half-width is this to first order.
  ``steps.jsonl`` holds rank 0's times, and so does the interval.
- ``throughput``: samples_per_step / the mean measured step time (samples/s), every measured
  step counted, applied or skipped; under the stop rule, / its estimate (:class:`StepLog`).
- ``backoff_steps`` (k): the loss scaler's initial back-off, the run of overflowed steps from the
  first recorded step up to the first applied one. A start above what the gradients allow halves
  the scale once per such step; the full run pays them once.
- ``overflow_rate`` (r): overflowed / all among the measured steps after the back-off (steps
  max(``measure_after``, k) … end). A trial in which no update was ever applied has no settled
  scale: r = 1.
- ``underflow_share`` (u): the share of gradient elements that are exactly zero in the float16
  backward at the scale the run settled at (the final scale) but non-zero in a float32 backward of
  the same micro-batches, measured once, after the last step, by `autotune.train.step.probe` — or,
  where its rule skips the probe, the bound z (u ≤ z ≤ `autotune.train.step.probe.SKIP_BELOW`). 0
  when the compute dtype is not float16 (nothing underflows that a scale could save).
- ``underflow_bound`` (z): the last step's share of float16 gradient elements exactly zero that
  are not structurally zero (1: no bound), which decides whether the probe runs;
  ``underflow_probed``: whether it ran. 0 and false without float16. ``underflow_note``: None,
  or why the probe the rule called for did not measure u — flash attention (the bound stands:
  u = z), out of memory in the probe or the trial stopped while it probed (`PROBE_UNFINISHED`
  until the probe ends): then ``underflow_share`` is None and goodput takes z for u.
- ``goodput``: samples per second the full run will see, the default objective:
  ``throughput × (1 − r) × (1 − k / train.total_steps) × (1 − u)``. A skipped step costs its time
  and adds no samples, but the initial back-off is charged once over the run, not once per trial;
  a scale small enough to flush gradients to zero is charged by the share it loses.
- ``overflow_steps`` / ``applied_steps``: steps skipped by the loss scaler / applied, over all
  steps.
- ``loss_first``: loss of step 0 (before any update); ``loss_last``: mean loss of the last
  `LAST_WINDOW` steps (fewer if the trial is shorter).
- ``diverged``: any non-finite loss, or a rising loss over the measured steps (`rising`): a
  least-squares slope with a t-statistic above `TREND_T` whose fitted rise over the window is more
  than `TREND_RISE` of its fitted start. Noise is judged by the fit's own residuals, so a tiny batch
  whose step-0 loss happened to be low does not trip it.
- Where the trial's time went, in seconds (the runner adds ``launch_s`` and ``teardown_s``, the
  parts only it sees, from ``started_at`` and ``finished_at``: `autotune.execution.launch_time`):
  ``init_s`` the trial's start → its network, optimizer and step cells built (in a process of
  its own: imports, cluster join and communication init included; in a worker that stays up,
  `autotune.train.runtime.serve`, from when it took the trial); ``first_step_s`` → the first step done
  (its compile included); ``compile_s`` = ``init_s`` + ``first_step_s``, the time to the first
  step; ``excluded_steps_s`` the other steps before ``measure_after`` (timed as steps are);
  ``steps_s`` the measured steps (what ``throughput`` divides by); ``probe_s`` the underflow
  probe's wall time; ``started_at`` / ``finished_at`` the epoch seconds when the trial started
  and when its outputs were written (rank 0).
- ``router_imbalance``: how unevenly a mixture of experts' routers load their experts — per MoE
  layer and measured step, the tokens routed to the busiest expert over the mean per expert (1:
  even; E / k at worst, every token to the same k experts), averaged over layers and measured
  steps (:func:`router_imbalance`); None for a model without experts. The tokens are the whole
  global batch's: every rank's counts summed (under tensor parallelism each rank counts its
  block of the tokens split over the tp group: `autotune.train.models.moe`). The cost model
  prices the router's imbalance by a stated factor (docs/costmodel.md); this is what the
  trainer measured.
- ``measurement``: the version of these rules (`MEASUREMENT`) that measured the numbers.
- ``peak_memory_mb``: the peak memory of one device, max over ranks, read before the underflow
  probe: on CPU the resident memory (VmHWM, :func:`peak_memory_mb`) of one process = one CPU
  "device"; on GPU/Ascend the trial's own (`autotune.train.runtime.device.DeviceMemory`: its tensors at
  their peak beyond what was allocated before it, plus what the device holds outside MindSpore's
  pool, measured once per process), never host RSS, which says nothing about device memory;
  ``final_loss_scale``: the scaler's value after the last step.
"""

import json
import math
import statistics

from autotune.train.intervals import CONFIDENCE, mean_step_time, step_time_ci, student_t_quantile

LAST_WINDOW = 5
TREND_T = 3.0  # the slope's t-statistic above which a rise is not noise
TREND_RISE = 0.05  # ... and the fitted rise over the window, relative to the fitted start
TREND_MIN_STEPS = 4  # fewer measured steps: no trend is judged (only a non-finite loss diverges)

METRIC_KEYS = (
    "goodput",
    "throughput",
    "step_time_ms",
    "peak_memory_mb",
    "overflow_steps",
    "loss_first",
    "loss_last",
    "diverged",
    "compile_s",
    "steps",
    "samples_per_step",
    "applied_steps",
    "final_loss_scale",
    "backoff_steps",
    "overflow_rate",
    "underflow_share",
    "underflow_bound",
    "underflow_probed",
    "underflow_note",
    "init_s",
    "first_step_s",
    "excluded_steps_s",
    "steps_s",
    "probe_s",
    "started_at",
    "finished_at",
    "step_time_ci",
    "router_imbalance",
    "measurement",
)
# metrics.json's underflow_note while the probe runs (`autotune.train.program`)
PROBE_UNFINISHED = "the underflow probe did not finish"
# The rules a trial's numbers are measured by, recorded with them (``measurement``). 2 (issue 28):
# a warm pool's trials are of one size (peak memory and the budget are the trial's own), the stop
# rule's estimate (pilot and block), the graph key over the whole package, the timeout from the
# candidate's start, the underflow probe's recompute and memory. Trials recorded without it were
# measured by the rules before (1); a study resumed with them says so (`autotune.study.opening`).
MEASUREMENT = 2


def reset_peak_memory() -> None:
    """Restart VmHWM from the current RSS (writing 5 to clear_refs), so imports don't count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not permitted: the peak then includes start-up


def peak_memory_mb() -> float:
    """Peak resident set size of this process in MiB (VmHWM); 0.0 where /proc is unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def resident_mb() -> float:
    """Resident set size of this process now, MiB (VmRSS); 0.0 where /proc is unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def rising(losses) -> bool:
    """Whether ``losses`` (one per step, finite) trend upwards beyond noise: the least-squares
    slope over the steps has a t-statistic above `TREND_T` and the fitted line rises by more than
    `TREND_RISE` × its fitted start. False for fewer than `TREND_MIN_STEPS` losses."""
    n = len(losses)
    if n < TREND_MIN_STEPS:
        return False
    mean_x, mean_y = (n - 1) / 2.0, sum(losses) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(losses)) / sxx
    if slope <= 0:
        return False
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in enumerate(losses))
    stderr = math.sqrt(residual / (n - 2) / sxx)
    significant = stderr == 0 or slope / stderr > TREND_T
    start = mean_y - slope * mean_x
    return significant and slope * (n - 1) > TREND_RISE * abs(start)


def router_imbalance(loads) -> float | None:
    """The mean over steps and MoE layers of max / mean tokens per expert: ``loads[step][layer]``
    the tokens routed to each expert in that step (a layer with none routed — a dense layer —
    is left out); None when no layer routed any."""
    ratios = [
        max(counts) * len(counts) / sum(counts)
        for step in loads
        for counts in step
        if sum(counts) > 0
    ]
    return sum(ratios) / len(ratios) if ratios else None


def backoff_steps(overflows) -> int:
    """The leading run of overflowed steps: the scaler's initial back-off."""
    k = 0
    while k < len(overflows) and overflows[k]:
        k += 1
    return k


class StepLog:
    """Collects per-step records; appends each to ``steps.jsonl`` when ``path`` is given (a
    resumed run adds to the file, ``append``). ``total_steps``: the full run's length
    (``train.total_steps``), over which the initial back-off is charged.

    The stop rule (``pilot_steps`` = ``trial.min_steps``; `autotune.train.program` runs it):
    the *pilot* is the measured steps up to the one at which ``pilot_steps`` of them came after
    the loss scaler's initial back-off (:meth:`pilot_ended`, the same step on every rank: a
    count of steps and overflows). There :meth:`plan` fixes the pilot's weight in the estimate,
    ``w = m / (m + steps left)`` (m the pilot's steps; counts only, before any later step is
    seen), and from the pilot's spread alone the *block* of steps after it that the estimate
    ``w · mean(pilot) + (1 − w) · mean(block)`` needs for its 95 % half-width to be within the
    precision (Stein's two-stage rule: the pilot's t quantile and standard deviation), at least
    half the pilot, at most the steps left. Both means are unbiased whatever the block's length
    (it depends on the pilot only; the block's steps are fresh), and so is the estimate: a
    trial that has not met a slow step yet no longer stops early on it. Stopping at the first
    step whose interval was narrow enough — the rule before — read steps of N(100, 3) ms with 6 %
    spikes at 300 ms 2.8-3.7 % fast (tests/stopping/test_precision.py; benchmarks/records/stop_rule.py). A
    trial whose block runs to its end weighs each measured step alike — its plain mean — unless
    steps that overflow after the pilot lengthen it (the weights stay as fixed).
    """

    def __init__(
        self, path, measure_after, samples_per_step, total_steps, append=False, pilot_steps=None
    ):
        self.measure_after, self.samples_per_step, self.total_steps = (
            measure_after,
            samples_per_step,
            total_steps,
        )
        self.pilot_steps = pilot_steps
        self.pilot_end = None  # the index of the first step after the pilot, once it ended
        self.weight = None  # the pilot's weight in the estimate, once planned
        self.records = []
        self._file = open(path, "a" if append else "w") if path else None

    def add(self, step, seconds, loss, overflow, loss_scale):
        record = {
            "step": step,
            "step_time_ms": seconds * 1000.0,
            "loss": loss,
            "overflow": overflow,
            "loss_scale": loss_scale,
        }
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self.pilot_steps and self.pilot_end is None and self.settled_steps() >= self.pilot_steps:
            self.pilot_end = len(self.records)

    def close(self):
        if self._file:
            self._file.close()

    def settled_steps(self) -> int:
        """Measured steps after the loss scaler's initial back-off (the steps the overflow rate
        is taken over): a count of steps and overflows, so the same on every rank."""
        start = max(self.measure_after, backoff_steps([r["overflow"] for r in self.records]))
        return max(0, len(self.records) - start)

    def pilot_ended(self) -> bool:
        """Whether the step just added ended the pilot (see the class doc)."""
        return self.pilot_end is not None and self.pilot_end == len(self.records)

    def plan(self, precision: float, steps_left: int) -> int:
        """At the pilot's end, with at most ``steps_left`` steps to come: fix the pilot's weight
        (every rank alike) and return how many steps the block needs by this rank's pilot times
        (see the class doc; rank 0's decides)."""
        pilot = [r["step_time_ms"] for r in self.records[self.measure_after : self.pilot_end]]
        m = len(pilot)
        self.weight = m / (m + steps_left)
        if steps_left == 0:
            return 0
        mean, spread = statistics.fmean(pilot), statistics.stdev(pilot)
        t = student_t_quantile(0.5 + CONFIDENCE / 2.0, m - 1)
        room = (precision * mean / t) ** 2 - (self.weight * spread) ** 2 / m  # left for the block
        if room <= 0:
            return steps_left
        need = math.ceil(((1.0 - self.weight) * spread) ** 2 / room)
        return min(steps_left, max(math.ceil(self.pilot_steps / 2), need))

    def first_measured(self) -> int:
        """The index of the first measured record: ``measure_after``, or the last record of a
        run (a resumed one) that recorded fewer steps — time at least that one."""
        return min(self.measure_after, len(self.records) - 1)

    def summary(
        self,
        timing: dict,
        peak_mb,
        final_loss_scale,
        underflow_share=0.0,
        underflow_bound=0.0,
        underflow_probed=False,
        underflow_note=None,
        router_imbalance=None,
    ) -> dict:
        """The metrics dict (`METRIC_KEYS`) of the steps recorded so far; the underflow metrics
        are `autotune.train.step.probe.measure`'s, 0 and false without float16;
        ``router_imbalance`` :func:`router_imbalance`'s (None without experts). ``timing``:
        ``started_at``, ``init_s``, ``first_step_s``, ``probe_s`` as the program measured them
        (``finished_at`` is set by the caller once the outputs are written)."""
        first = self.first_measured()
        measured = self.records[first:]
        times = [r["step_time_ms"] for r in measured]
        seconds = sum(times) / 1000.0
        # the stop rule's estimate once it planned and the block has begun (class doc)
        pilot = self.pilot_end - first if self.weight is not None else None
        throughput = self.samples_per_step / (mean_step_time(times, pilot, self.weight) / 1000.0)
        overflows = [r["overflow"] for r in self.records]
        k = backoff_steps(overflows)
        settled = overflows[max(first, k) :]  # the measured steps after the back-off
        rate = sum(settled) / len(settled) if settled else 1.0
        once = min(1.0, k / self.total_steps)
        losses = [r["loss"] for r in self.records]
        loss_first = losses[0]
        tail = losses[-LAST_WINDOW:]
        loss_last = sum(tail) / len(tail)
        overflow_steps = sum(overflows)
        finite = all(math.isfinite(x) for x in losses)
        return {
            # an unmeasured share (underflow_note): the bound, which it cannot exceed
            "goodput": throughput
            * (1.0 - rate)
            * (1.0 - once)
            * (1.0 - (underflow_bound if underflow_share is None else underflow_share)),
            "throughput": throughput,
            "step_time_ms": statistics.median(r["step_time_ms"] for r in measured),
            "peak_memory_mb": peak_mb,
            "overflow_steps": overflow_steps,
            "loss_first": loss_first,
            "loss_last": loss_last,
            "diverged": (not finite) or rising(losses[first:]),
            "compile_s": timing["init_s"] + timing["first_step_s"],
            "steps": len(self.records),
            "samples_per_step": self.samples_per_step,
            "applied_steps": len(self.records) - overflow_steps,
            "final_loss_scale": final_loss_scale,
            "backoff_steps": k,
            "overflow_rate": rate,
            "underflow_share": underflow_share,
            "underflow_bound": underflow_bound,
            "underflow_probed": underflow_probed,
            "underflow_note": underflow_note,
            "init_s": timing["init_s"],
            "first_step_s": timing["first_step_s"],
            "excluded_steps_s": sum(r["step_time_ms"] for r in self.records[1:first]) / 1000.0,
            "steps_s": seconds,
            "probe_s": timing["probe_s"],
            "started_at": timing["started_at"],
            "finished_at": None,
            "step_time_ci": step_time_ci(times, pilot, self.weight),
            "router_imbalance": router_imbalance,
            "measurement": MEASUREMENT,
        }
