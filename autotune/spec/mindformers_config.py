"""A MindFormers training config → the sections of a model.yaml (``autotune init --mindformers``).

Contract: :func:`read_config` reads a MindFormers config (its ``base_config`` chain resolved,
`autotune.spec.mindformers_file`) and returns a :class:`Reading`: ``model``, ``train``,
``cluster`` and ``baseline`` as ordered ``(key, value, where it came from)`` rows, the search
space that holds the baseline, and the warnings. It writes nothing. Every key is decided as the
table in docs/mindformers.md ("autotune init --mindformers") says, each rule read from
MindFormers' source:

- a model autotune cannot represent (MoE, multi-latent attention, ``head_dim`` ≠ hidden/heads,
  q/k layernorm, context parallelism) is a :class:`SpecError` naming the key (exit 2), and so is
  a missing or ill-typed key the reading needs;
- a setting that is dropped or fixed (sequence parallelism, ``fine_grain_interleave``, per-layer
  recompute lists, an uneven ``offset``, ``qkv_concat``, qkv biases, ``micro_batch_interleave_num``
  > 1, tied embeddings, …) is one warning line naming the key and what autotune does instead.
- FFN width: ``intermediate_size``, else MindFormers' ``LlamaFeedForward`` rule
  (`autotune.shapes.llama_ffn`: ``multiple_of``, ``ffn_dim_multiplier``).
- global batch (``_check_global_batch_size_for_auto_parallel``, ``mindformers/trainer/
  base_trainer.py``): ``runner_config.batch_size`` (over a dataset's) × dp × ``micro_batch_num``
  with pipeline stages, else × ``gradient_accumulation_steps``; × ``micro_batch_interleave_num``
  under semi-auto/auto parallel. ``devices`` other than the config's dp·mp·pp keep that global
  batch and scale dp.
- warmup: ``warmup_ratio`` × total steps when the ratio is given (``_get_lr_steps``, ``mindformers/
  core/lr/lr_schedule.py``), else ``warmup_steps``; total steps from ``lr_schedule.total_steps``
  or ``total_steps`` (required when the config says -1, "the dataset's length").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from autotune.shapes import llama_ffn
from autotune.spec.errors import SpecError
from autotune.spec.knobs import JIT_LEVELS, LOSS_SCALED_DTYPES
from autotune.spec.mindformers_file import load_config

# model_config keys: MindFormers' legacy LlamaConfig name first, then the mcore name.
_NAMES = {"num_layers": ("num_layers", "num_hidden_layers"),
          "hidden_size": ("hidden_size",),
          "num_heads": ("num_heads", "num_attention_heads"),
          "num_kv_heads": ("n_kv_heads", "num_key_value_heads"),
          "vocab_size": ("vocab_size",),
          "seq_length": ("seq_length",)}
_DEVICES = {"ascend": "ascend", "gpu": "gpu", "cpu": "cpu"}  # context.device_target → backend
_SCREENED_ON = {"ascend": ("ascend", "simulate"), "gpu": ("gpu", "simulate"), "cpu": ()}
_PROFILE = {"ascend": "ascend-910b"}  # the published configs' "Atlas 800T A2"
_SEMI_AUTO = (1, 2, "semi_auto_parallel", "auto_parallel")


@dataclass
class Reading:
    """model.yaml sections read from a MindFormers config; each row (key, value, source)."""

    source: str
    study: str
    model: list = field(default_factory=list)
    train: list = field(default_factory=list)
    cluster: list = field(default_factory=list)
    baseline: list = field(default_factory=list)
    space: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # lines for the written file's header


class _Config:
    """Typed access to the merged config, naming ``file: dotted.key`` in every error."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def fail(self, key: str, message: str):
        raise SpecError(f"{self.source}: {key}: {message}")

    def get(self, dotted: str, default=None):
        node = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return default if node is None else node

    def number(self, dotted: str, kind=int, default=..., minimum=None):
        value = self.get(dotted, default if default is not ... else None)
        if value is None:
            self.fail(dotted, "is required")
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            self.fail(dotted, f"must be {'a number' if kind is float else 'an integer'}, "
                              f"got {value!r}")
        if minimum is not None and value < minimum:
            self.fail(dotted, f"must be ≥ {minimum}, got {value}")
        return value

    def first(self, names: tuple, default=...):
        """(model_config key found, its integer value) among ``names``."""
        for name in names:
            if self.get(f"model.model_config.{name}") is not None:
                key = f"model.model_config.{name}"
                return key, self.number(key, minimum=1)
        if default is ...:
            self.fail(f"model.model_config.{names[0]}", "is required")
        return None, default


