"""docs/architecture.md stays true: it names every module, and every model family has each part
its checklist names."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_every_module_is_on_the_map():
    text = ARCHITECTURE.read_text()
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "autotune").rglob("*.py"))
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_map_names_no_module_that_is_gone():
    import re

    named = set(re.findall(r"`(autotune/[\w/]+\.py)`", ARCHITECTURE.read_text()))
    gone = sorted(n for n in named if not (ROOT / n).exists())
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


FAMILY_DIMS = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "seq_length": 8,
    "vocab_size": 64,
}


def _spec_of(tmp_path, family):
    from autotune.spec.model_yaml import load_spec

    text = {
        "model": {"family": family, **FAMILY_DIMS},
        "train": {"global_batch_size": 4, "learning_rate": 1e-3, "total_steps": 10},
        "cluster": {"backend": "cpu", "devices": 1, "devices_per_node": 1},
    }
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(text))
    return load_spec(path)


@pytest.mark.parametrize(
    "family", list(__import__("autotune.families", fromlist=["FAMILIES"]).FAMILIES)
)
def test_a_family_has_shapes_tp_rules_a_workload_and_a_network(tmp_path, family):
    """The model-family checklist: every family in autotune.families has each part it lists."""
    from autotune.costmodel.workload import workload_for
    from autotune.families import FAMILIES
    from autotune.layout import builtin_layout

    spec = _spec_of(tmp_path, family)
    config = spec.model.as_config()
    entry = FAMILIES[family]
    shapes = entry.shapes(config)
    assert shapes, f"{family}: no parameters"
    split = builtin_layout(config, 2, 1)[0]
    assert any(p.split_dim is not None for p in split.values()), (
        f"{family}: tensor parallelism splits none of its parameters (tp_rules)"
    )
    assert type(workload_for(spec.model)) is entry.workload, f"{family}: not its own workload"
    from autotune.train.models import NETWORKS, build_network

    assert family in NETWORKS, f"{family}: no network registered in autotune.train.models"
    network = build_network(config)
    names = [p.name for p in network.get_parameters()]
    assert names == list(shapes), f"{family}: the network's parameters are not its shapes'"
