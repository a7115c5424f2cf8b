"""The underflow probe never fails a trial that trained: a real float16 trial whose training fits
its memory budget and whose probe — two more passes of each micro-batch, the float32 one holding
twice the activations — does not, ends ``ok`` with its training's metrics and ``underflow_share``
null with the reason (it was ``oom``, the candidate's, remembered)."""

import json

import pytest

from autotune.execution.runner import run_trial
from tests.conftest import make_config

pytestmark = pytest.mark.slow

# measured here: this trial's training peaks at ~1.6 GB, its probe at ~3.0 GB
MODEL = {
    "num_layers": 4,
    "hidden_size": 128,
    "num_heads": 4,
    "ffn_hidden_size": 512,
    "seq_length": 64,
    "vocab_size": 256,
}
BUDGET_MB = 2200.0


def test_a_probe_over_the_memory_budget_leaves_the_share_unmeasured_and_the_trial_ok(tmp_path):
    out = tmp_path / "trial"
    config = json.loads(
        make_config(
            out, model=MODEL, batch=64, steps=4, trial={"underflow_probe": "always"}
        ).read_text()
    )
    result = run_trial(config, out, 300, BUDGET_MB, 1)
    assert result.outcome == "ok", result.detail[-2000:]
    metrics = result.metrics
    assert metrics["steps"] == 4 and metrics["peak_memory_mb"] < BUDGET_MB
    assert metrics["underflow_share"] is None and not metrics["underflow_probed"]
    assert metrics["underflow_note"].startswith(
        "the underflow probe did not finish: stopped by its launcher (oom: a worker reached"
    )
    assert result.detail == metrics["underflow_note"]
    # goodput takes the bound for the share it could not measure
    assert metrics["goodput"] == pytest.approx(
        metrics["throughput"]
        * (1 - metrics["underflow_bound"])
        * (1 - metrics["overflow_rate"])
        * (1 - metrics["backoff_steps"] / 10000)
    )
