"""MindFormers as what a trial runs (``trial.program: mindformers``): what the spec decides.

Contract (the program's entry, `autotune.spec.programs.MindFormers`, calls these):
- :func:`cpu_refusals` says why MindFormers cannot run a candidate on CPU (measured:
  docs/mindformers.md, "On CPU"): semi-auto parallel (tp or pp > 1) and the parallel optimizer.
  The export writes such a candidate's device form and refuses to launch it here; a study whose
  trials are MindFormers runs on CPU screens it as infeasible before running it.
- model.yaml's ``trial`` keys for it (docs/model-yaml.md), read by :func:`read_mindformers_keys`:
  ``run_mindformer`` and ``python`` (:func:`mindformers_path`), ``data`` (:data:`TRIAL_DATA`),
  ``register_path`` (the folder the user passes to ``run_mindformer.py --register_path``:
  absolute, or relative to ``run_mindformer.py``'s folder as that script takes it);
  :func:`check_mindformers_trial` checks, before any trial, what such a study needs: a backend
  MindFormers runs on, ``export.mindformers_base`` (the config each trial runs), a config it
  trains on that backend (no mcore config on the CPU: :data:`MCORE_ON_CPU`) and its dataset
  (:func:`dataset_problem`), or a loader a synthetic dataset can stand in for.
- :func:`mindformers_launch_line` is the line that runs an export as such a study's trials ran
  (summary.json and launch.sh's header).
- :func:`find_mindformers_python` is ``autotune init --run-mindformer``'s interpreter: the one
  given, or the first beside ``run_mindformer.py`` (or on PATH) that finds MindFormers, found
  without importing it (:func:`mindformers_versions`), or refused naming the flag.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.spec.backends import backend_of
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_file import is_mcore, load_config

if TYPE_CHECKING:
    from autotune.spec.candidate import Candidate
    from autotune.spec.specs import Spec


def cpu_refusals(c: Candidate) -> list[str]:
    """Why MindFormers cannot run ``c`` on CPU (empty: it can)."""
    reasons = []
    if c.tp > 1 or c.pp > 1 or c.ep > 1 or c.cp > 1:
        split = ", ".join(
            f"{k} = {getattr(c, k)}" for k in ("tp", "pp", "ep", "cp") if getattr(c, k) > 1
        )
        reasons.append(
            f"{split} is semi-auto parallel, which MindSpore refuses on CPU ('Invalid backend: CPU')"
        )
    if c.parallel_optimizer:
        reasons.append(
            "the parallel optimizer: MindSpore runs it in data-parallel mode on Ascend only"
        )
    return reasons


TRIAL_DATA = ("config", "synthetic")  # trial.data: the config's dataset | a generated MindRecord
# Why a MindFormers trial of an mcore config cannot run on the CPU (measured with MindFormers
# 1.9: tests/mindformers/test_mcore_trial_cpu.py; docs/mindformers.md, "What the CPU run cannot
# show"), refused before any trial rather than failing each.
MCORE_ON_CPU = (
    "an mcore config (use_legacy: False), which MindFormers 1.9 does not train on CPU (data "
    "parallel, its only mode here, resets the layout mcore needs; one rank stops at "
    "'Unsupported op [RmsNorm] on CPU'): run its trials on ascend, or with autotune's trainer "
    "(no trial.program)"
)
MIND_DATASET = "MindDataset"  # the loader run_mindformer.py --train_dataset_dir points elsewhere
MEGATRON = "BlendedMegatronDatasetDataLoader"


def mindformers_path(value: str, base: Path, stored: bool, where: str) -> str:
    """``value`` (``trial.run_mindformer`` or ``trial.python``) made absolute against the
    model.yaml's folder; a stored study's copy (export) is not checked, a search's must exist
    (the same path on every node: a node without it fails its trials' launch)."""
    path = Path(os.path.expanduser(value))
    path = path if path.is_absolute() else (base / path)
    if not stored and not (path.is_file() and os.access(path, os.R_OK)):
        raise SpecError(f"{where}: {path}: no such file")
    return str(path.absolute())


def read_mindformers_keys(s, base: Path, stored: bool) -> dict:
    """The MindFormers keys of model.yaml's ``trial`` section ``s`` (model_yaml's section
    reader, which names ``trial.<key>`` in its errors) as `autotune.spec.specs.TrialSpec`'s
    fields: ``run_mindformer`` and ``python`` required, paths absolute (a stored study's not
    checked: :func:`mindformers_path`)."""
    fields = {}
    for key in ("run_mindformer", "python"):
        value = s.get(key, str)
        fields[key] = mindformers_path(value, base, stored, f"{s.source}: trial.{key}")
    fields["data"] = s.get("data", str, default=TRIAL_DATA[0], choices=TRIAL_DATA)
    register = s.get("register_path", str, default=None)
    if register is not None:
        path = Path(os.path.expanduser(register))
        path = path if path.is_absolute() else Path(fields["run_mindformer"]).parent / path
        if not stored and not path.is_dir():
            s.fail("register_path", f"{path}: no such folder")
        fields["register_path"] = str(path.absolute())
    return fields


def check_mindformers_trial(spec: Spec, stored: bool) -> None:
    """A study whose trials are MindFormers runs: a backend MindFormers runs on, the config
    it runs (``export.mindformers_base``), and — unless ``stored`` — a config MindFormers trains
    on that backend (not an mcore one on the CPU: :data:`MCORE_ON_CPU`), its dataset there
    (:func:`dataset_problem`) or, for ``trial.data: synthetic``, a loader that takes one
    (``MindDataset``). SpecError naming the key otherwise."""
    source, trial, base = spec.source, spec.trial, spec.mindformers_base
    backend = backend_of(spec.cluster.backend)
    program = f"{source}: trial.program: {trial.program} on backend {backend.name}"
    if backend.no_mindformers:
        raise SpecError(f"{program}: {backend.no_mindformers}")
    if base is None:
        raise SpecError(
            f"{source}: export.mindformers_base: is required with trial.program "
            f"{trial.program} (the MindFormers config every trial runs; autotune init "
            "--mindformers writes it)"
        )
    if stored:
        return
    if not Path(base).is_file():
        raise SpecError(f"{source}: export.mindformers_base: {base}: no such file")
    config = load_config(base)
    if backend.mindformers_cpu_form and is_mcore(config):
        raise SpecError(f"{program}: {base}: {MCORE_ON_CPU}")
    checkout = Path(trial.run_mindformer).parent
    if trial.data == "synthetic":
        kind = _loader(config).get("type")
        if kind != MIND_DATASET:
            raise SpecError(
                f"{base}: train_dataset.data_loader.type: {kind!r}: trial.data synthetic writes "
                f"a MindRecord, which only a {MIND_DATASET} loader reads"
            )
        return
    problem = dataset_problem(config, checkout)
    if problem:
        raise SpecError(
            f"{base}: {problem} (the dataset every MindFormers trial reads, relative to "
            f"{checkout}, where trials run; or set trial.data: synthetic, autotune init "
            "--synthetic-data, for a generated one)"
        )


def mindformers_launch_line(spec: Spec, script: str) -> str:
    """The line that runs an export's mindformers.yaml as ``spec``'s MindFormers trials ran it:
    their interpreter's folder first on PATH (msrun, and the ``python`` it starts), ``launch.sh``
    (at ``script``) ``--mindformers`` their checkout."""
    python, checkout = Path(spec.trial.python), Path(spec.trial.run_mindformer).parent
    return (
        f'PATH={shlex.quote(str(python.parent))}:"$PATH" bash {shlex.quote(script)} '
        f"--mindformers {shlex.quote(str(checkout))}"
    )


def _loader(config: dict) -> dict:
    dataset = config.get("train_dataset")
    loader = dataset.get("data_loader") if isinstance(dataset, dict) else None
    return loader if isinstance(loader, dict) else {}


def dataset_problem(config: dict, checkout: Path) -> str | None:
    """What is missing of the dataset a MindFormers config trains on, as ``key: path: why``
    (None: there, or a loader whose files autotune does not know how to find): a
    ``MindDataset``'s ``dataset_dir``, a Megatron loader's ``data_path`` prefixes (``.bin`` and
    ``.idx``); a relative path is the checkout's (where ``run_mindformer.py`` runs)."""
    loader = _loader(config)
    key = "train_dataset.data_loader"
    if loader.get("type") == MIND_DATASET or "dataset_dir" in loader:
        value = loader.get("dataset_dir")
        if not value:
            return f"{key}.dataset_dir: is empty"
        path = checkout / os.path.expanduser(str(value))
        return None if path.exists() else f"{key}.dataset_dir: {path}: no such file or folder"
    if loader.get("type") == MEGATRON:
        paths = (loader.get("config") or {}).get("data_path") or []
        prefixes = [p for p in paths if isinstance(p, str)]
        if not prefixes:
            return f"{key}.config.data_path: names no dataset"
        for prefix in prefixes:
            for suffix in (".bin", ".idx"):
                path = checkout / os.path.expanduser(prefix + suffix)
                if not path.exists():
                    return f"{key}.config.data_path: {path}: no such file"
    return None


# Where MindFormers' interpreter is looked for beside run_mindformer.py (its folder and the two
# above it), then on PATH: the first that finds both packages.
VENV_PYTHONS = (".venv/bin/python", "venv/bin/python", ".venv-mindformers/bin/python")
PATH_PYTHONS = ("python3", "python")
_FINDS = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "found = [u.find_spec(p) is not None for p in ('mindformers', 'mindspore')]\n"
    "print(' '.join(m.version(p) for p in ('mindformers', 'mindspore')) if all(found) else '')\n"
)


