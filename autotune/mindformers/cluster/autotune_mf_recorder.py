"""autotune's recorder in a MindFormers trial: one JSON line per step, the run stopped after the trial.

Run by MindFormers' own interpreter (never imported by autotune; standard library, MindSpore and
MindFormers only). A trial's config lists it under ``callbacks`` with ``auto_register:
autotune_mf_recorder.AutotuneStepRecorder`` and ``run_mindformer.py --register_path`` this folder:
MindFormers' registry imports it (``get_instance_from_cfg`` pops ``auto_register`` for any module
type and ``auto_register`` loads the class from ``REGISTER_PATH``).

Each rank writes, into ``out_dir``:

- ``steps.rank<r>.jsonl``: per step ``step`` (0, 1, …), ``step_time_ms`` (``perf_counter`` from
  the step's begin to its end, the loss read back: ``asnumpy`` waits for the step), ``period_ms``
  (the previous step's end to this one's), ``loss``, ``overflow``, ``loss_scale`` as the training
  cell returns it, ``lr``, ``global_norm``, ``cur_step_num`` (MindFormers' count), ``steps``
  (MindFormers' steps this record spans: more than 1 under sink mode, which a trial runs with
  ``sink_size`` 1), ``ended_at`` (epoch) — read from ``cb_params.net_outputs``, ``(loss,
  overflow, scaling_sens, lr, global_norm)`` of ``MFTrainOneStepCell``, of
  ``MFPipelineWithLossScaleCell`` and of autotune's ``CpuTrainOneStepCell``: the loss as the cell
  returns it, summed over the step's micro-batches under pipeline stages or accumulation
  (autotune divides it as MindFormers' own monitor does: `autotune.mindformers.loss`);
- rank 0 also ``steps.jsonl`` live, in autotune's format (step, step_time_ms, loss, overflow,
  loss_scale), which the study's pruner follows; `autotune.mindformers.results` rewrites it once
  the run is over with every rank's records;
- at the train's end ``metrics.rank<r>.json``: ``started_at`` (the entry's start),
  ``train_begin_at``, ``finished_at`` (epoch seconds), ``peak_rss_mb`` (VmHWM), the records'
  count, ``pid``; with ``device_memory`` (a backend whose devices have memory of their own) the
  readings autotune's trainer takes (`autotune.train.runtime.device.DeviceMemory`): MindSpore's
  pool, MiB — ``device_allocated_mb`` (``max_memory_allocated``), ``device_reserved_mb``
  (``max_memory_reserved``), ``device_reserved_now_mb`` (``memory_reserved``) — and, taken
  right after them, ``device_smi``: the output of ``memory_tool`` (the vendor tool listing each
  process's device memory, ``npu-smi info``; None when it is absent or fails), which autotune
  parses (`autotune.mindformers.results`: the overhead outside the pool).

It stops the run (``run_context.request_stop``) once ``steps`` updates were applied (a step whose
gradients overflowed is skipped and does not count) or after ``cap`` steps, or at the step
``stop_file`` names once it exists (the launcher's stop rule: from step ``stop_from`` on, the
first the rule can end its pilot at, every rank reads it after every step and the ranks agree on
it through one all-reduce of rank 0's reading, so all stop after the same step).
On the train's begin it sets ``AUTOTUNE_MF_TRAINING`` (the entry's verdict: a failure from then
on is no start-up refusal).
"""

import json
import os
import shutil
import subprocess
import time

from mindspore.train import Callback

TRAINING = "AUTOTUNE_MF_TRAINING"
STARTED = "AUTOTUNE_MF_STARTED"
MIB = 2**20
TOOL_TIMEOUT_S = 10


