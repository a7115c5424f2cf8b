"""``autotune init --mindformers CONFIG.yaml``: a commented model.yaml from a MindFormers config.

Contract: :func:`init_text` returns ``(model.yaml text, warnings)`` for the config
(`autotune.spec.mindformers_config.read_config` decides every key), writing nothing. The text
names on each line the config key (or flag) its value came from, states in its header the
config, the warnings and any ``--devices`` rescaling, holds ``baseline:`` (the config's own
settings in knob names), an inline search space that contains the baseline, and
``export.mindformers_base`` (the config's path, relative to ``out``'s folder, absolute when it
is not under it) so ``autotune export`` merges into it. absolute when the config is not under that folder). The text is validated as a model.yaml would be (`parse_spec`, the
space and its baseline: `autotune.spec.space.build_space`) before it is returned: what it
returns runs; else a :class:`SpecError` naming the field. A model autotune's trainer does not
build (`autotune.families.moe.TRAINER_UNBUILT`: MTP modules, a capacity factor, …) on a device
backend, with neither ``backend`` nor ``run_mindformer`` given, is written for ``simulate``,
one note saying why and how to run it. With ``run_mindformer`` it has a
``trial:`` section (``program: mindformers``, the script, MindFormers' interpreter, the data),
else one header line saying how to get one (:func:`how_to_run`).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from autotune.families.moe import trainer_unbuilt
from autotune.spec.backends import backend_of
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_config import read_config
from autotune.spec.mindformers_trial import find_mindformers_python
from autotune.spec.model_yaml import parse_spec
from autotune.spec.programs import MindFormers
from autotune.spec.space import build_space


def _flow(value) -> str:
    return (
        yaml.safe_dump(value, default_flow_style=True, width=1000, sort_keys=False)
        .strip()
        .removesuffix("\n...")
        .removesuffix("...")
        .strip()
    )


COMMENT_COLUMN = 48  # a longer value (a list of layers) puts its comment right after it


def _section(name: str, rows: list) -> list[str]:
    width = min(COMMENT_COLUMN, max(len(f"{k}: {_flow(v)}") for k, v, _ in rows)) + 2
    lines = [f"{name}:"]
    for key, value, source in rows:
        text = f"{key}: {_flow(value)}"
        lines.append(f"  {text.ljust(width - 1)} # {source}")
    return lines


def trial_lines(run_mindformer: str, python: str | None, synthetic: bool) -> tuple[list, list]:
    """(header lines, ``trial:`` section lines) making every trial a MindFormers run:
    ``run_mindformer.py`` in the interpreter given or found beside it
    (`autotune.spec.mindformers_trial.find_mindformers_python`)."""
    script = Path(run_mindformer).expanduser().absolute()
    if not script.is_file():
        raise SpecError(f"--run-mindformer {script}: no such file")
    interpreter, versions = find_mindformers_python(script, python)
    mindformers, mindspore = versions.split()
    header = [
        f"# Trials are MindFormers runs of this config: {script}",
        f"# in {interpreter} (mindformers {mindformers}, mindspore {mindspore}).",
    ]
    rows = [
        ("program", MindFormers.name, "--run-mindformer"),
        ("run_mindformer", str(script), "--run-mindformer"),
        ("python", interpreter, "--mindformers-python" if python else "found beside it"),
        (
            "data",
            "synthetic" if synthetic else "config",
            "--synthetic-data" if synthetic else "the config's train_dataset",
        ),
    ]
    return header, _section("trial", rows)


# What init says, in one line, when the trials are not MindFormers runs (:func:`how_to_run`).
HOW_TO_RUN_MINDFORMERS = (
    "trials run autotune's own trainer; to make each trial a MindFormers run of this config, "
    "add --run-mindformer PATH/run_mindformer.py [--mindformers-python PATH] [--synthetic-data]"
)
HOW_TO_RUN_SIMULATED = (
    "trials are the cost model's estimates (cluster.backend simulate); to make each a "
    "MindFormers run of this config on a device, add --backend BACKEND --run-mindformer "
    "PATH/run_mindformer.py"
)


def how_to_run(backend: str) -> str:
    """The one line init says, without ``--run-mindformer``, about what the trials are."""
    return HOW_TO_RUN_MINDFORMERS if backend_of(backend).kind == "program" else HOW_TO_RUN_SIMULATED


def init_text(
    config: str | os.PathLike,
    out: str | os.PathLike,
    devices: int | None = None,
    devices_per_node: int | None = None,
    backend: str | None = None,
    total_steps: int | None = None,
    run_mindformer: str | None = None,
    python: str | None = None,
    synthetic: bool = False,
) -> tuple[str, list[str]]:
    """(model.yaml text, warnings) for MindFormers config ``config`` written to ``out``; with
    ``run_mindformer``, a ``trial:`` section making every trial a MindFormers run (:func:`trial_lines`)."""
    config, out = Path(config), Path(out)
    if run_mindformer is None and (python is not None or synthetic):
        flag = "--mindformers-python" if python is not None else "--synthetic-data"
        raise SpecError(f"{flag}: is for MindFormers trials: pass --run-mindformer too")
    r = read_config(config, devices, devices_per_node, backend, total_steps)
    unbuilt = [key for key, _, _ in trainer_unbuilt(dict((k, v) for k, v, _ in r.model).get)]
    on = dict((key, value) for key, value, _ in r.cluster).get("backend")
    if unbuilt and backend is None and run_mindformer is None and backend_of(on).kind == "program":
        # the trainer would refuse the model on the config's device: price it instead of
        # writing a model.yaml that cannot run, and say how to run it for real
        r = read_config(config, devices, devices_per_node, "simulate", total_steps)
        why = f"the trainer does not build model.{unbuilt[0]} (NOTE above)"
        r.cluster = [(k, v, why if k == "backend" else src) for k, v, src in r.cluster]
        r.notes.append(
            f"cluster.backend simulate, not the config's {on}: autotune's trainer does not "
            f"build model.{unbuilt[0]}; add --run-mindformer to make the trials MindFormers "
            f"runs on {on}"
        )
    trial_header, trial = (
        trial_lines(run_mindformer, python, synthetic) if run_mindformer else ([], [])
    )
    relative = os.path.relpath(config.resolve(), out.resolve().parent)
    if relative.startswith(".."):  # outside out's folder: the absolute path says more
        relative = str(config.resolve())
    header = [
        f"# autotune init --mindformers {config}",
        "# Written from that MindFormers config (its base_config chain merged); each value",
        "# names the key it came from. docs/mindformers.md decides each key. baseline: is",
        "# the config's own settings: the study runs it first (trial 0) and prints every gain",
        "# against it. autotune export merges the tuned settings into export.mindformers_base.",
    ]
    backend_row = next(value for key, value, _ in r.cluster if key == "backend")
    header += trial_header or [f"# NOTE: {how_to_run(backend_row)}"]
    header += [f"# NOTE: {note}" for note in r.notes]
    header += [f"# WARNING: {warning}" for warning in r.warnings]
    lines = header + [f"study: {_flow(r.study)}"]
    for name in ("model", "train", "cluster", "baseline"):
        lines += _section(name, getattr(r, name))
    lines += [
        "search:",
        "  # the default space (search_spaces/default.yaml) for knobs not named here; these",
        "  # hold the baseline's values",
        "  space:",
    ]
    lines += [f"    {knob}: {_flow(domain)}" for knob, domain in r.space.items()]
    lines += trial
    lines += ["export:", f"  mindformers_base: {_flow(relative)}"]
    text = "\n".join(lines) + "\n"
    data = yaml.safe_load(text)
    try:
        build_space(parse_spec(data, out))
    except SpecError as exc:
        raise SpecError(
            f"{config}: the model.yaml it gives is not valid: {str(exc).removeprefix(f'{out}: ')}"
        ) from None
    return text, r.warnings
