"""What the trial program refuses in a config: the checks it runs before it launches anything.

Contract: :func:`check_config` raises :class:`~autotune.train.config.ConfigError`, its message
naming the field, for a config the driver should have kept from the program — a section or key
missing (:data:`REQUIRED`, and every knob not added later), a backend that runs no program or
not the model's dtype, a knob value outside its choices, cp or ulysses above 1 (the trainer splits no
sequence), a layout the model or its experts cannot take, a batch the split does not divide, or
a ``trial`` section whose steps or stop rule are out of range. It returns None for any other
config, and imports nothing of MindSpore.
"""

from autotune import layout
from autotune.spec.backends import BACKENDS, DEFAULT_BACKEND
from autotune.spec.knobs import KNOBS, batch_split_problems
from autotune.train.config import ConfigError

REQUIRED = {
    "model": ("family",),
    "train": ("global_batch_size", "learning_rate", "total_steps"),
    "trial": ("steps", "measure_after"),
}


def _required_knobs() -> tuple:
    """Every knob but those added later (a config written before one omits it: its default)."""
    return tuple(name for name, knob in KNOBS.items() if not knob.added_later)


def check_config(cfg: dict) -> None:
    """Raise ConfigError for what the driver should have prevented; messages name the field."""
    if "out_dir" not in cfg:
        raise ConfigError("out_dir: missing")
    for section, keys in {**REQUIRED, "knobs": _required_knobs()}.items():
        if not isinstance(cfg.get(section), dict):
            raise ConfigError(f"{section}: missing")
        for key in keys:
            if key not in cfg[section]:
                raise ConfigError(f"{section}.{key}: missing")
    knobs, model, train, trial = cfg["knobs"], cfg["model"], cfg["train"], cfg["trial"]
    backend = cfg.get("backend", DEFAULT_BACKEND)
    if backend not in BACKENDS or not BACKENDS[backend].runs_program:
        raise ConfigError(f"backend: {backend!r} cannot run a training program")
    for name, knob in KNOBS.items():
        if knob.choices and name in knobs and knobs[name] not in knob.choices:
            raise ConfigError(
                f"knobs.{name}: {knobs[name]!r} is not one of {', '.join(knob.choices)}"
            )
    dtype = model.get("dtype", "float32")
    if dtype not in BACKENDS[backend].compute_dtypes:
        raise ConfigError(
            f"model.dtype: {dtype!r} does not run on backend {backend!r} "
            f"(it runs {', '.join(BACKENDS[backend].compute_dtypes)})"
        )
    for knob in ("cp", "ulysses"):  # the trainer splits no sequences, nor their heads
        if knobs.get(knob, 1) > 1:
            raise ConfigError(
                f"knobs.{knob}: {knobs[knob]}: the trial program runs no context parallelism "
                "(it splits no sequence over devices); study it on cluster.backend simulate"
            )
    ep = knobs.get("ep", 1)
    if (knobs["tp"] > 1 or knobs["pp"] > 1 or ep > 1) and model.get("entry"):
        raise ConfigError("knobs.tp/pp/ep: a model.entry network runs with tp = pp = ep = 1")
    if ep > 1 and (model.get("num_experts") or 0) < 2:
        raise ConfigError(f"knobs.ep: {ep}: the model has no experts to split")
    if ep > 1 and (knobs["dp"] * knobs["tp"]) % ep:
        raise ConfigError(f"knobs.ep: {ep} does not divide dp·tp = {knobs['dp'] * knobs['tp']}")
    if model.get("entry") is None:
        reasons = layout.builtin_layout_reasons(model, knobs["tp"], knobs["pp"], ep)
        if reasons:
            raise ConfigError(f"knobs: {reasons[0]}")
    split = batch_split_problems(
        global_batch_size=train["global_batch_size"],
        **{k: knobs[k] for k in ("dp", "pp", "micro_batches", "grad_accum")},
    )
    if split:
        field, reason = split[0]
        raise ConfigError(f"{field}: {reason}")
    if not 0 <= trial["measure_after"] < trial["steps"]:
        raise ConfigError("trial.measure_after: must be >= 0 and < trial.steps")
    if ("precision" in trial) != ("min_steps" in trial):
        raise ConfigError("trial.precision/min_steps: give both or neither")
    if "precision" in trial and not 0 < trial["precision"] < 1:
        raise ConfigError("trial.precision: must be > 0 and < 1")
    if "min_steps" in trial and trial["min_steps"] < 2:
        raise ConfigError("trial.min_steps: must be >= 2 (an interval needs two steps)")