def _value(x):
    """A tensor, array or number as a Python float, bool or None."""
    if x is None or isinstance(x, bool):
        return x
    if hasattr(x, "asnumpy"):
        x = x.asnumpy()
    if hasattr(x, "reshape"):
        x = x.reshape(-1)
        if x.size != 1:
            return None
        x = x[0]
    if hasattr(x, "dtype") and x.dtype.kind == "b":
        return bool(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _vm(field: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class AutotuneStepRecorder(Callback):
    """Records every step and stops the trial (see the module doc)."""

    def __init__(
        self,
        out_dir,
        steps,
        cap,
        stop_file=None,
        stop_from=0,
        device_memory=False,
        memory_tool=(),
        **_,
    ):
        super().__init__()
        from mindformers.tools.utils import get_real_rank

        self.rank = int(get_real_rank() or 0)
        self.out_dir, self.steps, self.cap = out_dir, int(steps), int(cap)
        self.stop_file, self.stop_from = stop_file, int(stop_from)
        self.device_memory, self.memory_tool = bool(device_memory), list(memory_tool or ())
        self.stop_at = None  # the launcher's step to stop after, once agreed
        self.records = self.applied = self.step_num = 0
        self.t0 = self.last_end = None
        self.train_begin_at = None
        os.makedirs(out_dir, exist_ok=True)
        self.file = open(os.path.join(out_dir, f"steps.rank{self.rank}.jsonl"), "w")
        self.live = open(os.path.join(out_dir, "steps.jsonl"), "w") if self.rank == 0 else None

    def on_train_begin(self, run_context):
        os.environ[TRAINING] = "1"
        self.train_begin_at = time.time()

    def on_train_step_begin(self, run_context):
        self.t0 = time.perf_counter()

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        outputs = cb.net_outputs
        if not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        loss, overflow, scale, lr, norm = (list(outputs) + [None] * 5)[:5]
        loss = _value(loss)  # waits for the step
        end = time.perf_counter()
        seconds = end - self.t0
        step_num = int(getattr(cb, "cur_step_num", 0) or 0)
        steps, self.step_num = step_num - self.step_num, step_num
        overflow = bool(_value(overflow)) if overflow is not None else False
        record = {
            "step": self.records,
            "step_time_ms": seconds * 1000.0 / max(1, steps),
            "period_ms": None if self.last_end is None else (end - self.last_end) * 1000.0,
            "loss": loss,
            "overflow": overflow,
            "loss_scale": _value(scale),
            "lr": _value(lr),
            "global_norm": _value(norm),
            "cur_step_num": step_num,
            "steps": max(1, steps),
            "ended_at": time.time(),
        }
        self.last_end = end
        self.records += 1
        self.applied += 0 if overflow else 1
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.live is not None:
            keys = ("step", "step_time_ms", "loss", "overflow", "loss_scale")
            self.live.write(json.dumps({k: record[k] for k in keys}) + "\n")
            self.live.flush()
        if self._stop():
            run_context.request_stop()

    def _stop(self) -> bool:
        if self.applied >= self.steps or self.records >= self.cap:
            return True
        if self.stop_file is None or self.records < self.stop_from:
            return False
        if self.stop_at is None:
            self.stop_at = self._agreed_stop()
        return self.stop_at is not None and self.records >= self.stop_at

    def _agreed_stop(self):
        """The launcher's stop step, the same on every rank: rank 0's reading of the file
        (0: not there yet), carried to the others by one all-reduce."""
        mine = 0.0
        if self.rank == 0:
            try:
                with open(self.stop_file) as f:
                    mine = float(json.load(f)["stop_after"])
            except (OSError, ValueError, KeyError):
                mine = 0.0
        import mindspore as ms
        from mindspore import communication, ops

        agreed = mine
        if communication.get_group_size() > 1:
            agreed = float(ops.AllReduce()(ms.Tensor([mine], ms.float32)).asnumpy()[0])
        return int(agreed) if agreed > 0 else None

    def _tool_output(self):
        """What the vendor tool prints now (None: absent, failed, timed out)."""
        if not self.memory_tool or shutil.which(self.memory_tool[0]) is None:
            return None
        try:
            done = subprocess.run(
                self.memory_tool, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    def _device_memory(self) -> dict:
        """The pool's readings and the tool's, taken together (see the module doc)."""
        import mindspore as ms

        runtime = ms.runtime
        return {
            "device_allocated_mb": runtime.max_memory_allocated() / MIB,
            "device_reserved_mb": runtime.max_memory_reserved() / MIB,
            "device_reserved_now_mb": runtime.memory_reserved() / MIB,
            "device_smi": self._tool_output(),
        }

    def on_train_end(self, run_context):
        started = os.environ.get(STARTED)
        summary = {
            "rank": self.rank,
            "records": self.records,
            "started_at": float(started) if started else None,
            "train_begin_at": self.train_begin_at,
            "finished_at": time.time(),
            "peak_rss_mb": _vm("VmHWM"),
            "pid": os.getpid(),
        }
        if self.device_memory:  # a device's own memory (the launcher's backend says)
            summary.update(self._device_memory())
        self.file.close()
        if self.live is not None:
            self.live.close()
        # read once the run is over (`autotune.mindformers.results`), never while it is written
        with open(os.path.join(self.out_dir, f"metrics.rank{self.rank}.json"), "w") as f:
            json.dump(summary, f)