def read_config(path, devices: int | None = None, devices_per_node: int | None = None,
                backend: str | None = None, total_steps: int | None = None) -> Reading:
    """Read the MindFormers config at ``path`` (see the module doc)."""
    path = Path(path)
    cfg = _Config(load_config(path), str(path))
    reading = Reading(str(path), str(cfg.get("trainer.model_name", path.stem)))
    _refuse(cfg)
    _read_model(cfg, reading)
    dp, tp, pp = (cfg.number(f"parallel_config.{k}", default=1, minimum=1)
                  for k in ("data_parallel", "model_parallel", "pipeline_stage"))
    own = dp * tp * pp
    devices = own if devices is None else devices
    if devices != own:
        if devices % (tp * pp):
            raise SpecError(f"--devices {devices}: not a multiple of the config's model_parallel × "
                            f"pipeline_stage = {tp * pp} (dp is scaled, tp and pp kept)")
        reading.notes.append(f"--devices {devices}, not the config's {own}: the global batch is "
                             f"kept and dp scaled from {dp} to {devices // (tp * pp)}")
    _read_train(cfg, reading, dp, pp, total_steps)
    _read_cluster(cfg, reading, devices, devices == own, devices_per_node, backend)
    _read_baseline(cfg, reading, dp, devices // (tp * pp), tp, pp)
    reading.space = _space(dict((k, v) for k, v, _ in reading.baseline))
    return reading


def _refuse(cfg: _Config) -> None:
    """SpecError for a model autotune's llama family cannot represent."""
    mc = "model.model_config"
    experts = [(k, cfg.get(k)) for k in ("moe_config.expert_num", f"{mc}.num_experts",
                                         f"{mc}.num_moe_experts", f"{mc}.n_routed_experts")]
    for key, value in experts:
        if isinstance(value, int) and value > 1:
            cfg.fail(key, f"{value} experts: mixture-of-experts models cannot be represented "
                          "(autotune's llama family is dense)")
    for key in (f"{mc}.multi_latent_attention", f"{mc}.q_lora_rank", f"{mc}.kv_lora_rank"):
        if cfg.get(key) not in (None, False):
            cfg.fail(key, "multi-latent attention cannot be represented")
    for key in (f"{mc}.qk_layernorm", f"{mc}.qk_norm", f"{mc}.use_qk_norm"):
        if cfg.get(key) is True:
            cfg.fail(key, "q/k layernorm cannot be represented (autotune's llama has none)")
    _, hidden = cfg.first(_NAMES["hidden_size"])
    heads_key, heads = cfg.first(_NAMES["num_heads"])
    for key in (f"{mc}.head_dim", f"{mc}.kv_channels"):
        value = cfg.get(key)
        if value is not None and value * heads != hidden:
            cfg.fail(key, f"{value} ≠ hidden_size / {heads_key.rsplit('.', 1)[1]} = "
                          f"{hidden / heads:g}: autotune's heads are hidden / heads wide")
    if cfg.get("parallel_config.context_parallel", 1) != 1:
        cfg.fail("parallel_config.context_parallel", f"{cfg.get('parallel_config.context_parallel')}:"
                 " context parallelism is not a knob autotune has (its devices have no layout)")


def _read_model(cfg: _Config, r: Reading) -> None:
    mc = "model.model_config"
    r.model.append(("family", "llama", "RMSNorm, SwiGLU, rotary embeddings (LlamaForCausalLM)"))
    dims = {name: cfg.first(names) for name, names in _NAMES.items() if name != "num_kv_heads"}
    for name in ("num_layers", "hidden_size", "num_heads"):
        r.model.append((name, dims[name][1], dims[name][0]))
    kv_key, kv = cfg.first(_NAMES["num_kv_heads"], default=None)
    if kv is not None and kv != dims["num_heads"][1]:
        r.model.append(("num_kv_heads", kv, f"{kv_key} (grouped-query attention)"))
    ffn = cfg.get(f"{mc}.intermediate_size")
    if ffn is not None:
        r.model.append(("ffn_hidden_size", cfg.number(f"{mc}.intermediate_size", minimum=1),
                        f"{mc}.intermediate_size"))
    else:
        multiple = cfg.number(f"{mc}.multiple_of", default=256, minimum=1)
        factor = cfg.get(f"{mc}.ffn_dim_multiplier")
        if factor is not None:
            factor = cfg.number(f"{mc}.ffn_dim_multiplier", float)
        r.model.append(("ffn_hidden_size", llama_ffn(dims["hidden_size"][1], multiple, factor),
                        f"MindFormers' LlamaFeedForward rule: multiple_of {multiple}, "
                        f"ffn_dim_multiplier {factor}"))
    for name in ("seq_length", "vocab_size"):
        r.model.append((name, dims[name][1], dims[name][0]))
    compute = _dtype(cfg, f"{mc}.compute_dtype", "float16")
    params = _dtype(cfg, f"{mc}.param_init_type", "float32", f"{mc}.params_dtype")
    r.model += [("dtype", compute, f"{mc}.compute_dtype"),
                ("param_dtype", params, f"{mc}.param_init_type"),
                ("optimizer_dtype", "float32", f"optimizer.type {cfg.get('optimizer.type')}: "
                 "MindFormers' AdamW and FP32StateAdamWeightDecay keep float32 moments"),
                ("flash_attention", cfg.get(f"{mc}.use_flash_attention", False) is True,
                 f"{mc}.use_flash_attention")]
    _warn_model(cfg, r)


def _dtype(cfg: _Config, key: str, default: str, other: str | None = None) -> str:
    value = cfg.get(key, cfg.get(other) if other else None) or default
    if value not in ("float16", "bfloat16", "float32"):
        cfg.fail(key, f"must be float16, bfloat16 or float32, got {value!r}")
    return value


def _warn_model(cfg: _Config, r: Reading) -> None:
    mc = "model.model_config"
    checks = (
        (f"{mc}.qkv_concat", True, "fused w_qkv: the trial runs wq, wk, wv apart (same work); "
         "exported parameter names are the unfused ones"),
        (f"{mc}.qkv_has_bias", True, "q/k/v biases dropped (the trial's llama has none; "
         "their work and memory are negligible)"),
        (f"{mc}.fine_grain_interleave", "> 1", "dropped: the trial does not interleave "
         "communication with compute inside a layer"),
        (f"{mc}.tie_word_embeddings", True, "the trial's head is untied (one more vocab × "
         "hidden matrix)"),
        ("parallel_config.use_seq_parallel", True, "dropped: autotune's tensor parallelism "
         "keeps activations whole between layers; priced so"),
        ("micro_batch_interleave_num", "> 1", "counted in the global batch; the trial and "
         "the export run 1"),
    )
    for key, when, what in checks:
        value = cfg.get(key)
        hit = value is True if when is True else isinstance(value, int) and value > 1
        if hit:
            r.warnings.append(f"{key}: {value}: {what}")
    offset = cfg.get(f"{mc}.offset", 0)
    if offset not in (0, [], None) and any(_flatten(offset)):
        r.warnings.append(f"{mc}.offset: {offset}: layers are split evenly over the stages")


def _flatten(value) -> list:
    return [x for v in value for x in _flatten(v)] if isinstance(value, list) else [value]


def _read_train(cfg: _Config, r: Reading, dp: int, pp: int, total: int | None) -> None:
    batch_key = "runner_config.batch_size"
    if cfg.get(batch_key) is None:  # runner_config's wins over a dataset's
        batch_key = "train_dataset.batch_size"
    batch = cfg.number(batch_key, minimum=1)
    interleave = cfg.number("micro_batch_interleave_num", default=1, minimum=1)
    semi = cfg.get("parallel.parallel_mode", 1) in _SEMI_AUTO
    if pp > 1:
        split, n = "parallel_config.micro_batch_num", cfg.number("parallel_config.micro_batch_num",
                                                                 default=1, minimum=1)
    else:
        split, n = ("runner_config.gradient_accumulation_steps",
                    cfg.number("runner_config.gradient_accumulation_steps", default=1, minimum=1))
    factor = interleave if semi else 1
    r.train.append(("global_batch_size", batch * dp * n * factor,
                    f"{batch_key} {batch} × data_parallel {dp} × {split.rsplit('.', 1)[1]} {n}"
                    + (f" × micro_batch_interleave_num {interleave}" if semi else "")))
    lr_key = "lr_schedule.learning_rate" if cfg.get("lr_schedule.learning_rate") is not None \
        else "optimizer.learning_rate"
    r.train.append(("learning_rate", float(cfg.number(lr_key, float)), lr_key))
    steps_key = "lr_schedule.total_steps"
    config_total = cfg.get(steps_key, -1)
    if total is None:
        if not isinstance(config_total, int) or config_total < 1:
            cfg.fail(steps_key, f"is {config_total} (the dataset's length): pass --total-steps T")
        total, where = config_total, steps_key
    else:
        where = "--total-steps"
    r.train.append(("total_steps", total, where))
    ratio = cfg.get("lr_schedule.warmup_ratio")
    if ratio is not None:
        ratio = cfg.number("lr_schedule.warmup_ratio", float)
        r.baseline.append(("warmup_steps", int(total * ratio),
                           f"lr_schedule.warmup_ratio {ratio} × total steps {total}"))
    else:
        r.baseline.append(("warmup_steps", cfg.number("lr_schedule.warmup_steps", default=0,
                                                      minimum=0), "lr_schedule.warmup_steps"))
    for callback in cfg.get("callbacks", []) or []:
        if isinstance(callback, dict) and callback.get("type") == "CheckpointMonitor" \
                and isinstance(callback.get("save_checkpoint_steps"), int):
            r.train.append(("save_every", callback["save_checkpoint_steps"],
                            "callbacks: CheckpointMonitor.save_checkpoint_steps"))


def _memory_gb(cfg: _Config, key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9.]+)\s*(GB|MB)\s*", str(value), re.IGNORECASE)
    if not match:
        cfg.fail(key, f"expected a size such as \"58GB\", got {value!r}")
    number = float(match.group(1))
    return number / 1024 if match.group(2).upper() == "MB" else number


