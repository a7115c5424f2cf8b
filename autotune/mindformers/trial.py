"""The config a MindFormers trial runs: the export's mindformers.yaml of the trial, made a short run.

Contract: :func:`trial_document` returns ``(trial.yaml text, changes)`` for a candidate: the
document `autotune.mindformers.config.document` writes for the trial's export — the user's
config (``export.mindformers_base``) with the candidate merged in by MindFormers' own rule, the
same call ``autotune export`` makes — with :data:`RUN_KEYS` set for the trial, and nothing else:

- run length: ``lr_schedule.total_steps`` the trial's steps and ``warmup_steps`` the warmup
  compressed onto them (`autotune.spec.knobs.trial_warmup`, as autotune's own trainer does),
  ``runner_config.epochs`` enough for the cap (``UPDATE_CAP`` × steps: the recorder stops the
  run), no evaluation (``do_eval``), and under sink mode ``runner_config.sink_size`` 1 (sink
  mode kept): MindSpore calls a callback once per sink (``train/model.py``,
  ``_train_dataset_sink_process``), and the recorder counts, times and stops per step;
- memory: on a device, ``context.max_device_memory`` the study's cap
  (`autotune.costmodel.device_memory_cap`: what its screen judged the candidate against,
  ``cluster.max_device_memory_gb`` where given), the pool's limit MindFormers sets
  (``runtime.set_memory(max_size=…)``, ``core/context/build_context.py``);
- outputs: ``output_dir`` under the trial folder, ``profile`` off, and ``callbacks`` the user's
  without those that write checkpoints, summaries, profiles or evaluations
  (:data:`DROPPED_CALLBACKS`), plus autotune's recorder (``AutotuneStepRecorder``, in
  `autotune.mindformers.CLUSTER_DIR`, registered through ``run_mindformer.py --register_path``);
- data: no checkpoint loaded or resumed (``load_checkpoint`` ``''``, ``resume_training``,
  ``auto_trans_ckpt`` off): a trial measures steps from fresh weights (the dataset itself is
  the launch's, ``--train_dataset_dir`` for a synthetic one: `autotune.mindformers.launch`).

``changes`` lists ``(key, old, new)`` for each key whose value the trial changed; the text's
header says so. tests/mindformers/ diffs the two documents with the reader both sides share
(`autotune.spec.mindformers_file.load_config`). :func:`trial_section` adds what the launch and
the results need (the loss MindFormers means: `autotune.mindformers.loss`).
:func:`compile_cache_key` names the folder of MindSpore's compile cache a trial may fill or load
(a re-run of the same candidate).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from autotune.costmodel import device_memory_cap
from autotune.mindformers.config import document
from autotune.mindformers.loss import loss_divisor, loss_rank
from autotune.mindformers.run_settings import loss_scaled
from autotune.spec.backends import backend_of
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import trial_warmup
from autotune.spec.specs import Spec
from autotune.train.config import UPDATE_CAP
from autotune.train.runtime.device_memory import memory_settings

SECTION = "mindformers"  # the trial's config.json section :func:`trial_section` fills
TRIAL_FILE = "trial.yaml"
OUTPUT_DIR = "mf_output"  # MindFormers' output_dir, under the trial folder
STOP_FILE = "stop.json"  # the launcher's stop step (`autotune.mindformers.results.StopPlan`)
RECORDER = "AutotuneStepRecorder"
RECORDER_FILE = "autotune_mf_recorder.py"
# The keys a trial's config may differ in from the export's, and why (run length, outputs, data).
RUN_KEYS = {
    "lr_schedule.total_steps": "run length: the trial's steps",
    "lr_schedule.warmup_steps": "run length: the warmup compressed onto the trial's steps",
    "runner_config.epochs": "run length: the recorder stops the run",
    "runner_config.sink_size": "run length: one callback per step (sink mode kept)",
    "context.max_device_memory": "memory: the study's cap, which its screen judged against",
    "do_eval": "run length: no evaluation",
    "output_dir": "outputs: under the trial's folder",
    "profile": "outputs: no profile",
    "callbacks": "outputs: no checkpoints, summaries, profiles or evaluations; the recorder",
    "load_checkpoint": "data: fresh weights",
    "resume_training": "data: fresh weights",
    "auto_trans_ckpt": "data: fresh weights",
}
# Callbacks that write outputs a trial does not keep (MindFormers' names).
DROPPED_CALLBACKS = (
    "CheckpointMonitor",
    "SummaryMonitor",
    "ProfileMonitor",
    "EvalCallBack",
    "TrainingStateMonitor",
)


def _get(document: dict, dotted: str):
    node = document
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(document: dict, dotted: str, value, changes: list) -> None:
    *parents, last = dotted.split(".")
    node = document
    for part in parents:
        node = node.setdefault(part, {})
    old = node.get(last)
    if old != value:
        node[last] = value
        changes.append((dotted, old, value))


def recorder_entry(spec: Spec, trial_dir: Path, stop_rule: bool) -> dict:
    """The recorder's ``callbacks`` entry (`autotune.mindformers.cluster` reads its arguments)."""
    steps = spec.trial.steps
    entry = {
        "type": RECORDER,
        "auto_register": f"{Path(RECORDER_FILE).stem}.{RECORDER}",
        "out_dir": str(trial_dir),
        "steps": steps,
        "cap": UPDATE_CAP * steps,
        "device_memory": backend_of(spec.cluster.backend).device_memory,
    }
    if entry["device_memory"]:  # its reading beside the pool's: the overhead (results)
        entry["memory_tool"] = list(backend_of(spec.cluster.backend).memory_tool)
    if stop_rule:  # read from the first step the pilot can end at (its steps after the back-off)
        entry["stop_file"] = str(trial_dir / STOP_FILE)
        entry["stop_from"] = spec.trial.measure_after + spec.trial.min_steps
    return entry


