"""How the runner classifies a trial that does not end well: the real trial program, killed or
failing, one worker (no msrun) to stay fast."""

import pytest

from autotune.execution import runner
from autotune.execution.runner import run_trial
from tests.conftest import ROOT

# multi-process proofs: make test-slow
pytestmark = pytest.mark.slow


FAILING_ENTRY = """
import sys
sys.path.insert(0, {examples!r})
from user_model import build as working_build


def build(config):
    network, loss_fn, dataset = working_build(config)

    def exploding(step, shard, num_shards):
        if step == 2:
            raise RuntimeError("the data pipeline broke at step 2")
        return dataset(step, shard, num_shards)

    return network, loss_fn, exploding
"""


def config(tmp_path, entry=None, steps=4):
    model = {
        "family": "mlp",
        "entry": None,
        "num_layers": 1,
        "hidden_size": 16,
        "num_heads": 1,
        "ffn_hidden_size": 32,
        "seq_length": 1,
        "vocab_size": 8,
        "dtype": "float32",
    }
    if entry:
        model.update(family=None, entry=entry, input_size=4, num_classes=3)
    return {
        "study": "r",
        "trial_number": 0,
        "backend": "cpu",
        "seed": 0,
        "out_dir": str(tmp_path / "t"),
        "model": model,
        "train": {"global_batch_size": 8, "learning_rate": 1e-3, "total_steps": 100},
        "trial": {"steps": steps, "measure_after": 1},
        "knobs": {
            "dp": 1,
            "tp": 1,
            "pp": 1,
            "micro_batches": 1,
            "fusion_mb": 64,
            "grad_accum": 1,
            "loss_scale": 1024,
            "warmup_steps": 0,
            "jit_level": "O1",
            "recompute": "none",
        },
    }


def test_ok_trial_has_metrics(tmp_path):
    cfg = config(tmp_path, str(ROOT / "examples" / "user_model.py") + ":build", steps=20)
    cfg["train"]["learning_rate"] = 1e-2
    result = run_trial(cfg, tmp_path / "t", 300, None, 1)
    assert result.outcome == "ok", result.detail
    assert result.metrics["steps"] == 20 and result.run_s > 0


def test_failing_user_code_is_an_error_with_its_own_reason(tmp_path):
    entry = tmp_path / "failing.py"
    entry.write_text(FAILING_ENTRY.format(examples=str(ROOT / "examples")))
    result = run_trial(config(tmp_path, f"{entry}:build"), tmp_path / "t", 300, None, 1)
    assert result.outcome == "error" and not result.infrastructure  # the candidate's own
    first = result.detail.splitlines()[0]
    assert first.startswith("exit code 1: autotune.train: RuntimeError: the data pipeline broke")


def test_a_config_the_program_refuses_is_the_candidates_own_failure(tmp_path):
    cfg = config(tmp_path)
    cfg["knobs"]["recompute"] = "everything"  # refused before the launch: still the candidate's
    result = run_trial(cfg, tmp_path / "t", 300, None, 1)
    assert result.outcome == "error" and not result.infrastructure
    assert "autotune.train: ConfigError: knobs.recompute" in result.detail.splitlines()[0]


def test_a_launch_that_cannot_form_its_cluster_is_an_infrastructure_failure(tmp_path, monkeypatch):
    # msrun given a master port no socket can bind: its workers never join the cluster
    monkeypatch.setattr(runner, "free_port", lambda: 99999)
    cfg = config(tmp_path)
    cfg["knobs"]["dp"] = 2
    result = run_trial(cfg, tmp_path / "t", 120, None, 2)
    assert result.outcome == "error" and result.infrastructure, result.detail
    first = result.detail.splitlines()[0]
    assert first.startswith(
        "infrastructure: exit code 1, before the candidate ran: "
        "autotune.train: LaunchError: communication.init() failed"
    ), first


def test_a_worker_over_the_memory_budget_is_oom(tmp_path):
    result = run_trial(config(tmp_path), tmp_path / "t", 300, 60, 1)  # MindSpore alone needs more
    assert result.outcome == "oom" and "60 MB device budget" in result.detail


def test_a_trial_past_its_time_is_killed(tmp_path):
    result = run_trial(config(tmp_path, steps=100000), tmp_path / "t", 8, None, 1)
    assert result.outcome == "timeout" and result.run_s < 20
