"""mindformers.yaml: the tuned settings as a MindFormers config.

Contract (no MindFormers import: it cannot be installed next to autotune; the slow tests run the
output through MindFormers itself in a venv of its own, docs/mindformers.md):
- :func:`overlay` is every key autotune sets, each for a reason docs/mindformers.md states with
  its MindFormers source ("What the overlay sets"). MindFormers' global batch under it is
  ``train.global_batch_size`` in every layout, pure data parallel included.
- A run backend of ``mindformers_cpu_form`` (``cpu``) gets the config MindFormers runs on CPU
  when it can (`autotune.mindformers.cpu_form.on_cpu`): data parallel (``parallel_mode: 0``,
  gradients averaged) in `autotune.mindformers.cpu_form`'s CPU form (accumulation folded into
  the per-rank batch, no sink mode, the legacy llama's CPU kernels, and autotune's CPU training
  step, passed by ``launch.sh`` through ``--register_path``). When it cannot, the file is the
  device form and its header says why MindFormers refuses it on CPU.
- The base is read and merged by MindFormers' own rule, `autotune.spec.mindformers_file`
  (``load_config``, ``merge``), which ``autotune init --mindformers`` reads configs with too; its
  per-stage recompute lists are re-derived for the tuned pp and the keys it keeps that change
  layout, memory or schedule are listed (`autotune.mindformers.base`).
- The run the study priced is the run written: sequence parallelism, the token table under the
  parallel optimizer and the per-stage recompute lists come from the model.yaml
  (``model.sequence_parallel``, ``embedding_parallel_optimizer``, ``recompute_layers``:
  :func:`recompute_lists`).
- The run's length (``lr_schedule.total_steps``) is written only when the model.yaml states
  ``train.total_steps``: a length it leaves out or null (``autotune init`` of a config whose -1
  it could not count) is the base's, which MindFormers derives from the dataset — not autotune's
  default as if it were the dataset's; the header says so (:data:`UNSTATED_LENGTH`).
- :func:`document` returns ``(mindformers.yaml text, changes)``: without a base, the overlay with
  a ``base_config`` the user must set (its header says so) and no key only a legacy llama base
  takes (:data:`LEGACY_MODEL_KEYS`: an mcore base refuses them; the header lists them with
  their values, for a legacy base); with one, the complete config — the base with the overlay
  merged in — and a header listing every changed key (old -> new), the re-derived lists and
  the kept keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from autotune.families.layers import stage_offsets
from autotune.families.llama import LLAMA_EMBEDDING
from autotune.layout import optimizer_whole
from autotune.mindformers.base import kept, stage_lists
from autotune.mindformers.cpu_form import device_notes, for_cpu, on_cpu
from autotune.mindformers.run_settings import (
    GRAPH_MODE,
    PYNATIVE_MODE,
    loss_scale_cell,
    loss_scaled,
    micro_batch_size,
    parallel_optimizer,
    run_backend,
)
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS, KnobHooks
from autotune.spec.mindformers_file import BASE_CONFIG, is_mcore, load_config, merge
from autotune.spec.mindformers_layers import chunks, per_stage, pipeline_interleave
from autotune.spec.mindformers_mcore import TRANSFORMER_CONFIG_DEFAULTS
from autotune.spec.specs import Spec

# Where each knob is written in mindformers.yaml (`autotune.export.knob_writers` says what a
# writer is; launch.yaml's are there). Here, below `autotune.export`, because a MindFormers
# trial (`autotune.execution`) writes the same document.
MINDFORMERS_YAML = KnobHooks("export: mindformers.yaml")

# What the overlay's base_config says until the user sets it; launch.sh refuses to start with it.
UNSET_BASE = "SET-ME-your-model-mindformers-config.yaml"


def overlay(spec: Spec, c: Candidate) -> dict:
    """The tuned settings as MindFormers config keys (see docs/mindformers.md for each)."""
    # Semi-auto even for pure data parallel: MindFormers accumulates gradients only there.
    # PyNative runs data parallel only (configs.export_reasons refuses the rest), and so does
    # MindFormers on CPU.
    cpu = on_cpu(spec, c)
    semi = c.jit_level != "pynative" and not cpu
    pp = c.pp > 1
    context = {
        "mode": PYNATIVE_MODE if c.jit_level == "pynative" else GRAPH_MODE,
        "device_target": run_backend(spec).device_target,
    }
    if c.jit_level != "pynative":
        context["jit_config"] = {"jit_level": c.jit_level}
    fusion = {"mode": "size", "config": c.fusion_mb}
    # With the parallel optimizer MindSpore also buckets its all-gathers and reduce-scatters.
    buckets = (
        ("allreduce", "allgather", "reducescatter") if c.parallel_optimizer else ("allreduce",)
    )
    document = {
        "run_mode": "train",
        "use_parallel": True,
        "micro_batch_interleave_num": 1,  # the global batch counts it; the tuned run has none
        "context": context,
        "parallel": {
            "parallel_mode": 1 if semi else 0,  # MindFormers' codes: 0 data, 1 semi-auto parallel
            "gradients_mean": not semi,  # semi-auto's loss is already the global mean
            "full_batch": semi,
            **parallel_optimizer(c),
            "comm_fusion": {bucket: dict(fusion) for bucket in buckets},
        },
        "parallel_config": {
            "data_parallel": c.dp,
            "model_parallel": c.tp,
            "pipeline_stage": c.pp,
            "context_parallel": c.cp,
            "micro_batch_num": c.micro_batches if pp else 1,
            "vocab_emb_dp": c.tp == 1,  # tp > 1: vocab-parallel embedding, as strategy.ckpt has it
            # only with tp: nothing to split without it (priced so), and MindFormers' mcore
            # ModelParallelConfig refuses it ("Can not use sequence parallelism without tensor
            # parallelism", parallel_core/model_parallel_config.py)
            "use_seq_parallel": spec.model.sequence_parallel and c.tp > 1,
        },
        "runner_config": {
            "batch_size": micro_batch_size(spec, c),
            "gradient_accumulation_steps": 1 if pp else c.grad_accum,
        },
        # None: filled by the knob's writer (`autotune.export.knob_writers`)
        "runner_wrapper": {"type": "MFTrainOneStepCell", "scale_sense": None},
        "lr_schedule": None,
        "recompute_config": None,
        # layers split as strategy.ckpt places them (the first stages one more where pp does not
        # divide them: `autotune.families.layers.stage_offsets`); the legacy llama
        # shards its embedding with the parallel optimizer only when its model_config says so
        "model": {
            "model_config": {
                "offset": stage_offsets(spec.model.num_layers, c.pp),
                "parallel_optimizer": c.parallel_optimizer
                and (LLAMA_EMBEDDING not in optimizer_whole(spec.model.as_config())),
            }
        },
    }
    if spec.model.num_experts or c.ep > 1:  # MindFormers' MoE configs: the all-to-all dispatch
        document["parallel_config"]["expert_parallel"] = c.ep
        document["parallel"]["enable_alltoall"] = c.ep > 1
    MINDFORMERS_YAML.call(c.as_dict(), spec, c, document)
    if cpu:
        for_cpu(document, c)
    return document


for _name in (
    "dp",
    "tp",
    "pp",
    "micro_batches",
    "grad_accum",
    "fusion_mb",
    "parallel_optimizer",
    "jit_level",
    "ep",
    "cp",
):
    MINDFORMERS_YAML.in_place(
        _name,
        "autotune.mindformers.config:overlay",
        "parallel_mode, parallel_config, runner_config and context follow "
        "from the layout, the jit level and the device together",
    )


@MINDFORMERS_YAML.register("ulysses")
def _mindformers_ulysses(value, spec: Spec, c: Candidate, document: dict) -> None:
    """A Ulysses group inside cp: the whole of it ``ulysses_cp``, part of it ``hybrid_cp`` (the
    legacy llama's ``get_ulysses_cp_num``; an mcore base: :func:`_for_mcore`), its degree in
    ``ulysses_degree_in_cp`` (mcore's ``hierarchical_context_parallel_sizes``)."""
    if c.cp > 1 and value > 1:
        document["parallel_config"]["context_parallel_algo"] = (
            "ulysses_cp" if value == c.cp else "hybrid_cp"
        )
        document["parallel_config"]["ulysses_degree_in_cp"] = value


@MINDFORMERS_YAML.register("loss_scale")
def _mindformers_loss_scale(value, spec: Spec, c: Candidate, document: dict) -> None:
    scaler = {"type": "DynamicLossScaleUpdateCell", **loss_scale_cell(c)}
    document["runner_wrapper"]["scale_sense"] = scaler if loss_scaled(spec) else 1.0


@MINDFORMERS_YAML.register("warmup_steps")
def _mindformers_warmup_steps(value, spec: Spec, c: Candidate, document: dict) -> None:
    document["lr_schedule"] = {
        "type": "CosineWithWarmUpLR",
        "learning_rate": spec.train.learning_rate,
        "warmup_steps": value,
        "warmup_ratio": None,
        "total_steps": spec.train.total_steps,
        "lr_end": 0.0,
        "warmup_lr_init": 0.0,
        "num_cycles": 0.5,
        "decay_steps": None,
        "decay_ratio": None,
    }
    if not spec.stated("train", "total_steps"):  # a default is not the run's length
        del document["lr_schedule"]["total_steps"]


# The header's line when the run's length is the base's (model.yaml states none).
UNSTATED_LENGTH = (
    "# lr_schedule.total_steps: not written — model.yaml states no train.total_steps (the study\n"
    "# priced autotune's default {steps}); the base's stands (-1 or none: MindFormers derives\n"
    "# it, runner_config.epochs × the dataset's batches per epoch).\n"
)


@MINDFORMERS_YAML.register("recompute")
def _mindformers_recompute(value, spec: Spec, c: Candidate, document: dict) -> None:
    document["recompute_config"] = recompute_lists(spec, c)


def recompute_lists(spec: Spec, c: Candidate, interleave: int = 1) -> dict:
    """``recompute_config``'s ``recompute``, ``select_recompute`` and (when the model.yaml has
    it) ``select_comm_recompute`` for ``c``: the layers `autotune.layout.layer_recompute` gives
    the study, as per-stage lists of the tuned layout (``interleave`` chunks per stage; without
    interleave, the stages `autotune.families.layers.stage_layers` gives)
    where ``model.recompute_layers`` marks some layers only, else booleans."""
    marks = spec.model.recompute_layers
    offset = stage_offsets(spec.model.num_layers, c.pp) if interleave == 1 else 0
    layout = chunks(spec.model.num_layers, c.pp, interleave, offset) if marks else None

    def listed(key: str, on: bool):
        value = marks.get(key)
        return on and (True if value in (None, True) else per_stage(value, layout))

    lists = {
        "recompute": listed("recompute", c.recompute == "full"),
        # under full recompute, the layers its list leaves out may be selective
        "select_recompute": listed(
            "select_recompute",
            c.recompute == "selective"
            or (c.recompute == "full" and "recompute" in marks and "select_recompute" in marks),
        ),
    }
    if "select_comm_recompute" in marks:
        lists["select_comm_recompute"] = listed("select_comm_recompute", True)
    return lists


# Keys of the legacy llama's model_config the overlay may write: an mcore model's converter
# refuses each when MindFormers builds the network ("`parallel_optimizer` is unexpected in
# TransformerConfig": parallel_core/transformer_config_utils.py, convert_to_transformer_config,
# run by the weight template of every mcore training model), so an mcore base gets none, and
# neither does an overlay, whose base may be either kind.
LEGACY_MODEL_KEYS = ("parallel_optimizer", "use_rope_slice", "fused_rms_norm")


def _for_mcore(document: dict) -> dict:
    """The overlay as an mcore model takes it: no legacy llama model key (above), and a Ulysses
    group inside cp as the degree alone — mcore's attention splits heads over
    ``ulysses_degree_in_cp`` whatever the algorithm, and its converter refuses ``hybrid_cp``
    (``get_cp_comm_type``: colossalai_cp or ulysses_cp only). Returns what was taken out or
    changed, by its path in the config. Its ``VocabParallelEmbedding`` joins the parallel
    optimizer as any weight, as the study priced it (init writes
    ``embedding_parallel_optimizer: true`` for an mcore config)."""
    model_config = document["model"]["model_config"]
    legacy = {
        f"model.model_config.{key}": model_config.pop(key)
        for key in LEGACY_MODEL_KEYS
        if key in model_config
    }
    parallel = document["parallel_config"]
    if parallel.get("context_parallel_algo") == "hybrid_cp":
        parallel["context_parallel_algo"] = "colossalai_cp"
        legacy["parallel_config.context_parallel_algo"] = "hybrid_cp"
    return legacy


def _legacy_note(keys: dict) -> str:
    """An overlay's header lines naming the legacy llama's settings it leaves out (a base of
    unknown kind), with the values the study's run has."""
    if not keys:
        return ""
    lines = "".join(f"#     {key}: {_value(value)}\n" for key, value in keys.items())
    return (
        "# For a legacy llama base (use_legacy not false), also set (an mcore base refuses\n"
        "# them, so this overlay does not):\n" + lines
    )


def _check_base(spec: Spec, base: dict, where: str) -> None:
    model = base.get("model")
    model_config = model.get("model_config") if isinstance(model, dict) else None
    dtype = model_config.get("compute_dtype") if isinstance(model_config, dict) else None
    if dtype is None and is_mcore(
        base
    ):  # TransformerConfig's (config.json's torch_dtype is not read)
        dtype = TRANSFORMER_CONFIG_DEFAULTS["compute_dtype"]
    if dtype is not None and dtype != spec.model.dtype:
        raise SpecError(
            f"{where}: model.model_config.compute_dtype is {dtype!r} but the study "
            f"tuned model.dtype {spec.model.dtype!r} (the loss scale and batch were "
            "tuned for that)"
        )


def _dump(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def _value(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _length_note(spec: Spec) -> str:
    """The header's line on the run's length when mindformers.yaml leaves it to the base."""
    return (
        ""
        if spec.stated("train", "total_steps")
        else UNSTATED_LENGTH.format(steps=spec.train.total_steps)
    )


def document(
    spec: Spec, c: Candidate, trial: dict, base_path: str | None = None
) -> tuple[str, list]:
    """``(mindformers.yaml text, changes)``; ``changes`` is empty without a base."""
    title = (
        f"# autotune export of study {json.dumps(trial['study'])}, trial {trial['number']}: "
        "MindFormers config"
    )
    tuned = overlay(spec, c)
    if base_path is None:  # a base of either kind: no key only one of them takes
        legacy = _for_mcore(tuned)
        knob_lines = "".join(
            f"#   {name:<13} -> {knob.mindformers}\n" for name, knob in KNOBS.items()
        )
        header = (
            f"{title} overlay.\n"
            "# Set base_config to your model's MindFormers config (absolute, or relative to this\n"
            "# file's folder): MindFormers merges this file over it. Or export again with\n"
            "# --mindformers-base YOUR.yaml to get the complete config, in which recompute lists\n"
            f"# keyed by stage (select_comm_recompute: [..]) are re-derived for pp = {c.pp}.\n"
            + device_notes(spec, c)
            + _length_note(spec)
            + _legacy_note(legacy)
            + "# docs/mindformers.md says why each key is set. Knobs map to:\n"
            + knob_lines
        )
        return header + _dump({BASE_CONFIG: UNSET_BASE, **tuned}), []
    base = load_config(base_path)
    _check_base(spec, base, str(base_path))
    if is_mcore(base):
        _for_mcore(tuned)
    base_optimizer = (base.get("parallel") or {}).get("parallel_optimizer_config")
    if isinstance(base_optimizer, dict) and "parallel_optimizer_threshold" in base_optimizer:
        # the base's own threshold stays (ours is only MindFormers' default)
        tuned["parallel"].pop("parallel_optimizer_config", None)
    interleave = pipeline_interleave(str(base_path))  # LayerSetting's: 1 unless it acts
    if interleave > 1:  # the tuned lists per (interleave, stage) chunk, as the base's
        tuned["recompute_config"].update(recompute_lists(spec, c, interleave))
    rederived = {
        key: value
        for key, value in stage_lists(base, spec.model.num_layers, c.pp).items()
        if key.split(".", 1)[1] not in tuned["recompute_config"]
    }  # the model.yaml's win
    for key, value in rederived.items():
        tuned["recompute_config"][key.split(".", 1)[1]] = value
    merged, changes = merge(tuned, base, replace=True)
    lines = "".join(
        f"#   {ch['key']}: {_value(ch['old']) if 'old' in ch else '(absent)'} -> "
        f"{_value(ch['new'])}\n"
        for ch in changes
    )
    header = (
        f"{title}:\n#   {Path(base_path).resolve()}\n"
        "# with the tuned settings merged in by MindFormers' own rule (docs/mindformers.md).\n"
        + device_notes(spec, c)
        + _length_note(spec)
        + "# Changed, old -> new:\n"
        + lines
    )
    if rederived:
        header += (
            f"# Re-derived for pp = {c.pp} (each stage recomputes the base's layers of its span):"
            f" {', '.join(rederived)}\n"
        )
    staged = [
        f"recompute_config.{key}"
        for key, value in recompute_lists(spec, c).items()
        if isinstance(value, list)
    ]
    if staged:
        header += (
            f"# Per stage of pp = {c.pp}, the layers model.recompute_layers marks (what the "
            f"study priced): {', '.join(staged)}\n"
        )
    held = kept(merged, tuned)
    if held:
        header += (
            "# Kept from the base, not tuned (they change layout, memory or schedule):\n"
            + "".join(f"#   {key}: {_value(value)}\n" for key, value in held)
        )
    return header + _dump(merged), changes
