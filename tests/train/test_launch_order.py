"""A worker's launch order on CPU, for real: a dp2 trial under msrun, each role's log showing the
order of its first MindSpore calls (`autotune.train.runtime.device.launch_step`)."""

from pathlib import Path

import pytest

from autotune.execution.runner import run_trial
from autotune.train.runtime.device import LAUNCH_STEP

pytestmark = pytest.mark.slow


def _order(log: Path) -> list[str]:
    return [
        line.split(LAUNCH_STEP, 1)[1].strip()
        for line in log.read_text().splitlines()
        if LAUNCH_STEP in line
    ]


def test_each_role_makes_its_calls_in_order_under_msrun(tmp_path):
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
    config = {
        "study": "order",
        "trial_number": 0,
        "backend": "cpu",
        "seed": 0,
        "out_dir": str(tmp_path / "t"),
        "model": model,
        "train": {"global_batch_size": 8, "learning_rate": 1e-3, "total_steps": 100},
        "trial": {"steps": 3, "measure_after": 1},
        "knobs": {
            "dp": 2,
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
    result = run_trial(config, tmp_path / "t", 300, None, 2)
    assert result.outcome == "ok", result.detail
    logs = tmp_path / "t" / "logs"
    # the scheduler: host device, init() serves the cluster; nothing else, no op
    assert _order(logs / "scheduler.log") == ["set_device(CPU)", "communication.init()"]
    for rank in (0, 1):
        # CPU workers: the numpy-2 throw-away op before init() (Backend.first_op_before_init)
        assert _order(logs / f"worker_{rank}.log") == [
            "set_device(CPU)",
            "first op",
            "communication.init()",
        ]
