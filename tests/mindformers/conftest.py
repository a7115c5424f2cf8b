"""What the MindFormers trial tests share: the tiny CPU llama as a study whose trials are
MindFormers runs, and where MindFormers' venv is."""

import os
import sys
from pathlib import Path

import pytest
import yaml

from autotune.spec.mindformers_init import init_text
from tests.conftest import ROOT

HERE = ROOT / "tests" / "mindformers"
TINY = HERE / "tiny_llama_cpu.yaml"  # 2 layers of width 64 over MindFormers' Llama 3.1 8B config
RUN_MINDFORMER = HERE / "run_mindformer.py"  # r1.8.0's, vendored (its LICENSE)
MF_PYTHON = ROOT / ".venv-mindformers" / "bin" / "python"


def mf_python() -> str:
    """MindFormers' interpreter (``make mindformers``); skips, or fails under
    AUTOTUNE_REQUIRE_MINDFORMERS=1 (CI), without it."""
    if not MF_PYTHON.exists():
        if os.environ.get("AUTOTUNE_REQUIRE_MINDFORMERS") == "1":
            pytest.fail(f"{MF_PYTHON} is missing: make test-slow creates it (make mindformers)")
        pytest.skip("MindFormers' venv is absent: make mindformers")
    return str(MF_PYTHON)


def mindformers_model(
    folder: Path, python: str | None = None, base: Path = TINY, **settings
) -> Path:
    """A model.yaml of ``base`` (``autotune init --mindformers … --backend cpu``) whose trials
    are MindFormers runs on a synthetic dataset; ``settings``: dotted keys to set
    (``{"trial.steps": 6}``). ``python``: MindFormers' interpreter (any existing file for what
    never runs it: the spec checks that it is there)."""
    out = folder / "model.yaml"
    text, _ = init_text(base, out, backend="cpu")
    data = yaml.safe_load(text)
    data["trial"] = {
        "program": "mindformers",
        "run_mindformer": str(RUN_MINDFORMER),
        "python": python or sys.executable,
        "data": "synthetic",
    }
    for dotted, value in settings.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
