"""Every knob of KNOBS has what each side needs: the trial program applies it, the cost model
prices it (or its entry says why it cannot), each export document writes it — each by a hook
registered under the knob's name, or a stated place that handles it — and its entry's domain,
default space and Candidate field agree (Optuna's tests/samplers_tests style: one test per knob
and side). A knob added without one of these fails here, naming the knob and the side."""

import importlib
import inspect
import re

import pytest

import autotune.export.configs  # noqa: F401  (registers launch.yaml's writers)
import autotune.mindformers.config  # noqa: F401  (registers mindformers.yaml's writers)
import autotune.train.step.engine  # noqa: F401  (registers the trial program's hooks)
from autotune.costmodel.knob_pricing import PRICES
from autotune.export.knob_writers import DOCUMENTS
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import KNOBS, KnobHooks
from autotune.spec.model_yaml import DEFAULT_SPACE
from autotune.spec.space import parse_domain
from autotune.spec.yaml_file import load_yaml
from autotune.train.knob_hooks import APPLIES

BUILT_IN = tuple(KNOBS)
SIDES = {
    "trial program": APPLIES,
    "cost model": PRICES,
    **{f"export {name}": hooks for name, hooks in DOCUMENTS.items()},
}


def gaps(name: str) -> list[str]:
    """What knob ``name`` lacks, one line per side (empty: it has everything)."""
    knob, missing = KNOBS[name], []
    for side, hooks in SIDES.items():
        if side == "cost model" and not knob.estimable:
            if not knob.unestimated_because:
                missing.append("cost model: not estimable, and unestimated_because is empty")
            if name in PRICES.hooks:
                missing.append("cost model: not estimable, yet a pricing hook is registered")
        elif not hooks.handles(name):
            missing.append(f"{side}: no hook registered under {name!r} and no stated place")
    return missing


def place_handles(name: str, where: str) -> bool:
    """Whether the function ``where`` ("module:qualname") names knob ``name`` in its source."""
    module, qualname = where.split(":")
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return re.search(rf"\b{name}\b", inspect.getsource(target)) is not None


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_side_handles_the_knob(name):
    assert gaps(name) == []


@pytest.mark.parametrize("side", SIDES)
def test_a_stated_place_handles_its_knob_and_says_why(side):
    for name, (where, why) in SIDES[side].places.items():
        assert why, f"{side}: {name}: no reason stated"
        assert place_handles(name, where), f"{side}: {name}: {where} does not name the knob"


@pytest.mark.parametrize("side", SIDES)
def test_hooks_are_registered_for_knobs_only(side):
    hooks = SIDES[side]
    assert set(hooks.hooks) | set(hooks.places) <= set(KNOBS)
    assert all(callable(hook) for hook in hooks.hooks.values())


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_entry_states_domain_default_space_field_and_graphs(name):
    knob = KNOBS[name]
    assert knob.graphs in ("all", "update", "none")
    # the default space file says what the entry says, and parses as the knob's domain
    assert load_yaml(DEFAULT_SPACE)[name] == knob.default_space
    values = parse_domain(name, knob.default_space, "default space")
    assert values == ("auto",) or knob.default in values
    if knob.kind is str:
        assert set(values) <= set(knob.choices)
    # the knob is a Candidate field, its value the default where nothing else is given
    defaults = {n: k.default for n, k in KNOBS.items()}
    assert getattr(Candidate(**defaults), name) == knob.default
    if not knob.added_later:  # a candidate without it is no candidate
        with pytest.raises(TypeError, match=f"missing knob.*{name}"):
            Candidate(**{n: v for n, v in defaults.items() if n != name})


def test_a_gap_is_found():
    """The checks above can fail: a side without the knob is named."""
    hooks = KnobHooks("a side")
    hooks.in_place("tp", "autotune.spec.constraints:violations", "the layout")
    assert hooks.handles("tp") and not hooks.handles("dp")
    assert place_handles("tp", "autotune.spec.constraints:violations")
    assert not place_handles("recompute", "autotune.spec.constraints:violations")
    with pytest.raises(ValueError, match="registered already"):
        hooks.register("tp")(print)
    saved = APPLIES.places.pop("fusion_mb")
    try:
        assert gaps("fusion_mb") == [
            "trial program: no hook registered under 'fusion_mb' and no stated place"
        ]
    finally:
        APPLIES.places["fusion_mb"] = saved