def _read_cluster(cfg: _Config, r: Reading, devices: int, own: bool, per_node: int | None,
                  backend: str | None) -> None:
    target = str(cfg.get("context.device_target", "Ascend")).lower()
    if target not in _DEVICES:
        cfg.fail("context.device_target", f"unknown device {target!r}")
    backend = backend or _DEVICES[target]
    r.cluster += [("backend", backend, "--backend" if backend != _DEVICES[target]
                   else "context.device_target"),
                  ("devices", devices, "parallel_config: data_parallel × model_parallel × "
                   "pipeline_stage" if own else "--devices (dp scaled)"),
                  ("devices_per_node", per_node or min(devices, 8),
                   "--devices-per-node" if per_node else "8 per node (Atlas 800T A2)")]
    if backend in _SCREENED_ON[target]:
        if target in _PROFILE:
            r.cluster.append(("device", _PROFILE[target], f"context.device_target {target}"))
        cap = _memory_gb(cfg, "context.max_device_memory")
        if cap is not None:
            r.cluster.append(("max_device_memory_gb", cap,
                              "context.max_device_memory: the cap the estimate screens against"))


def _read_baseline(cfg: _Config, r: Reading, own_dp: int, dp: int, tp: int, pp: int) -> None:
    rows = [("dp", dp, "parallel_config.data_parallel" if dp == own_dp else "scaled to --devices"),
            ("tp", tp, "parallel_config.model_parallel"),
            ("pp", pp, "parallel_config.pipeline_stage")]
    knob, key = (("micro_batches", "parallel_config.micro_batch_num") if pp > 1 else
                 ("grad_accum", "runner_config.gradient_accumulation_steps"))
    n = cfg.number(key, default=1, minimum=1)
    if dp != own_dp and n * own_dp % dp == 0:  # the same global batch over the scaled dp
        r.notes.append(f"{knob}: {n} × {own_dp} / {dp} = {n * own_dp // dp} ({key} scaled with "
                       "dp, so the global batch stays)")
        n, key = n * own_dp // dp, f"{key} scaled with dp"
    rows.append((knob, n, key))
    rows.append(("recompute", _recompute(cfg, r), "recompute_config"))
    rows.append(("parallel_optimizer", cfg.get("parallel.enable_parallel_optimizer") is True,
                 "parallel.enable_parallel_optimizer"))
    dtype = next(v for k, v, _ in r.model if k == "dtype")
    scale = cfg.get("runner_wrapper.scale_sense")
    if dtype in LOSS_SCALED_DTYPES and isinstance(scale, dict):
        key = "runner_wrapper.scale_sense.loss_scale_value"
        value = cfg.number(key, minimum=1)
        if value & (value - 1):
            cfg.fail(key, f"{value} is not a power of two (the loss_scale knob's values are)")
        rows.append(("loss_scale", value, key))
    elif dtype in LOSS_SCALED_DTYPES and scale is not None:
        r.warnings.append(f"runner_wrapper.scale_sense: {scale}: a fixed scale; the baseline "
                          "uses a dynamic one from the knob's default")
    mode = cfg.get("context.mode", 0)
    jit = cfg.get("context.jit_config.jit_level")
    if mode in (1, "PYNATIVE_MODE"):
        rows.append(("jit_level", "pynative", "context.mode 1"))
    elif jit is not None:
        if jit not in JIT_LEVELS:
            cfg.fail("context.jit_config.jit_level", f"must be one of {', '.join(JIT_LEVELS)}, "
                                                      f"got {jit!r}")
        rows.append(("jit_level", jit, "context.jit_config.jit_level"))
    r.baseline[:0] = rows