def trial_document(
    spec: Spec, c: Candidate, number: int, trial_dir: Path, stop_rule: bool = False
) -> tuple[str, list]:
    """``(trial.yaml text, changes)`` of trial ``number`` (see the module doc); ``stop_rule``:
    the recorder stops where the launcher's stop rule says (`autotune.mindformers.results`)."""
    trial_dir = Path(trial_dir)
    steps = spec.trial.steps
    text, _ = document(spec, c, {"study": spec.study, "number": number}, spec.mindformers_base)
    config = yaml.safe_load(text)
    changes: list = []
    _set(config, "lr_schedule.total_steps", steps, changes)
    warmup = trial_warmup(c.warmup_steps, spec.train.total_steps, steps)
    _set(config, "lr_schedule.warmup_steps", warmup, changes)
    _set(config, "runner_config.epochs", UPDATE_CAP * steps, changes)
    if _get(config, "runner_config.sink_mode"):
        _set(config, "runner_config.sink_size", 1, changes)
    cap = device_memory_cap(spec.cluster)
    if cap is not None:
        settings = memory_settings({"device_memory": cap}, backend_of(spec.cluster.backend))
        _set(config, "context.max_device_memory", settings["max_size"], changes)
    for key, value in (("do_eval", False), ("profile", False), ("resume_training", False)):
        if _get(config, key) not in (None, value):
            _set(config, key, value, changes)
    if _get(config, "auto_trans_ckpt"):
        _set(config, "auto_trans_ckpt", False, changes)
    if _get(config, "load_checkpoint"):
        _set(config, "load_checkpoint", "", changes)
    _set(config, "output_dir", str(trial_dir / OUTPUT_DIR), changes)
    kept = [
        callback
        for callback in config.get("callbacks") or []
        if not (isinstance(callback, dict) and callback.get("type") in DROPPED_CALLBACKS)
    ]
    _set(config, "callbacks", [*kept, recorder_entry(spec, trial_dir, stop_rule)], changes)
    header = (
        f"# autotune study {json.dumps(spec.study)}, trial {number}: the config MindFormers' "
        "run_mindformer.py runs for it.\n"
        "# It is this trial's export (autotune export --trial N: mindformers.yaml) but for "
        "run length,\n# outputs, data and memory:\n"
        + "".join(f"#   {key}: {RUN_KEYS[key]}\n" for key, _, _ in changes)
    )
    return header + yaml.safe_dump(config, sort_keys=False, width=100, allow_unicode=True), changes


def trial_section(
    spec: Spec,
    c: Candidate,
    number: int,
    trial_dir: Path,
    data: str | None = None,
    stop_rule: bool = False,
) -> dict:
    """The :data:`SECTION` of a MindFormers trial's ``config.json``: what its launch
    (`autotune.mindformers.launch`) and its results (`autotune.mindformers.results`) need —
    ``run_mindformer``, ``python``, ``data`` (a synthetic dataset's path, else None: the
    config's), ``register_path`` (the user's ``run_mindformer.py --register_path``, kept beside
    autotune's: `autotune.mindformers.launch`), ``trial_yaml`` (:func:`trial_document`'s text:
    written by each node's launcher, so nodes need no copy of the user's config), ``ranks``,
    ``loss_rank`` and ``loss_divisor`` (the loss MindFormers means:
    `autotune.mindformers.loss`), ``loss_scaled`` and ``initial_scale``."""
    text, _ = trial_document(spec, c, number, trial_dir, stop_rule)
    config = yaml.safe_load(text)
    scaled = loss_scaled(spec)
    return {
        "run_mindformer": spec.trial.run_mindformer,
        "python": spec.trial.python,
        "data": data,
        "register_path": spec.trial.register_path,
        "trial_yaml": text,
        "ranks": c.devices,
        "loss_rank": loss_rank(config, c.devices),
        "loss_divisor": loss_divisor(config),
        "loss_scaled": scaled,
        "initial_scale": float(c.loss_scale) if scaled else 1.0,
    }


def compile_cache_key(mf: dict, versions: str) -> str:
    """The folder name of MindSpore's compile cache for the trial whose ``mindformers`` section
    is ``mf`` (:func:`trial_section`): a digest of everything that can change its graphs — its
    config less the trial's own paths (``output_dir``, the recorder's files and stop step), the
    data, the user's register path, the interpreter and MindFormers' and MindSpore's
    ``versions``, ``run_mindformer.py``'s source.
    MindSpore's cache finds a graph by the order a process compiles, not by the graph
    (docs/mindspore-cpu.md, "Compile cache"): only a run of the same key may load a folder."""
    config = yaml.safe_load(mf["trial_yaml"])
    config.pop("output_dir", None)
    config["callbacks"] = [
        {k: v for k, v in cb.items() if k not in ("out_dir", "stop_file", "stop_from")}
        if isinstance(cb, dict) and cb.get("type") == RECORDER
        else cb
        for cb in config.get("callbacks") or []
    ]
    script = Path(mf["run_mindformer"])
    digest = hashlib.sha256(
        json.dumps(
            [config, mf["data"], mf.get("register_path"), mf["python"], versions, str(script)],
            sort_keys=True,
            default=str,
        ).encode()
    )
    digest.update(script.read_bytes() if script.is_file() else b"")
    return digest.hexdigest()[:24]
