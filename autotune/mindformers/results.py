"""A MindFormers trial's measurements read back: the recorder's files → autotune's metrics.

Contract: the recorder (`autotune.mindformers.CLUSTER_DIR`, ``autotune_mf_recorder.py``) leaves
``steps.rank<r>.jsonl`` and ``metrics.rank<r>.json`` per rank in the trial folder;
:func:`write_metrics` turns them into the files autotune's own trainer writes — ``steps.jsonl``
and ``metrics.json`` with exactly `autotune.train.metrics.METRIC_KEYS`, through the same
`autotune.train.metrics.StepLog` — so a MindFormers trial is read (`autotune.execution.classify`),
stored and compared as any:

- per step: rank 0's step time; the loss of the global batch as MindFormers' own monitor
  computes it (`autotune.mindformers.loss`): the cell's output of the rank MindFormers names
  (``loss_rank`` of the trial's ``mindformers`` section; the mean over the ranks under data
  parallelism, each rank's loss its shard's) divided by ``loss_divisor`` (the cell sums its
  micro-batches); the overflow flag (the training step agrees it over the ranks); the loss
  scale the step used: the training cell returns its scale after the step's update
  (measured: docs/mindformers.md), so step n used step n − 1's, and step 0 the initial scale;
- the time split: ``started_at`` the entry's start on rank 0, ``init_s`` → the train's begin
  (imports, context, communication, model, optimizer, data), ``first_step_s`` → the first
  step's end (its compile included), ``finished_at`` the train's end; ``probe_s`` 0;
- ``peak_memory_mb``: the largest over the ranks of the trial's memory on its device (a backend
  whose devices have memory of their own) by autotune's trainer's formula
  (`autotune.train.runtime.device_memory.trial_peak_mb`): the tensors' allocated peak plus what the
  device holds outside MindSpore's pool — the vendor tool's reading the recorder took (its
  output, parsed here: `autotune.train.runtime.device_smi`) less the pool's reserved size then;
  else the process's resident peak (VmHWM);
- the underflow probe is autotune's trainer's: ``underflow_share`` and ``underflow_bound`` are
  None for a float16 run, with the note :data:`NO_PROBE` (goodput takes no underflow charge), 0
  otherwise.

None is written unless rank 0 ended its train (``metrics.rank0.json``): the run did not finish.
Every rank's files must be in the trial folder (the loss rank's for the loss, all of them for
the peak and a data-parallel mean): a trial spanning nodes whose folder the nodes do not share
leaves another node's ranks on that node, and :func:`write_metrics` raises
:class:`MissingRanks`, one line naming the ranks and the remedy — never another stage's loss.
:class:`StopPlan` is the stop rule of autotune's trainer for a running MindFormers trial: it
follows rank 0's live ``steps.jsonl`` and, at the pilot's end, writes the step to stop after
(``stop.json``) for the recorder, which carries it to every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.files import write_json
from autotune.mindformers.trial import SECTION, STOP_FILE
from autotune.spec.backends import Backend, backend_of
from autotune.train.config import UPDATE_CAP
from autotune.train.metrics import StepLog
from autotune.train.runtime.device_memory import overhead_mb, trial_peak_mb
from autotune.train.runtime.device_smi import PARSERS

NO_PROBE = (
    "not measured: the underflow probe is autotune's trainer's, a MindFormers trial has none "
    "(goodput takes no underflow charge)"
)


def _records(path: Path) -> list[dict]:
    lines = path.read_text().splitlines() if path.exists() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut short by a killed run
            break
    return records


def read_ranks(trial_dir: Path) -> tuple[dict, dict]:
    """``({rank: records}, {rank: summary})`` the recorder left in ``trial_dir``."""
    records, summaries = {}, {}
    for path in trial_dir.glob("steps.rank*.jsonl"):
        records[int(path.stem.removeprefix("steps.rank"))] = _records(path)
    for path in trial_dir.glob("metrics.rank*.json"):
        summaries[int(path.stem.removeprefix("metrics.rank"))] = json.loads(path.read_text())
    return records, summaries


class MissingRanks(Exception):
    """Some rank's files are not in the trial folder (see the module doc)."""


def global_losses(records: dict, rank: int | None, divisor: int) -> list[float]:
    """Per step, the global batch's loss (see the module doc); ``records``: rank → records,
    ``rank``: the rank whose loss it is (None: the mean of all), ``divisor``: what MindFormers
    divides the cell's output by."""
    steps = min(len(r) for r in records.values())
    ranks = list(records.values()) if rank is None else [records[rank]]
    return [sum(r[i]["loss"] for r in ranks) / len(ranks) / divisor for i in range(steps)]


def device_peak_mb(summary: dict, backend: Backend) -> float:
    """One rank's memory on its device from its recorder summary (see the module doc)."""
    text, smi = summary.get("device_smi"), None
    if text is not None and backend.memory_tool_format:
        smi = PARSERS[backend.memory_tool_format](text, summary["pid"])
    outside = overhead_mb(smi, summary["device_reserved_now_mb"])
    return trial_peak_mb(summary["device_allocated_mb"], outside)


