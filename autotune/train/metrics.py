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
- ``throughput``: measured steps × samples_per_step / measured time (samples/s).
- ``goodput``: the same counting only measured steps whose update was applied (an
  overflow-skipped step costs its time and contributes no samples).
- ``overflow_steps`` / ``applied_steps``: steps skipped by the loss scaler / applied, over all
  steps.
- ``loss_first``: loss of step 0 (before any update); ``loss_last``: mean loss of the last
  `LAST_WINDOW` steps (fewer if the trial is shorter).
- ``diverged``: any non-finite loss, or loss_last > loss_first.
- ``compile_s``: process start → first step done (imports, communication init, compile).
- ``peak_memory_mb``: peak resident memory (VmHWM) of one process = one CPU "device", max over
  ranks; ``final_loss_scale``: the scaler's value after the last step.
"""

import json
import math
import os
import statistics
import time

LAST_WINDOW = 5

METRIC_KEYS = ("goodput", "throughput", "step_time_ms", "peak_memory_mb", "overflow_steps", "loss_first",
               "loss_last", "diverged", "compile_s", "steps", "samples_per_step", "applied_steps",
               "final_loss_scale")


def process_start_time() -> float:
    """Wall-clock time (epoch s) this process started, from /proc; now if /proc is unavailable."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


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


def write_json_atomic(path, payload) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


class StepLog:
    """Collects per-step records; appends each to ``steps.jsonl`` when ``path`` is given (a
    resumed run adds to the file, ``append``)."""

    def __init__(self, path, measure_after, samples_per_step, append=False):
        self.measure_after, self.samples_per_step = measure_after, samples_per_step
        self.records = []
        self._file = open(path, "a" if append else "w") if path else None

    def add(self, step, seconds, loss, overflow, loss_scale):
        record = {"step": step, "step_time_ms": seconds * 1000.0, "loss": loss, "overflow": overflow,
                  "loss_scale": loss_scale}
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self):
        if self._file:
            self._file.close()

    def summary(self, compile_s, peak_mb, final_loss_scale) -> dict:
        """The metrics dict (`METRIC_KEYS`) of the steps recorded so far."""
        # a resumed run may record fewer steps than measure_after: time at least its last one
        measured = self.records[min(self.measure_after, len(self.records) - 1):]
        seconds = sum(r["step_time_ms"] for r in measured) / 1000.0
        applied_measured = sum(not r["overflow"] for r in measured)
        losses = [r["loss"] for r in self.records]
        loss_first = losses[0]
        tail = losses[-LAST_WINDOW:]
        loss_last = sum(tail) / len(tail)
        overflow_steps = sum(r["overflow"] for r in self.records)
        finite = all(math.isfinite(x) for x in losses)
        return {
            "goodput": applied_measured * self.samples_per_step / seconds,
            "throughput": len(measured) * self.samples_per_step / seconds,
            "step_time_ms": statistics.median(r["step_time_ms"] for r in measured),
            "peak_memory_mb": peak_mb,
            "overflow_steps": overflow_steps,
            "loss_first": loss_first,
            "loss_last": loss_last,
            "diverged": (not finite) or loss_last > loss_first,
            "compile_s": compile_s,
            "steps": len(self.records),
            "samples_per_step": self.samples_per_step,
            "applied_steps": len(self.records) - overflow_steps,
            "final_loss_scale": final_loss_scale,
        }
