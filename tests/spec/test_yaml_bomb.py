"""A YAML alias bomb is refused at once, naming the node budget."""

import subprocess
import sys

import pytest

from autotune.spec.errors import SpecError
from autotune.spec.yaml_file import load_yaml
from tests.conftest import ROOT

LEVELS = "abcdefghi"


def bomb(indent: str = "") -> str:
    """Nine levels of nine-fold aliases (9^9 = 387,420,489 leaves), a few hundred bytes."""
    lines = [f"{LEVELS[0]}: &{LEVELS[0]} [{', '.join(['x'] * 9)}]"]
    for lower, level in zip(LEVELS, LEVELS[1:]):
        lines.append(f"{level}: &{level} [{', '.join([f'*{lower}'] * 9)}]")
    return "".join(f"{indent}{line}\n" for line in lines)


MODEL = """study: bomb
cluster: {backend: cpu, devices: 1}
model:
  entry: m.py:build
  shapes:
"""


def test_validate_refuses_an_alias_bomb_under_an_entry_models_keys(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL + bomb("    "))
    (tmp_path / "m.py").write_text("def build(config):\n    return None\n")
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "its aliases expand it to more than 1,000,000 YAML nodes (the node budget" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_load_yaml_refuses_a_bomb_and_a_node_that_contains_itself(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("study: b\n" + bomb())
    with pytest.raises(SpecError, match="more than 1,000,000 YAML nodes"):
        load_yaml(path)
    path.write_text("study: b\nloop: &l\n  again: *l\n")
    with pytest.raises(SpecError, match="line 2: an alias refers to a node that contains it"):
        load_yaml(path)


def test_shared_nodes_within_the_budget_and_duplicates_are_judged_as_before(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {tp: 2, pp: 1}\none: *b\ntwo: *b\n")
    assert load_yaml(path) == {
        "base": {"tp": 2, "pp": 1},
        "one": {"tp": 2, "pp": 1},
        "two": {"tp": 2, "pp": 1},
    }
    path.write_text("a: 1\nb:\n  c: 1\n  c: 2\n")
    with pytest.raises(SpecError, match="line 4: 'c' is given twice in one mapping"):
        load_yaml(path)