def _missing(trial_dir: Path, mf: dict, records: dict, summaries: dict) -> str | None:
    """One line naming the ranks whose files are not in ``trial_dir``, None when all are."""
    absent = [r for r in range(mf["ranks"]) if r not in summaries or not records.get(r)]
    if not absent:
        return None
    loss_rank = mf["loss_rank"]
    named = (
        f"rank {loss_rank}, whose loss MindFormers reports (the last pipeline stage's, or rank "
        "0's under zero_bubble_v), is among them"
        if loss_rank in absent
        else "the peak memory and the loss need every rank's"
    )
    return (
        f"the recorder's files of rank(s) {', '.join(map(str, absent))} of {mf['ranks']} are "
        f"not in {trial_dir}: {named}; a trial spanning nodes needs a trial folder its nodes "
        "share (--artifacts on a shared filesystem: docs/cluster.md)"
    )


def scales_used(records: list[dict], initial: float) -> list[float]:
    """The scale each step used: the one the cell returned after the step before."""
    returned = [r["loss_scale"] for r in records]
    return [initial, *returned[:-1]][: len(returned)]


def _step_log(config: dict, path: Path | None) -> StepLog:
    trial, train = config["trial"], config["train"]
    return StepLog(
        path,
        trial["measure_after"],
        train["global_batch_size"],
        train["total_steps"],
        pilot_steps=trial.get("min_steps"),
    )


def steps_left(config: dict, records: list[dict]) -> int:
    """At most how many steps a trial with ``records`` so far has to run (if none of them
    overflows): autotune's trainer's rule, ``trial.steps`` applied updates within
    ``UPDATE_CAP`` × ``trial.steps`` steps."""
    steps = config["trial"]["steps"]
    applied = sum(not r["overflow"] for r in records)
    return min(UPDATE_CAP * steps - len(records), steps - applied)


class StopPlan:
    """The trainer's stop rule (`autotune.train.metrics.StepLog`, ``plan``) over a running
    MindFormers trial's live ``steps.jsonl``: :meth:`poll` reads the steps rank 0 added and, once
    its pilot ended, writes ``{"stop_after": steps}`` to ``stop.json`` when the plan stops before
    the trial's end (:meth:`poll` then does nothing more)."""

    def __init__(self, config: dict, trial_dir: Path):
        self.config, self.trial_dir = config, trial_dir
        self.precision = config["trial"].get("precision")
        self.log = _step_log(config, None)
        self.read = 0
        self.done = self.precision is None

    def poll(self) -> None:
        if self.done:
            return
        records = _records(self.trial_dir / "steps.jsonl")
        for r in records[self.read :]:
            self.log.add(r["step"], r["step_time_ms"] / 1000.0, r["loss"], r["overflow"], 0.0)
            self.read += 1
            left = steps_left(self.config, self.log.records)
            if self.log.pilot_ended() and left > 0:
                block = self.log.plan(self.precision, left)
                if block < left:
                    write_json(self.trial_dir / STOP_FILE, {"stop_after": self.read + block})
                self.done = True
                return


def write_metrics(trial_dir: Path, config: dict) -> bool:
    """``steps.jsonl`` and ``metrics.json`` from the recorder's files (see the module doc);
    False, writing nothing, when rank 0 did not end its train; :class:`MissingRanks` when some
    rank's files are not in ``trial_dir``."""
    records, summaries = read_ranks(trial_dir)
    if 0 not in summaries or not records.get(0):
        return False
    mf = config[SECTION]
    missing = _missing(trial_dir, mf, records, summaries)
    if missing:
        raise MissingRanks(missing)
    steps = min(len(r) for r in records.values())
    rank0 = records[0][:steps]
    losses = global_losses(records, mf["loss_rank"], mf["loss_divisor"])
    scales = scales_used(rank0, mf["initial_scale"])
    log = _step_log(config, trial_dir / "steps.jsonl")
    precision = config["trial"].get("precision")
    for i, record in enumerate(rank0):
        log.add(i, record["step_time_ms"] / 1000.0, losses[i], record["overflow"], scales[i])
        left = steps_left(config, rank0[: i + 1])
        if precision is not None and log.pilot_ended() and left > 0:
            log.plan(precision, left)  # fixes the pilot's weight, as the run did
    log.close()
    first = summaries[0]
    timing = {
        "started_at": first["started_at"],
        "init_s": first["train_begin_at"] - first["started_at"],
        "first_step_s": rank0[0]["ended_at"] - first["train_begin_at"],
        "probe_s": 0.0,
    }
    backend = backend_of(config["backend"])
    peak = max(
        device_peak_mb(s, backend) if backend.device_memory else s["peak_rss_mb"] or 0.0
        for s in summaries.values()
    )
    final_scale = rank0[-1]["loss_scale"]
    scaled = mf["loss_scaled"]
    metrics = log.summary(timing, peak, final_scale if final_scale is not None else 1.0)
    if scaled:
        metrics.update(underflow_share=None, underflow_bound=None, underflow_note=NO_PROBE)
    metrics["finished_at"] = first["finished_at"]
    write_json(trial_dir / "metrics.json", metrics, indent=1)
    return True
