"""mindformers.yaml: the tuned settings as a MindFormers config.

Contract (no MindFormers import: it cannot be installed next to autotune, docs/mindformers.md):
- :func:`overlay` is every key autotune sets, each for a reason docs/mindformers.md states with
  its MindFormers source ("What the overlay sets"). MindFormers' global batch under it is
  ``train.global_batch_size`` in every layout, pure data parallel included.
- The base is read and merged by MindFormers' own rule, `autotune.spec.mindformers_file`
  (``load_config``, ``merge``), which ``autotune init --mindformers`` reads configs with too.
- :func:`document` returns ``(mindformers.yaml text, changes)``: without a base, the overlay with
  a ``base_config`` the user must set (its header says so); with one, the complete config — the
  base with the overlay merged in — and a header listing every changed key (old -> new).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from autotune.export.configs import (GRAPH_MODE, PYNATIVE_MODE, loss_scale_cell,
                                     loss_scaled, micro_batch_size, parallel_optimizer, run_backend)
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS
from autotune.spec.mindformers_file import BASE_CONFIG, load_config, merge
from autotune.spec.model_yaml import Spec

# What the overlay's base_config says until the user sets it; launch.sh refuses to start with it.
UNSET_BASE = "SET-ME-your-model-mindformers-config.yaml"


def overlay(spec: Spec, c: Candidate) -> dict:
    """The tuned settings as MindFormers config keys (see docs/mindformers.md for each)."""
    # Semi-auto even for pure data parallel: MindFormers accumulates gradients only there.
    # PyNative runs data parallel only (configs.export_reasons refuses the rest).
    semi = c.jit_level != "pynative"
    pp = c.pp > 1
    scaler = {"type": "DynamicLossScaleUpdateCell", **loss_scale_cell(c)}
    context = {"mode": PYNATIVE_MODE if c.jit_level == "pynative" else GRAPH_MODE,
               "device_target": run_backend(spec).device_target}
    if c.jit_level != "pynative":
        context["jit_config"] = {"jit_level": c.jit_level}
    return {
        "run_mode": "train",
        "use_parallel": True,
        "micro_batch_interleave_num": 1,  # the global batch counts it; the tuned run has none
        "context": context,
        "parallel": {
            "parallel_mode": 1 if semi else 0,  # MindFormers' codes: 0 data, 1 semi-auto parallel
            "gradients_mean": not semi,         # semi-auto's loss is already the global mean
            "full_batch": semi,
            **parallel_optimizer(c),
            "comm_fusion": {"allreduce": {"mode": "size", "config": c.fusion_mb}},
        },
        "parallel_config": {
            "data_parallel": c.dp, "model_parallel": c.tp, "pipeline_stage": c.pp,
            "context_parallel": 1,
            "micro_batch_num": c.micro_batches if pp else 1,
            "vocab_emb_dp": c.tp == 1,  # tp > 1: vocab-parallel embedding, as strategy.ckpt has it
        },
        "runner_config": {"batch_size": micro_batch_size(spec, c),
                          "gradient_accumulation_steps": 1 if pp else c.grad_accum},
        "runner_wrapper": {"type": "MFTrainOneStepCell",
                           "scale_sense": scaler if loss_scaled(spec) else 1.0},
        "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": spec.train.learning_rate,
                        "warmup_steps": c.warmup_steps, "warmup_ratio": None,
                        "total_steps": spec.train.total_steps, "lr_end": 0.0,
                        "warmup_lr_init": 0.0, "num_cycles": 0.5,
                        "decay_steps": None, "decay_ratio": None},
        "recompute_config": {"recompute": c.recompute == "full",
                             "select_recompute": c.recompute == "selective"},
        # layers split evenly over the stages, as strategy.ckpt places them
        "model": {"model_config": {"offset": 0}},
    }


def _check_base(spec: Spec, base: dict, where: str) -> None:
    model = base.get("model")
    model_config = model.get("model_config") if isinstance(model, dict) else None
    dtype = model_config.get("compute_dtype") if isinstance(model_config, dict) else None
    if dtype is not None and dtype != spec.model.dtype:
        raise SpecError(f"{where}: model.model_config.compute_dtype is {dtype!r} but the study "
                        f"tuned model.dtype {spec.model.dtype!r} (the loss scale and batch were "
                        "tuned for that)")


def _dump(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def _value(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def document(spec: Spec, c: Candidate, trial: dict,
             base_path: str | None = None) -> tuple[str, list]:
    """``(mindformers.yaml text, changes)``; ``changes`` is empty without a base."""
    title = (f"# autotune export of study {json.dumps(trial['study'])}, trial {trial['number']}: "
             "MindFormers config")
    tuned = overlay(spec, c)
    if base_path is None:
        knob_lines = "".join(f"#   {name:<13} -> {knob.mindformers}\n" for name, knob in KNOBS.items())
        header = (f"{title} overlay.\n"
                  "# Set base_config to your model's MindFormers config (absolute, or relative to this\n"
                  "# file's folder): MindFormers merges this file over it. Or export again with\n"
                  "# --mindformers-base YOUR.yaml to get the complete config. docs/mindformers.md\n"
                  "# says why each key is set. Knobs map to:\n" + knob_lines)
        return header + _dump({BASE_CONFIG: UNSET_BASE, **tuned}), []
    base = load_config(base_path)
    _check_base(spec, base, str(base_path))
    base_optimizer = (base.get("parallel") or {}).get("parallel_optimizer_config")
    if isinstance(base_optimizer, dict) and "parallel_optimizer_threshold" in base_optimizer:
        # the base's own threshold stays (ours is only MindFormers' default)
        tuned["parallel"].pop("parallel_optimizer_config", None)
    merged, changes = merge(tuned, base, replace=True)
    lines = "".join(f"#   {ch['key']}: {_value(ch['old']) if 'old' in ch else '(absent)'} -> "
                    f"{_value(ch['new'])}\n" for ch in changes)
    header = (f"{title}:\n#   {Path(base_path).resolve()}\n"
              "# with the tuned settings merged in by MindFormers' own rule (docs/mindformers.md).\n"
              "# Changed, old -> new:\n" + lines)
    return header + _dump(merged), changes
