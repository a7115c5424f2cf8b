"""The two mixture-of-experts simulate examples as a user runs them: a study of Qwen3-30B-A3B on
64 Ascend 910B and of DeepSeek-V3 on 2,048 H800 searches ep, tp, pp, micro-batches and recompute
around the published layout, and its closing table names the best layout beside it."""

import re

import pytest

from autotune.cli import main
from tests.conftest import ROOT

EXAMPLES = {
    "qwen3": (ROOT / "examples" / "qwen3_30b_a3b_64dev_simulate.yaml", {"tp": 4, "pp": 4, "ep": 4}),
    "deepseek": (
        ROOT / "examples" / "deepseek_v3_2048dev_simulate.yaml",
        {"tp": 1, "pp": 16, "ep": 64},
    ),
}


def _row(out: str, knob: str) -> list[str]:
    """The values of ``knob``'s row of the closing table: (best, baseline)."""
    line = next(line for line in out.splitlines() if re.match(rf"│ {knob}\s+│", line))
    return [cell.strip() for cell in line.strip("│").split("│")[1:]]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_study_names_its_best_layout_beside_the_published_one(tmp_path, capsys, name):
    path, published = EXAMPLES[name]
    storage = f"sqlite:///{tmp_path}/s.db"
    code = main(["search", str(path), "--storage", storage, "--trials", "12"])
    out = capsys.readouterr().out
    assert code == 0
    assert "#0 baseline" in out
    for knob, value in published.items():
        best, baseline = _row(out, knob)
        assert baseline == str(value) and best.isdigit()
    assert _row(out, "cp") == ["1", "1"]  # 4,096 tokens: not a long sequence
