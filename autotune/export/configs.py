"""The export's config documents, as plain dicts: train_config.json, launch.yaml, summary.json
(mindformers.yaml: :mod:`autotune.mindformers.config`; the settings both state:
`autotune.mindformers.run_settings`).

Contract (all pure functions of spec, candidate and trial; nothing here touches the disk):
- :func:`export_reasons` says why a candidate cannot be exported as configs MindSpore and
  MindFormers run (empty = it can): PyNative runs only stand-alone and data-parallel jobs, and
  jit level O2 on no backend (deprecated since MindSpore 2.9: docs/accelerators.md).
- :func:`train_config` is the trial program's config format (``python -m autotune.train CONFIG``)
  set up for the real run: ``trial.steps = train.total_steps`` on the run's own (uncompressed)
  schedule, per-rank checkpoints every ``train.save_every`` steps; ``out_dir`` and the checkpoint
  folder are relative to the export folder (``launch.sh`` resolves them, and can override the
  steps, resume, and start from the export's ``checkpoint/``).
- :func:`launch_yaml` states every setting as the MindSpore 2.10 call it becomes, each section
  exactly the keyword arguments of that call: ``device`` → ``mindspore.set_device``,
  ``context`` → ``mindspore.set_context`` (``mode`` as the integer it takes), ``jit_config`` →
  ``mindspore.JitConfig`` on the training cell (graph mode only), ``auto_parallel_context`` →
  ``mindspore.set_auto_parallel_context``.
- :func:`summary` is the trial record plus each parameter's full shape, stage and split dim.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.costmodel import device_memory_cap
from autotune.export.knob_writers import LAUNCH_YAML
from autotune.files import json_safe
from autotune.layout import ParamLayout
from autotune.mindformers.run_settings import (  # noqa: F401  (the export's names for them)
    GRAPH_MODE,
    PYNATIVE_MODE,
    SCALE_FACTOR,
    loss_scale_cell,
    loss_scaled,
    micro_batch_size,
    parallel_optimizer,
    run_backend,
)
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import KNOBS
from autotune.spec.specs import Spec
from autotune.train.config import trial_config

RUN_DIR = "run"


def parallel_mode(c: Candidate) -> str:
    return "data_parallel" if c.tp == c.pp == 1 else "semi_auto_parallel"


def export_reasons(spec: Spec, c: Candidate) -> list[str]:
    """Why no exported config could run ``c`` (docs/export.md, "What MindSpore refuses")."""
    reasons = []
    if c.cp > 1:  # its Ulysses group (knob ulysses) with it
        group = f" (ulysses {c.ulysses})" if c.ulysses > 1 else ""
        reasons.append(
            f"cp = {c.cp}{group}: strategy.ckpt and the trainer's launch do not lay out context "
            "parallelism (the trainer splits no sequence); export a trial with it at 1 (--trial N)"
        )
    if c.ep > 1 and spec.model.experts_tensor_parallel:
        reasons.append(
            f"ep = {c.ep} with model.experts_tensor_parallel: strategy.ckpt lays experts out "
            "over ep only, and the trainer splits them so; export a trial with ep 1 (--trial N)"
        )
    if c.jit_level == "pynative" and (c.tp > 1 or c.pp > 1):
        reasons.append(
            f"jit_level = pynative with tp = {c.tp}, pp = {c.pp}: MindSpore's PyNative "
            "mode runs only stand-alone and data-parallel jobs, not the semi-auto "
            "parallel a tp/pp layout is configured as; export a graph-mode trial "
            "(--trial N)"
        )
    if c.jit_level == "pynative" and c.tp == c.pp == 1 and c.grad_accum > 1:
        reasons.append(
            f"jit_level = pynative with grad_accum = {c.grad_accum}: MindFormers "
            "accumulates gradients only in semi-auto parallel, which PyNative cannot "
            "run, so mindformers.yaml could not keep the tuned global batch; export a "
            "graph-mode trial (--trial N)"
        )
    if not run_backend(spec).executes("jit_level", c.jit_level):
        reasons.append(
            f"jit_level = {c.jit_level} on {run_backend(spec).name}: "
            f"{run_backend(spec).why_not('jit_level')}; export an O0/O1 trial (--trial N)"
        )
    return reasons


def train_config(spec: Spec, c: Candidate, trial: dict) -> dict:
    steps = spec.train.total_steps
    config = trial_config(
        spec,
        c,
        study=trial["study"],
        number=trial["number"],
        out_dir=RUN_DIR,
        steps=steps,
        measure_after=min(spec.trial.measure_after, steps - 1),
        backend=run_backend(spec).name,
        device_memory=device_memory_cap(replace(spec.cluster, backend=run_backend(spec).name)),
    )
    config["trial"]["schedule"] = "full"
    config["checkpoint"] = {
        "dir": f"{RUN_DIR}/checkpoint",
        "save_every": spec.train.save_every,
        "resume": False,
        "init_from": None,
    }
    return config


def launch_yaml(spec: Spec, c: Candidate, trial: dict) -> dict:
    mode = parallel_mode(c)
    # Semi-auto computes the loss over the global batch, so its gradients are already means.
    parallel = {
        "parallel_mode": mode,
        "device_num": c.devices,
        "gradients_mean": mode == "data_parallel",
        **parallel_optimizer(c),
        "comm_fusion": {"allreduce": {"mode": "size", "config": c.fusion_mb}},
    }
    if mode == "semi_auto_parallel":
        parallel.update(pipeline_stages=c.pp, full_batch=True)
    # None: a section a knob's writer fills or removes (`autotune.export.knob_writers`)
    doc = {
        "study": trial["study"],
        "trial": trial["number"],
        "knobs": {
            name: {"value": value, "mindspore": KNOBS[name].mindspore}
            for name, value in c.as_dict().items()
        },
        "device": {"device_target": run_backend(spec).device_target},
        "context": None,
        "jit_config": None,
        "auto_parallel_context": parallel,
        "batch": {
            "global_batch_size": spec.train.global_batch_size,
            "micro_batch_size": micro_batch_size(spec, c),
        },
        "gradient_accumulation": None,
        "loss_scale": None,
        "lr_schedule": None,
        "recompute": None,
        "pipeline": None,
    }
    LAUNCH_YAML.call(c.as_dict(), spec, c, doc)
    return doc


LAUNCH_YAML.in_place(
    "dp",
    "autotune.mindformers.run_settings:micro_batch_size",
    "the layout: auto_parallel_context.device_num (dp·tp·pp), the per-device "
    "batch.micro_batch_size, and strategy.ckpt",
)
LAUNCH_YAML.in_place(
    "ep",
    "autotune.export.strategy:write_strategies",
    "the experts' device matrix (dp·tp / ep, ep) in strategy.ckpt; mindformers.yaml's "
    "parallel_config.expert_parallel",
)
LAUNCH_YAML.in_place(
    "cp",
    "autotune.export.configs:export_reasons",
    "refused above 1: the trainer splits no sequence, strategy.ckpt lays none out",
)
LAUNCH_YAML.in_place(
    "ulysses",
    "autotune.export.configs:export_reasons",
    "acts only with cp above 1, which the export refuses; mindformers.yaml's "
    "parallel_config.context_parallel_algo and ulysses_degree_in_cp",
)
LAUNCH_YAML.in_place(
    "tp",
    "autotune.export.configs:parallel_mode",
    "the layout: auto_parallel_context.parallel_mode, and strategy.ckpt",
)
for _name, _section in (
    ("pp", "pipeline_stages"),
    ("fusion_mb", "comm_fusion"),
    ("parallel_optimizer", "enable_parallel_optimizer"),
):
    LAUNCH_YAML.in_place(
        _name,
        "autotune.export.configs:launch_yaml",
        f"auto_parallel_context.{_section}: an argument of the one "
        "set_auto_parallel_context call the layout decides",
    )


@LAUNCH_YAML.register("jit_level")
def _launch_jit_level(value, spec: Spec, c: Candidate, doc: dict) -> None:
    doc["context"] = {"mode": PYNATIVE_MODE if value == "pynative" else GRAPH_MODE}
    if value == "pynative":
        del doc["jit_config"]
    else:
        doc["jit_config"] = {"jit_level": value}


@LAUNCH_YAML.register("micro_batches")
def _launch_micro_batches(value, spec: Spec, c: Candidate, doc: dict) -> None:
    if c.pp > 1:
        doc["pipeline"] = {"PipelineCell": {"micro_size": value}}
    else:
        del doc["pipeline"]


@LAUNCH_YAML.register("grad_accum")
def _launch_grad_accum(value, spec: Spec, c: Candidate, doc: dict) -> None:
    doc["gradient_accumulation"] = {"steps": value}


@LAUNCH_YAML.register("loss_scale")
def _launch_loss_scale(value, spec: Spec, c: Candidate, doc: dict) -> None:
    # null: float32 and bfloat16 runs are not loss-scaled
    doc["loss_scale"] = (
        {"DynamicLossScaleUpdateCell": loss_scale_cell(c)} if loss_scaled(spec) else None
    )


@LAUNCH_YAML.register("warmup_steps")
def _launch_warmup_steps(value, spec: Spec, c: Candidate, doc: dict) -> None:
    doc["lr_schedule"] = {
        "schedule": "linear warmup, then cosine decay to 0",
        "learning_rate": spec.train.learning_rate,
        "warmup_steps": value,
        "total_steps": spec.train.total_steps,
    }


@LAUNCH_YAML.register("recompute")
def _launch_recompute(value, spec: Spec, c: Candidate, doc: dict) -> None:
    doc["recompute"] = {"mode": value}


def summary(spec: Spec, c: Candidate, trial: dict, layouts: dict, extra: dict) -> dict:
    def entry(p: ParamLayout) -> dict:
        return {"shape": list(p.shape), "stage": p.stage, "split_dim": p.split_dim}

    return json_safe(
        {
            "study": trial["study"],
            "trial": trial["number"],
            "knobs": c.as_dict(),
            "metrics": trial.get("metrics") or {},
            "estimate": trial.get("estimate"),
            "devices": c.devices,
            "rank_order": "rank = stage·(dp·tp) + dp_index·tp + tp_index",
            "parameters": {p.name: entry(p) for p in layouts.values()},
            **extra,
        }
    )
