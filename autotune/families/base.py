"""A model family, and the registry of them.

Contract: a :class:`Family` is everything about a built-in model family that needs no MindSpore
— its parameters' names and shapes, how tensor parallelism splits them, the cost model's
workload, the model.yaml fields it takes beyond the common dimensions, which parameters the
parallel optimizer leaves whole, and which MindFormers architectures it stands for. :data:`FAMILIES`
maps ``model.family`` names to them; :func:`register` adds one (a name already taken is a
ValueError) and :func:`family` looks one up. Its MindSpore network is not here: the trial program
registers it under the same name (`autotune.train.models`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def four_times(hidden: int) -> int:
    """The feed-forward width of a family that does not derive its own: 4·hidden."""
    return 4 * hidden


def nothing_whole(model_cfg: dict) -> tuple[str, ...]:
    """No parameter is created with ``parallel_optimizer=False``."""
    return ()


@dataclass(frozen=True)
class Family:
    """One built-in model family (see the module doc)."""

    name: str
    meaning: str
    # {parameter name: shape} of a ``model`` section, in the order MindSpore's
    # Cell.parameters_and_names() yields them for the family's network (a test checks it)
    shapes: Callable[[dict], dict]
    # parameter-name globs (fnmatch, first match wins) → column | row | replicated
    # (`autotune.layout`); unmatched parameters are replicated
    tp_rules: dict
    workload: type  # its `autotune.families.workload.Workload` subclass
    token_input: bool = True  # a sample is a sequence of token ids, not a feature row
    default_ffn: Callable[[int], int] = four_times  # ffn_hidden_size when model.yaml omits it
    fields: tuple = ()  # model.yaml fields it takes beyond the common ones
    # globs of parameters it creates with parallel_optimizer=False, given its ``model`` section
    optimizer_whole: Callable[[dict], tuple] = nothing_whole
    # the MindFormers configs `autotune init --mindformers` reads as this family: legacy
    # ``model.arch.type`` values and mcore ``model.model_config.model_type`` values
    mindformers_architectures: tuple = ()
    mindformers_model_types: tuple = ()


FAMILIES: dict[str, Family] = {}


def register(entry: Family) -> Family:
    """Add ``entry`` to :data:`FAMILIES`; ValueError when its name is taken."""
    if entry.name in FAMILIES:
        raise ValueError(f"model family {entry.name!r} is already registered")
    FAMILIES[entry.name] = entry
    return entry


def family(name: str) -> Family:
    """The family called ``name``; ValueError naming the known ones when there is none."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"model.family: unknown built-in family {name!r} (expected one of "
            f"{', '.join(FAMILIES)})"
        ) from None


def parameter_shapes(model_cfg: dict) -> dict:
    """``{parameter name: shape tuple}`` of a built-in family's ``model`` section, in the
    network's parameter order; ValueError for a family that is not built in (a user ``entry``
    model has to be built to know its parameters)."""
    return family(model_cfg.get("family")).shapes(model_cfg)


def takes_tokens(name: str | None) -> bool:
    """Whether a model of family ``name`` takes sequences of token ids; an ``entry`` model
    (``name`` None) is taken as one of feature rows."""
    return name is not None and family(name).token_input


def owners(field: str) -> tuple[str, ...]:
    """The families whose model.yaml takes ``field``."""
    return tuple(name for name, f in FAMILIES.items() if field in f.fields)


def dense(prefix: str, out_dim: int, in_dim: int) -> dict:
    """A Dense layer's parameters: (out, in) weight, as MindSpore stores it, and its bias."""
    return {f"{prefix}.weight": (out_dim, in_dim), f"{prefix}.bias": (out_dim,)}


def layer_norm(prefix: str, dim: int) -> dict:
    """A LayerNorm's parameters."""
    return {f"{prefix}.gamma": (dim,), f"{prefix}.beta": (dim,)}
