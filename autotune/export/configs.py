"""The export's config documents, as plain dicts: train_config.json, launch.yaml, mindformers.yaml,
summary.json.

Contract (all pure functions of spec, candidate and trial; nothing here touches the disk):
- :func:`train_config` is the trial program's config format (``python -m autotune.train CONFIG``)
  set up for the real run: ``trial.steps = train.total_steps`` on the run's own (uncompressed)
  schedule, per-rank checkpoints every ``train.save_every`` steps; ``out_dir`` and the checkpoint
  folder are relative to the export folder (``launch.sh`` resolves them, and can override the
  steps, resume, and start from the export's ``checkpoint/``).
- :func:`launch_yaml` states every setting as the MindSpore call argument it becomes.
- :func:`mindformers_yaml` is the same as a MindFormers config overlay. MindFormers derives the
  global batch as batch_size × dp × micro_batch_num with pipeline stages (accumulation ignored)
  and batch_size × dp × gradient_accumulation_steps without; batch_size is chosen so that equals
  ``train.global_batch_size``.
- :func:`summary` is the trial record plus each parameter's full shape, stage and split dim.
"""

from __future__ import annotations

import math

from autotune.layout import ParamLayout
from autotune.train.config import trial_config
from autotune.knobs import KNOBS
from autotune.space import Candidate
from autotune.spec import Spec

# The dynamic loss scaler's fixed arguments (the searched knob is the initial value only).
SCALE_FACTOR = 2
SCALE_WINDOW = 1000
# MindFormers' default number of gradient-aggregation fusion groups.
GRADIENT_AGGREGATION_GROUP = 4
DEVICE_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
RUN_DIR = "run"


def run_backend(spec: Spec) -> str:
    """The backend the exported run executes on: a simulated study targets its device profile."""
    if spec.cluster.backend != "simulate":
        return spec.cluster.backend
    device = spec.cluster.device
    return "ascend" if isinstance(device, str) and "ascend" in device.lower() else "gpu"


def micro_batch_size(spec: Spec, c: Candidate) -> int:
    """Samples per device per forward pass (per micro-batch with pipeline stages)."""
    splits = c.micro_batches if c.pp > 1 else c.grad_accum
    return spec.train.global_batch_size // (c.dp * splits)


def parallel_mode(c: Candidate) -> str:
    return "data_parallel" if c.tp == c.pp == 1 else "semi_auto_parallel"


def train_config(spec: Spec, c: Candidate, trial: dict) -> dict:
    steps = spec.train.total_steps
    config = trial_config(spec, c, study=trial["study"], number=trial["number"], out_dir=RUN_DIR,
                          steps=steps, measure_after=min(spec.trial.measure_after, steps - 1),
                          backend=run_backend(spec))
    config["trial"]["schedule"] = "full"
    config["checkpoint"] = {"dir": f"{RUN_DIR}/checkpoint", "save_every": spec.train.save_every,
                            "resume": False, "init_from": None}
    return config


def _loss_scale(c: Candidate) -> dict:
    return {"loss_scale_value": c.loss_scale, "scale_factor": SCALE_FACTOR,
            "scale_window": SCALE_WINDOW}


def launch_yaml(spec: Spec, c: Candidate, trial: dict) -> dict:
    mode = parallel_mode(c)
    if c.jit_level == "pynative":
        context = {"mode": "PYNATIVE_MODE"}
    else:
        context = {"mode": "GRAPH_MODE", "jit_config": {"jit_level": c.jit_level}}
    context["device_target"] = DEVICE_TARGETS[run_backend(spec)]
    # Semi-auto computes the loss over the global batch, so its gradients are already means.
    parallel = {"parallel_mode": mode, "device_num": c.devices,
                "gradients_mean": mode == "data_parallel",
                "comm_fusion": {"allreduce": {"mode": "size", "config": c.fusion_mb}}}
    if mode == "semi_auto_parallel":
        parallel.update(pipeline_stages=c.pp, full_batch=True,
                        strategy_ckpt_config={"load_file": "strategy.ckpt",
                                              "only_trainable_params": False})
    doc = {
        "study": trial["study"],
        "trial": trial["number"],
        "knobs": {name: {"value": value, "mindspore": KNOBS[name].mindspore}
                  for name, value in c.as_dict().items()},
        "context": context,                      # mindspore.set_context(**context)
        "auto_parallel_context": parallel,       # mindspore.set_auto_parallel_context(**…)
        "batch": {"global_batch_size": spec.train.global_batch_size,
                  "micro_batch_size": micro_batch_size(spec, c)},
        "gradient_accumulation": {"steps": c.grad_accum},
        "loss_scale": {"DynamicLossScaleUpdateCell": _loss_scale(c)},
        "lr_schedule": {"schedule": "linear warmup, then cosine decay to 0",
                        "learning_rate": spec.train.learning_rate,
                        "warmup_steps": c.warmup_steps, "total_steps": spec.train.total_steps},
        "recompute": {"mode": c.recompute},
    }
    if c.pp > 1:
        doc["pipeline"] = {"PipelineCell": {"micro_size": c.micro_batches}}
    return doc


def mindformers_yaml(spec: Spec, c: Candidate) -> dict:
    semi = parallel_mode(c) == "semi_auto_parallel"
    parallel = {
        "parallel_mode": 1 if semi else 0,  # MindFormers' integer codes: 0 data, 1 semi-auto
        "gradients_mean": not semi,         # as launch.yaml
        "full_batch": semi,
        "comm_fusion": {"allreduce": {"mode": "size", "config": c.fusion_mb}},
    }
    if semi:
        parallel["strategy_ckpt_load_file"] = "strategy.ckpt"
    context = {"mode": 1} if c.jit_level == "pynative" else {
        "mode": 0, "jit_config": {"jit_level": c.jit_level}}
    context["device_target"] = DEVICE_TARGETS[run_backend(spec)]
    return {
        "parallel_config": {
            "data_parallel": c.dp, "model_parallel": c.tp, "pipeline_stage": c.pp,
            "micro_batch_num": c.micro_batches,
            "vocab_emb_dp": c.tp == 1,  # tp > 1: vocab-parallel embedding, as strategy.ckpt has it
            "gradient_aggregation_group": GRADIENT_AGGREGATION_GROUP,
        },
        "runner_config": {"batch_size": micro_batch_size(spec, c),
                          "gradient_accumulation_steps": c.grad_accum},
        "runner_wrapper": {"type": "MFTrainOneStepCell",
                           "scale_sense": {"type": "DynamicLossScaleUpdateCell", **_loss_scale(c)}},
        "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": spec.train.learning_rate,
                        "warmup_steps": c.warmup_steps, "total_steps": spec.train.total_steps},
        "context": context,
        "parallel": parallel,
        "recompute_config": {"recompute": c.recompute == "full",
                             "select_recompute": c.recompute == "selective"},
    }


def _finite(value):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def summary(spec: Spec, c: Candidate, trial: dict, layouts: dict, extra: dict) -> dict:
    def entry(p: ParamLayout) -> dict:
        return {"shape": list(p.shape), "stage": p.stage, "split_dim": p.split_dim}

    return _finite({
        "study": trial["study"],
        "trial": trial["number"],
        "knobs": c.as_dict(),
        "metrics": trial.get("metrics") or {},
        "estimate": trial.get("estimate"),
        "devices": c.devices,
        "rank_order": "rank = stage·(dp·tp) + dp_index·tp + tp_index",
        "parameters": {p.name: entry(p) for p in layouts.values()},
        **extra,
    })