def mindformers_versions(python: str, checkout: Path) -> str | None:
    """``"<mindformers> <mindspore>"`` versions that ``python`` finds (run in ``checkout``,
    where a source checkout's own package is found too), without importing them; None when it
    finds not both or does not run."""
    try:
        done = subprocess.run(
            [python, "-c", _FINDS], cwd=checkout, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def find_mindformers_python(run_mindformer: Path, given: str | None) -> tuple[str, str]:
    """``(interpreter, versions)`` for the trials: ``given`` (``--mindformers-python``) when it
    finds MindFormers and MindSpore, else the first interpreter that does among
    :data:`VENV_PYTHONS` in ``run_mindformer``'s folder and the two above it, then
    :data:`PATH_PYTHONS` on PATH. SpecError naming the flag when none does."""
    checkout = run_mindformer.resolve().parent
    if given is not None:
        path = Path(given).expanduser().absolute()
        versions = mindformers_versions(str(path), checkout)
        if versions is None:
            raise SpecError(
                f"--mindformers-python {path}: does not run, or finds no mindformers and "
                "mindspore packages"
            )
        return str(path), versions
    looked = [
        folder / name for folder in (checkout, *checkout.parents[:2]) for name in VENV_PYTHONS
    ]
    looked += [Path(found) for name in PATH_PYTHONS if (found := shutil.which(name))]
    for path in looked:
        if path.is_file():
            versions = mindformers_versions(str(path), checkout)
            if versions is not None:
                return str(path), versions
    raise SpecError(
        f"--run-mindformer {run_mindformer}: no Python beside it finds MindFormers (looked at "
        f"{', '.join(map(str, looked))}); pass --mindformers-python PATH, the interpreter of "
        "MindFormers' own venv"
    )
