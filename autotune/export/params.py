"""The parameters an export lays out, and the TP rules that split them.

Contract:
- :func:`model_parameters` returns ``{name: shape}`` in the network's parameter order. Built-in
  families come from ``autotune.families.parameter_shapes`` (pure Python, the same names the
  trial program's network has). An ``entry`` model is loaded by `autotune.spec.entry`'s rule
  and built once by calling it with the run's config inside
  ``mindspore.nn.utils.no_init_parameters`` (shapes without allocating weights);
  the entry may return a Cell, a sequence whose first item is the Cell, or ``{"network": Cell}``.
- :func:`tp_rules` returns the ordered glob → split mapping :func:`layout.plan_layout` applies.
  An entry model's rules are ``model.tp_rules`` (validated with the spec) before the
  MindFormers defaults. Any failure is a :class:`SpecError` naming ``model.entry``.
- :func:`mcore_base` says whether the export writes MindFormers' mcore names
  (`autotune.families.mcore`): a built-in llama model whose MindFormers base config (the
  export's ``mindformers_base``) MindFormers builds on its mcore path (``use_legacy: False``,
  `autotune.spec.mindformers_file.is_mcore`, the base ``autotune init --mindformers`` read);
  then it returns the base's ``model.model_config`` over its ``pretrained_model_dir``'s
  ``config.json`` (as MindFormers merges them), else None (the legacy llama's names).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from autotune.families import family, parameter_shapes
from autotune.families.llama import MINDFORMERS_RULES
from autotune.spec import entry as entry_loader
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_file import is_mcore, load_config
from autotune.spec.mindformers_mcore import read_config_json
from autotune.spec.specs import Spec


def model_parameters(spec: Spec, run_config: dict) -> dict:
    if spec.model.family is not None:
        return parameter_shapes(asdict(spec.model))
    return _entry_parameters(spec, run_config)


def tp_rules(spec: Spec) -> dict:
    if spec.model.family is not None:
        return family(spec.model.family).tp_rules
    # the user's rules first: the first matching glob wins
    return {**spec.model.tp_rules, **MINDFORMERS_RULES}


def mcore_base(spec: Spec, base_path: str | None) -> dict | None:
    if base_path is None or spec.model.family != "llama":
        return None
    base = load_config(base_path)
    if not is_mcore(base):
        return None
    model_config = (base.get("model") or {}).get("model_config")
    model_config = model_config if isinstance(model_config, dict) else {}
    return {**_hugging_face(base), **model_config}


def _hugging_face(base: dict) -> dict:
    """The ``config.json`` of the base's ``pretrained_model_dir``, which MindFormers reads under
    the YAML's ``model_config`` (`autotune.spec.mindformers_mcore`); {} without one."""
    for folder in (
        base.get("pretrained_model_dir"),
        (base.get("model") or {}).get("pretrained_model_dir"),
    ):
        if isinstance(folder, str) and folder.strip():
            try:
                return read_config_json(folder) or {}
            except ValueError:
                return {}  # init read this base and refuses an unreadable one
    return {}


def _load_entry(spec: Spec):
    try:
        return entry_loader.load(spec.model.entry, Path(spec.source).resolve().parent)
    except entry_loader.EntryError as exc:
        raise SpecError(f"{spec.source}: {exc}") from None


def _entry_parameters(spec: Spec, run_config: dict) -> dict:
    from mindspore import nn
    from mindspore.nn.utils import no_init_parameters

    build = _load_entry(spec)
    where = f"{spec.source}: model.entry"
    try:
        with no_init_parameters():
            result = build(run_config)
    except Exception as exc:
        raise SpecError(
            f"{where}: building the network failed: {type(exc).__name__}: {exc}"
        ) from None
    options = [result]
    if isinstance(result, dict):
        options.append(result.get("network"))
    if isinstance(result, (tuple, list)) and result:
        options.append(result[0])
    network = next((o for o in options if isinstance(o, nn.Cell)), None)
    if network is None:
        raise SpecError(
            f"{where}: returned {type(result).__name__}, expected a Cell, "
            "(network, ...) or {'network': Cell}"
        )
    shapes = {}
    for param in network.get_parameters():
        shapes.setdefault(param.name, tuple(param.shape))
    if not shapes:
        raise SpecError(f"{where}: the network has no parameters")
    return shapes
