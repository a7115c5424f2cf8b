"""A MindFormers training config → the sections of a model.yaml (``autotune init --mindformers``).

Contract: :func:`read_config` reads a MindFormers config (its ``base_config`` chain resolved,
`autotune.spec.mindformers_file`) and returns a :class:`Reading`: ``model``, ``train``,
``cluster`` and ``baseline`` as ordered ``(key, value, where it came from)`` rows, the search
space that holds the baseline, and the warnings. It writes nothing. Every key is decided as the
table in docs/mindformers.md ("autotune init --mindformers") says, each rule read from
MindFormers' source:

- the model (`autotune.spec.mindformers_model`): an architecture outside the llama family's
  allow-list, PEFT, q/k layernorm on the legacy llama, an expert or latent-attention pattern
  the llama family cannot represent is a :class:`SpecError` naming the key (exit 2), and so is
  a missing or ill-typed key the reading needs; a setting that is dropped or fixed is one
  warning line naming the key;
- ``expert_parallel`` and ``context_parallel`` are the baseline's ep and cp (devices =
  dp·mp·cp·pp);
- the layout as MindFormers runs it: ``use_parallel`` false (its default) is one device
  stand-alone, ``parallel_mode`` 0 data parallel over dp·mp·pp devices, both with the
  accumulation reset to 1 (``BaseTrainer._check_grad_accumulation_steps``);
- global batch (``_check_global_batch_size_for_auto_parallel``, ``mindformers/trainer/
  base_trainer.py``): ``runner_config.batch_size`` (over a dataset's) × dp × ``micro_batch_num``
  with pipeline stages, else × ``gradient_accumulation_steps``; × ``micro_batch_interleave_num``
  under semi-auto/auto parallel. ``devices`` other than the config's dp·mp·pp keep that global
  batch and scale dp.
- warmup: ``warmup_ratio`` × total steps when the ratio is given (``_get_lr_steps``, ``mindformers/
  core/lr/lr_schedule.py``), else ``warmup_steps``; total steps: ``--total-steps``, else
  ``lr_schedule.total_steps``, else (-1) the length MindFormers derives from the dataset where
  init can count it, else null (a study prices a default; the export keeps -1), said in one
  line (`autotune.spec.mindformers_steps`).
- ``cluster.device`` for every backend; jit level O2 (deprecated) read as O1 with a warning.
- sequence parallelism, the token table under the parallel optimizer and recompute by layer as
  MindFormers runs them (`autotune.spec.mindformers_run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from autotune.spec.errors import SpecError
from autotune.spec.knobs import JIT_LEVELS, KNOBS, LOSS_SCALED_DTYPES
from autotune.spec.mindformers_cluster import read_cluster
from autotune.spec.mindformers_context import ulysses_degree
from autotune.spec.mindformers_file import load_config
from autotune.spec.mindformers_model import read_model
from autotune.spec.mindformers_run import read_run
from autotune.spec.mindformers_steps import total_steps
from autotune.spec.specs import DEFAULT_TOTAL_STEPS

_SEMI_AUTO = (1, 2, "semi_auto_parallel", "auto_parallel")


@dataclass
class _Layout:
    """The layout MindFormers runs a config with (``BaseTrainer._check_grad_accumulation_steps``,
    ``_check_global_batch_size_for_auto_parallel``): ``split`` is ``micro_batch_num`` with
    pipeline stages, else ``gradient_accumulation_steps``, each with its config key."""

    dp: int
    tp: int
    pp: int
    split: int
    split_key: str
    interleave: int  # micro_batch_interleave_num where it counts (semi-auto parallel), else 1
    source: str = "parallel_config"  # where dp, tp and pp come from
    cp: int = 1  # parallel_config.context_parallel (semi-auto parallel)
    ep: int = 1  # parallel_config.expert_parallel (semi-auto parallel)

    @property
    def split_devices(self) -> int:
        """The devices of one data-parallel replica: tp·pp·cp (ep is carved out of dp·tp)."""
        return self.tp * self.pp * self.cp


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
    """Typed access to the merged config, naming ``file: dotted.key`` in every error — and the
    file a key came from when it is not this config (an mcore model's ``config.json``):
    ``sources`` maps such a dotted key to where it was read (`autotune.spec.mindformers_mcore`)."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source
        self.sources: dict[str, str] = {}

    def label(self, key: str) -> str:
        """Where ``key``'s value came from: the key itself, or ``key (from …)``."""
        return f"{key} (from {self.sources[key]})" if key in self.sources else key

    def fail(self, key: str, message: str):
        raise SpecError(f"{self.source}: {self.label(key)}: {message}")

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
            self.fail(
                dotted, f"must be {'a number' if kind is float else 'an integer'}, got {value!r}"
            )
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


def read_config(
    path,
    devices: int | None = None,
    devices_per_node: int | None = None,
    backend: str | None = None,
    total_steps: int | None = None,
) -> Reading:
    """Read the MindFormers config at ``path`` (see the module doc)."""
    path = Path(path)
    repeated = []
    cfg = _Config(load_config(path, repeated), str(path))
    reading = Reading(str(path), str(cfg.get("trainer.model_name", path.stem)))
    reading.warnings += repeated
    read_model(cfg, reading)
    runs = _layout(cfg, reading)
    own = runs.dp * runs.split_devices
    devices = own if devices is None else devices
    if devices != own:
        if devices % runs.split_devices:
            raise SpecError(
                f"--devices {devices}: not a multiple of the config's model_parallel × "
                f"pipeline_stage{' × context_parallel' if runs.cp > 1 else ''} = "
                f"{runs.split_devices} (dp is scaled, the rest kept)"
            )
        reading.notes.append(
            f"--devices {devices}, not the config's {own}: the global batch is "
            f"kept and dp scaled from {runs.dp} to {devices // runs.split_devices}"
        )
    _read_train(cfg, reading, runs, total_steps)
    where = (
        "parallel_config: data_parallel × model_parallel × pipeline_stage"
        + (" × context_parallel" if runs.cp > 1 else "")
        if runs.source == "parallel_config"
        else runs.source
    )
    read_cluster(
        cfg,
        reading,
        devices,
        where if devices == own else "--devices (dp scaled)",
        devices_per_node,
        backend,
    )
    recompute = read_run(cfg, reading, runs.pp)
    _read_baseline(cfg, reading, runs, devices // runs.split_devices, recompute)
    reading.space = _space(dict((k, v) for k, v, _ in reading.baseline))
    return reading


def _layout(cfg: _Config, r: Reading) -> _Layout:
    """The layout MindFormers runs: ``use_parallel`` false (MindFormers' default) is one device
    stand-alone; a mode other than semi-auto/auto parallel resets ``parallel_config`` and the
    accumulation to 1, with every launched device a data-parallel rank (the config's
    dp·mp·pp); semi-auto resets the accumulation under pipeline stages."""
    dp, tp, pp = (
        cfg.number(f"parallel_config.{k}", default=1, minimum=1)
        for k in ("data_parallel", "model_parallel", "pipeline_stage")
    )
    stages = pp > 1
    key = (
        "parallel_config.micro_batch_num" if stages else "runner_config.gradient_accumulation_steps"
    )
    split = cfg.number(key, default=1, minimum=1)
    interleave = cfg.number("micro_batch_interleave_num", default=1, minimum=1)
    mode = cfg.get("parallel.parallel_mode", 1)
    if cfg.get("use_parallel", False) is not True:
        r.notes.append(
            f"use_parallel: {cfg.get('use_parallel', False)}: MindFormers runs it "
            "stand-alone on one device (parallel_config and "
            "gradient_accumulation_steps reset to 1)"
        )
        why = "use_parallel: False (stand-alone)"
        return _Layout(1, 1, 1, 1, why, 1, why)
    if mode not in _SEMI_AUTO:
        if (tp, pp, split) != (1, 1, 1):
            r.notes.append(
                f"parallel.parallel_mode: {mode}: MindFormers runs data parallel over "
                f"the {dp * tp * pp} devices, resetting model_parallel {tp}, "
                f"pipeline_stage {pp} and {key.rsplit('.', 1)[1]} {split} to 1"
            )
        why = f"parallel.parallel_mode {mode} (data parallel)"
        return _Layout(dp * tp * pp, 1, 1, 1, why, 1, why)
    cp, ep = (
        cfg.number(f"parallel_config.{k}", default=1, minimum=1)
        for k in ("context_parallel", "expert_parallel")
    )
    return _Layout(dp, tp, pp, split, key, interleave, cp=cp, ep=ep)


def _read_train(cfg: _Config, r: Reading, runs: _Layout, total: int | None) -> None:
    batch_key = "runner_config.batch_size"
    if cfg.get(batch_key) is None:  # runner_config's wins over a dataset's
        batch_key = "train_dataset.batch_size"
    batch = cfg.number(batch_key, minimum=1)
    how = (
        f"{batch_key} {batch} × data_parallel {runs.dp} × {runs.split_key.rsplit('.', 1)[1]} "
        f"{runs.split} × micro_batch_interleave_num {runs.interleave}"
        if runs.source == "parallel_config"
        else f"{batch_key} {batch} × {runs.dp} device(s): {runs.source}"
    )
    r.train.append(("global_batch_size", batch * runs.dp * runs.split * runs.interleave, how))
    lr_key = (
        "lr_schedule.learning_rate"
        if cfg.get("lr_schedule.learning_rate") is not None
        else "optimizer.learning_rate"
    )
    r.train.append(("learning_rate", float(cfg.number(lr_key, float)), lr_key))
    global_batch = next(v for k, v, _ in r.train if k == "global_batch_size")
    total, where, line = total_steps(cfg, global_batch, total)
    if line is not None:
        r.warnings.append(line)
    r.train.append(("total_steps", total, where))  # None: null, unknown here
    ratio = cfg.get("lr_schedule.warmup_ratio")
    if ratio is not None:
        ratio = cfg.number("lr_schedule.warmup_ratio", float)
        priced = total or DEFAULT_TOTAL_STEPS  # the length a study prices
        r.baseline.append(
            (
                "warmup_steps",
                int(priced * ratio),
                f"lr_schedule.warmup_ratio {ratio} × total steps {priced}",
            )
        )
    else:
        r.baseline.append(
            (
                "warmup_steps",
                cfg.number("lr_schedule.warmup_steps", default=0, minimum=0),
                "lr_schedule.warmup_steps",
            )
        )
    for callback in cfg.get("callbacks", []) or []:
        if (
            isinstance(callback, dict)
            and callback.get("type") == "CheckpointMonitor"
            and isinstance(callback.get("save_checkpoint_steps"), int)
        ):
            r.train.append(
                (
                    "save_every",
                    callback["save_checkpoint_steps"],
                    "callbacks: CheckpointMonitor.save_checkpoint_steps",
                )
            )


def _read_baseline(cfg: _Config, r: Reading, runs: _Layout, dp: int, recompute: str) -> None:
    where = {
        name: f"parallel_config.{name}" if runs.source == "parallel_config" else runs.source
        for name in ("data_parallel", "model_parallel", "pipeline_stage")
    }
    rows = [
        ("dp", dp, where["data_parallel"] if dp == runs.dp else "scaled to --devices"),
        ("tp", runs.tp, where["model_parallel"]),
        ("pp", runs.pp, where["pipeline_stage"]),
    ]
    if runs.cp > 1:
        rows.append(("cp", runs.cp, "parallel_config.context_parallel"))
        ulysses = ulysses_degree(cfg.data, runs.cp)  # `autotune.spec.mindformers_context`
        rows.append(("ulysses", ulysses, "parallel_config.ulysses_degree_in_cp & algo"))
    experts = any(k == "num_experts" for k, _, _ in r.model)
    if experts or runs.ep > 1:  # ep > 1 without experts: the constraints name it
        rows.append(("ep", runs.ep, "parallel_config.expert_parallel"))
    knob = "micro_batches" if runs.pp > 1 else "grad_accum"
    n, key = runs.split, runs.split_key
    if dp != runs.dp and n * runs.dp % dp == 0:  # the same global batch over the scaled dp
        r.notes.append(
            f"{knob}: {n} × {runs.dp} / {dp} = {n * runs.dp // dp} ({key} scaled "
            "with dp, so the global batch stays)"
        )
        n, key = n * runs.dp // dp, f"{key} scaled with dp"
    rows.append((knob, n, key))
    rows.append(
        (
            "recompute",
            recompute,
            "recompute_config (by layer: model.recompute_layers)"
            if any(k == "recompute_layers" for k, _, _ in r.model)
            else "recompute_config",
        )
    )
    if runs.source.startswith("use_parallel"):  # no parallel context is set stand-alone
        rows.append(("parallel_optimizer", False, runs.source))
    else:
        rows.append(
            (
                "parallel_optimizer",
                cfg.get("parallel.enable_parallel_optimizer") is True,
                "parallel.enable_parallel_optimizer",
            )
        )
    dtype = next(v for k, v, _ in r.model if k == "dtype")
    scale = cfg.get("runner_wrapper.scale_sense")
    if dtype in LOSS_SCALED_DTYPES and isinstance(scale, dict):
        key = "runner_wrapper.scale_sense.loss_scale_value"
        value = cfg.number(key, minimum=1)
        where = key
        if value & (value - 1):  # the knob's values are powers of two: the nearest one
            nearest = min((2**e for e in range(64)), key=lambda v: (abs(math.log2(v / value)), v))
            r.warnings.append(
                f"{key}: {value}: not a power of two, as the loss_scale knob's values are; "
                f"the baseline starts at the nearest, {nearest}"
            )
            value, where = nearest, f"{key} {value}, the nearest power of two"
        rows.append(("loss_scale", value, where))
    elif dtype in LOSS_SCALED_DTYPES and scale is not None:
        r.warnings.append(
            f"runner_wrapper.scale_sense: {scale}: a fixed scale; the baseline "
            "uses a dynamic one from the knob's default"
        )
    rows += _jit_level(cfg, r)
    r.baseline[:0] = rows


def _jit_level(cfg: _Config, r: Reading) -> list:
    mode = cfg.get("context.mode", 0)
    jit = cfg.get("context.jit_config.jit_level")
    key = "context.jit_config.jit_level"
    if mode in (1, "PYNATIVE_MODE"):
        return [("jit_level", "pynative", "context.mode 1")]
    if jit is None:
        return []
    if jit not in JIT_LEVELS:
        cfg.fail(key, f"must be one of {', '.join(JIT_LEVELS)}, got {jit!r}")
    if jit == "O2":  # docs/export.md, "What MindSpore refuses"
        r.warnings.append(
            f"{key}: O2: the GE backend, deprecated since MindSpore 2.9 and run on "
            "no backend autotune has; the baseline uses O1"
        )
        return [("jit_level", "O1", f"{key} O2, deprecated: O1")]
    return [("jit_level", jit, key)]


def _space(base: dict) -> dict:
    """The search space init writes: the default space's values plus the baseline's."""

    def powers(top: int) -> list:
        return [2**e for e in range(int(math.log2(max(top, 8))) + 1)]

    space = {
        "tp": sorted({1, 2, 4, 8, base["tp"]}),
        "pp": sorted({1, 2, 4, base["pp"]}),
        "micro_batches": sorted(
            set(powers(base.get("micro_batches", 8))) | {base.get("micro_batches", 1)}
        ),
        "grad_accum": sorted({1, 2, 4, 8, base.get("grad_accum", 1)}),
    }
    for name in ("ep", "cp", "ulysses"):  # the default space's values, and a baseline's beyond
        default = KNOBS[name].default_space
        if base.get(name, 1) not in default:
            space[name] = sorted({*default, base[name]})
    if "loss_scale" in base:
        exponent = int(math.log2(base["loss_scale"]))
        space["loss_scale"] = {"pow2": [min(8, exponent), max(24, exponent)]}
    warmup = base["warmup_steps"]
    space["warmup_steps"] = (
        sorted({0, warmup // 2, warmup, 2 * warmup})
        if warmup
        else {"low": 0, "high": 2000, "step": 100}
    )
    return space