def _recompute(cfg: _Config, r: Reading) -> str:
    full, select = cfg.get("recompute_config.recompute"), cfg.get("recompute_config.select_recompute")
    for key, value in (("recompute", full), ("select_recompute", select)):
        if isinstance(value, (list, dict)):
            r.warnings.append(f"recompute_config.{key}: {value}: per-layer lists are not "
                              "represented; the baseline applies it to every layer")
    if full is True or isinstance(full, list) and any(_flatten(full)):
        return "full"
    if select is True or isinstance(select, (list, dict)) and select:
        return "selective"
    return "none"


def _space(base: dict) -> dict:
    """The search space init writes: the default space's values plus the baseline's."""
    def powers(top: int) -> list:
        return [2 ** e for e in range(int(math.log2(max(top, 8))) + 1)]

    space = {"tp": sorted({1, 2, 4, 8, base["tp"]}), "pp": sorted({1, 2, 4, base["pp"]}),
             "micro_batches": sorted(set(powers(base.get("micro_batches", 8)))
                                     | {base.get("micro_batches", 1)}),
             "grad_accum": sorted({1, 2, 4, 8, base.get("grad_accum", 1)})}
    if "loss_scale" in base:
        exponent = int(math.log2(base["loss_scale"]))
        space["loss_scale"] = {"pow2": [min(8, exponent), max(24, exponent)]}
    warmup = base["warmup_steps"]
    space["warmup_steps"] = sorted({0, warmup // 2, warmup, 2 * warmup}) if warmup else \
        {"low": 0, "high": 2000, "step": 100}
    return space
