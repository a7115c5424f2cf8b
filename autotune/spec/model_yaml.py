"""model.yaml → a typed, validated :class:`Spec` (`autotune.spec.specs`).

Contract: :func:`load_spec` either returns a fully validated spec or raises :class:`SpecError`
whose message names the file and the field path (``cluster.devices: must be ≥ 1``). It reads
files only; it never writes anything, so a bad file leaves no trace.

Sections added for configurations that come from MindFormers (``autotune init --mindformers``,
docs/mindformers.md), each optional and absent in older files: ``baseline`` (the knobs of the
configuration the user runs today, in knob names; `autotune.spec.space` makes it trial 0 and
checks the space holds it), ``cluster.max_device_memory_gb`` (MindSpore's ``max_device_memory``:
the cap the cost model screens against, with no margin on top) and ``export.mindformers_base``
(the MindFormers config ``autotune export`` merges into by default; resolved against this file).
"""

from __future__ import annotations

import math
from pathlib import Path

from autotune.spec.attention import fused_refusal
from autotune.spec.backends import BACKENDS, DEFAULT_BACKEND, ENGINES
from autotune.spec.errors import SpecError
from autotune.spec.knobs import JIT_LEVELS, KNOBS, RECOMPUTE_MODES
from autotune.spec.model_section import parse_model
from autotune.spec.objectives import OBJECTIVES
from autotune.spec.programs import program_of, read_trial
from autotune.spec.specs import (
    DEFAULT_MIN_STEPS,
    DEFAULT_PRECISION,
    DEFAULT_TOTAL_STEPS,
    ClusterSpec,
    SearchSpec,
    Spec,
    TrainSpec,
    TrialSpec,
)
from autotune.spec.yaml_file import load_yaml

# search.sampler's names, the CLI's --sampler choices: `autotune.search.samplers.make_sampler`
# builds each (it imports this tuple; spec never imports search)
SAMPLERS = ("auto", "tpe", "random", "grid", "cmaes", "nsga2", "gp")
DEFAULT_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "default.yaml"


