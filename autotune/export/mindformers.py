"""mindformers.yaml: the tuned settings as a MindFormers config.

Contract (no MindFormers import: it cannot be installed next to autotune, docs/mindformers.md):
- :func:`overlay` is every key autotune sets, each for a reason docs/mindformers.md states with
  its MindFormers source ("What the overlay sets"). MindFormers' global batch under it is
  ``train.global_batch_size`` in every layout, pure data parallel included.
- :func:`load_base` reads a MindFormers config as MindFormers' ``MindFormerConfig._file2dict``
  does (``mindformers/tools/register/config.py``): ``yaml.safe_load``, then each ``base_config``
  (a path or a list of paths, relative to the including file's folder) loaded the same way,
  several bases combined with a shallow ``dict.update``, and the file merged over them by
  :func:`merge`. Any problem is a :class:`SpecError` naming the file (and the key).
- :func:`merge` is MindFormers' ``_merge_a_into_b``: a mapping merges into a mapping (or into
  null) key by key, anything else replaces. Where MindFormers' own rule would crash — a mapping
  over a scalar or a list — it raises :class:`MergeConflict`, or with ``replace=True`` replaces
  the value whole. It returns the merged dict and every leaf it changed.
- :func:`document` returns ``(mindformers.yaml text, changes)``: without a base, the overlay with
  a ``base_config`` the user must set (its header says so); with one, the complete config — the
  base with the overlay merged in — and a header listing every changed key (old -> new).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from autotune.export.configs import (GRAPH_MODE, PYNATIVE_MODE, loss_scale_cell,
                                     loss_scaled, micro_batch_size, parallel_optimizer, run_backend)
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS
from autotune.spec.model_yaml import Spec
from autotune.spec.yaml_file import load_yaml

BASE_CONFIG = "base_config"
# What the overlay's base_config says until the user sets it; launch.sh refuses to start with it.
UNSET_BASE = "SET-ME-your-model-mindformers-config.yaml"
_ABSENT = object()


class MergeConflict(Exception):
    """MindFormers' merge would crash at ``key``: a mapping over a scalar or a list."""

    def __init__(self, key: str, old):
        super().__init__(f"{key}: a mapping cannot be merged over {json.dumps(old)}")
        self.key, self.old = key, old


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


def _same(old, new) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return old == new
    return type(old) is type(new) and old == new


def merge(a: dict, b: dict | None, replace: bool = False, _path: str = "") -> tuple[dict, list]:
    """``a`` merged over ``b`` by MindFormers' ``_merge_a_into_b``; returns (merged, changes)
    with each change ``{"key": dotted, "old": value, "new": value}`` (no "old": it was absent)."""
    # MindFormers: b = b.copy() if b is not None else a.copy()
    merged = dict(b) if b is not None else dict(a)
    changes = []
    for key, value in a.items():
        dotted = f"{_path}{key}"
        old = b.get(key, _ABSENT) if b is not None else _ABSENT
        if isinstance(value, dict) and key in merged:
            if b is None or isinstance(old, dict):
                merged[key], inner = merge(value, old if isinstance(old, dict) else None, replace,
                                           f"{dotted}.")
                changes += inner
                continue
            if old is not None and not replace:  # MindFormers: `old.copy()[k] = …` fails
                raise MergeConflict(dotted, old)
        merged[key] = value  # over null MindFormers' merge also gives the mapping itself
        if old is _ABSENT:
            changes.append({"key": dotted, "new": value})
        elif not _same(old, value):
            changes.append({"key": dotted, "old": old, "new": value})
    return merged, changes


def load_base(path: str | os.PathLike, _seen: tuple = ()) -> dict:
    """A MindFormers config with its base_config chain resolved (see the module doc)."""
    path = Path(path)
    real = path.resolve()
    if real in _seen:
        raise SpecError(f"{path}: base_config includes itself ({' -> '.join(map(str, _seen))})")
    data = load_yaml(real)
    if BASE_CONFIG not in data:
        return data
    names = data.pop(BASE_CONFIG)
    names = names if isinstance(names, list) else [names]
    combined = {}
    for name in names:
        if not isinstance(name, str) or not name:
            raise SpecError(f"{path}: base_config: expected a file name, got {name!r}")
        # MindFormers joins the name to the including file's folder as given (not resolved).
        combined.update(load_base(os.path.join(os.path.dirname(path), name), (*_seen, real)))
    try:
        return merge(data, combined)[0]
    except MergeConflict as exc:
        raise SpecError(f"{path}: MindFormers cannot merge it over its base_config: {exc}") from None


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
    base = load_base(base_path)
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