class _Section:
    """Reads typed fields out of one mapping, naming ``section.field`` in every error."""

    def __init__(self, data, path: str, source: str):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise SpecError(f"{source}: {path}: must be a mapping")
        self.data, self.path, self.source = data, path, source
        self.used: set[str] = set()

    def fail(self, key: str, message: str):
        raise SpecError(f"{self.source}: {self.path}.{key}: {message}")

    def get(self, key, kind, default=..., minimum=None, choices=None):
        self.used.add(key)
        if key not in self.data or self.data[key] is None and default is not ...:
            if default is ...:
                self.fail(key, "is required")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is float and isinstance(value, float) and not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {value}")
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            self.fail(key, f"must be {names}, got {value!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be ≥ {minimum}, got {value}")
        if choices is not None and value not in choices:
            self.fail(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def reject_unknown(self):
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            self.fail(unknown[0], "unknown field")


def load_spec(path: str | Path, overrides: dict | None = None) -> Spec:
    """Load and validate a model.yaml. ``overrides`` replace fields by dotted path first
    (``{"search.n_trials": 4, "study": "S"}``), so CLI flags get the same validation."""
    path = Path(path)
    data = load_yaml(path)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return parse_spec(data, path)


def parse_spec(data: dict, path: Path, stored: bool = False) -> Spec:
    """The Spec of model.yaml ``data`` read from ``path``. ``stored``: the copy a study keeps
    (export): what only a search needs — the search-space file, importing the entry model — is
    not read, so a study exports on a machine without them."""
    source = str(path)
    top = _Section(data, "", source)
    top.path = "<top>"
    study = top.get("study", str, default=path.stem)
    if not study.strip() or "/" in study:
        top.fail("study", "must be a non-empty name without '/'")
    model = parse_model(_Section(data.get("model"), "model", source), path.parent, stored)
    top.used.add("model")
    train = _parse_train(_Section(data.get("train"), "train", source))
    top.used.add("train")
    cluster = _parse_cluster(_Section(data.get("cluster"), "cluster", source), path.parent)
    top.used.add("cluster")
    runs = BACKENDS[cluster.backend].compute_dtypes
    for name in ("dtype", "param_dtype", "optimizer_dtype"):
        if getattr(model, name) not in runs:
            raise SpecError(
                f"{source}: model.{name}: {getattr(model, name)} does not run on "
                f"backend {cluster.backend} (it runs {', '.join(runs)})"
            )
    if model.flash_attention and BACKENDS[cluster.backend].fused_attention and fused_refusal(model):
        raise SpecError(
            f"{source}: model.flash_attention: {fused_refusal(model)} (backend "
            f"{cluster.backend} runs the fused operator)"
        )
    search = _parse_search(_Section(data.get("search"), "search", source), path.parent, stored)
    top.used.add("search")
    trial = _parse_trial(_Section(data.get("trial"), "trial", source), path.parent, stored)
    top.used.add("trial")
    baseline = _parse_baseline(_Section(data.get("baseline"), "baseline", source))
    top.used.add("baseline")
    export = _Section(data.get("export"), "export", source)
    base = export.get("mindformers_base", str, default=None)
    export.reject_unknown()
    top.used.add("export")
    unknown = sorted(set(data) - top.used)
    if unknown:
        raise SpecError(f"{source}: {unknown[0]}: unknown field")
    base = str((path.parent / base).resolve()) if base else None
    spec = Spec(study, model, train, cluster, search, trial, source, data, baseline, base)
    program_of(spec).check(spec, stored)
    return spec


def _parse_baseline(s: _Section) -> dict:
    """``baseline:`` → {knob: value}, each value of its knob's type (the space checks the rest)."""
    choices = {"jit_level": JIT_LEVELS, "recompute": RECOMPUTE_MODES}
    for name in s.data:
        if name not in KNOBS:
            s.fail(name, f"unknown knob (known: {', '.join(KNOBS)})")
    return {
        name: s.get(
            name, knob.kind, choices=choices.get(name), minimum=None if knob.kind is not int else 0
        )
        for name, knob in KNOBS.items()
        if name in s.data
    }


def _parse_train(s: _Section) -> TrainSpec:
    t = TrainSpec(
        s.get("global_batch_size", int, minimum=1),
        s.get("learning_rate", float, default=1e-3),
        s.get("total_steps", int, default=DEFAULT_TOTAL_STEPS, minimum=1),
        s.get("save_every", int, default=1000, minimum=1),
    )
    if not t.learning_rate > 0:
        s.fail("learning_rate", f"must be > 0, got {t.learning_rate}")
    s.reject_unknown()
    return t


def _parse_cluster(s: _Section, base: Path) -> ClusterSpec:
    backend = s.get("backend", str, default=DEFAULT_BACKEND, choices=tuple(BACKENDS))
    devices = s.get("devices", int, minimum=1)
    per_node = s.get("devices_per_node", int, default=min(devices, 8), minimum=1)
    memory = s.get("device_memory_gb", float, default=None)
    cap = s.get("max_device_memory_gb", float, default=None)
    for name, value in (("device_memory_gb", memory), ("max_device_memory_gb", cap)):
        if value is not None and not value > 0:
            s.fail(name, f"must be > 0, got {value}")
    device = s.get("device", (str, dict), default=None)
    if devices > per_node and devices % per_node:
        s.fail("devices", f"{devices} devices do not fill whole nodes of {per_node}")
    # the table itself is read when a search starts (autotune.execution.replay), not here: an
    # export of a replay study re-reads this file without needing the table
    replay = s.get("replay", str, default=None)
    pool = s.get("pool_devices", int, default=None, minimum=devices)
    engine = s.get("replay_engine", str, default=None, choices=ENGINES)
    reads_table = BACKENDS[backend].kind == "table"
    if reads_table and replay is None:
        s.fail("replay", f"is required with backend {backend}: a CSV of measured candidates")
    for name, value in (("replay", replay), ("pool_devices", pool), ("replay_engine", engine)):
        if not reads_table and value is not None:
            s.fail(name, f"is read by backend replay only (backend is {backend})")
    s.reject_unknown()
    return ClusterSpec(
        backend,
        devices,
        per_node,
        memory,
        device,
        str((base / replay).resolve()) if replay else None,
        pool,
        cap,
        engine,
    )


def _parse_search(s: _Section, base: Path, stored: bool = False) -> SearchSpec:
    raw = s.get("space", (str, dict), default=str(DEFAULT_SPACE))
    if isinstance(raw, str) and stored:
        space, source = {}, f"{(base / raw).resolve()} (not read: a stored study's spec)"
    elif isinstance(raw, str):
        file = (base / raw).resolve()
        space, source = load_yaml(file), str(file)
    else:
        space, source = raw, f"{s.source}: search.space"
    objectives = s.get("objectives", (list, str), default=["goodput"])
    objectives = [objectives] if isinstance(objectives, str) else objectives
    if not objectives or len(set(objectives)) != len(objectives):
        s.fail("objectives", "must list distinct objectives")
    for name in objectives:
        if name not in OBJECTIVES:
            s.fail("objectives", f"unknown objective {name!r} (use {', '.join(OBJECTIVES)})")
    search = SearchSpec(
        space=space,
        space_source=source,
        n_trials=s.get("n_trials", int, default=12, minimum=1),
        sampler=s.get("sampler", str, default="auto", choices=SAMPLERS),
        objectives=tuple(objectives),
        seed=s.get("seed", int, default=None),
    )
    s.reject_unknown()
    return search


def _parse_trial(s: _Section, base: Path, stored: bool = False) -> TrialSpec:
    steps = s.get("steps", int, default=30, minimum=1)
    measure_after = s.get("measure_after", int, default=5, minimum=0)
    if measure_after >= steps:
        s.fail("measure_after", f"must be < trial.steps ({steps}), got {measure_after}")
    timeout_s = s.get("timeout_s", float, default=600.0)
    if not timeout_s > 0:
        s.fail("timeout_s", f"must be > 0, got {timeout_s}")
    precision = s.get("precision", float, default=DEFAULT_PRECISION)
    if not 0 < precision < 1:
        s.fail(
            "precision",
            f"must be > 0 and < 1 (a share of the mean step time: 0.02 is ±2 %), got {precision}",
        )
    measured = steps - measure_after
    # an interval needs two steps; a trial shorter than the default measures every step
    min_steps = s.get("min_steps", int, default=max(2, min(DEFAULT_MIN_STEPS, measured)), minimum=2)
    if min_steps > max(2, measured):
        s.fail(
            "min_steps",
            f"must be ≤ {max(2, measured)} (trial.steps − trial.measure_after = "
            f"{measured} measured steps), got {min_steps}",
        )
    program = read_trial(s, base, stored)
    s.reject_unknown()
    return TrialSpec(steps, measure_after, timeout_s, precision, min_steps, **program)
