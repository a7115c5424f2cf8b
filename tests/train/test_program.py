"""The real trial program as the driver runs it: ``python -m autotune.train`` and msrun."""

import json
import math
import sys

import pytest

from autotune.execution.runner import free_port
from autotune.train import PROGRAM_PATH
from autotune.train.metrics import METRIC_KEYS
from tests.conftest import BIN, ROOT, make_config, run, train

# multi-process proofs: make test-slow
pytestmark = pytest.mark.slow


def test_transformer_fp16_learns_without_overflow(tmp_path):
    metrics, steps = train(
        tmp_path, "t", knobs={"loss_scale": 2**10, "grad_accum": 2, "recompute": "selective"}
    )
    assert tuple(metrics) == METRIC_KEYS
    assert metrics["steps"] == len(steps) == 30 and [s["step"] for s in steps] == list(range(30))
    assert metrics["overflow_steps"] == 0 and metrics["applied_steps"] == 30
    assert metrics["loss_last"] < 0.8 * metrics["loss_first"] and not metrics["diverged"]
    assert metrics["goodput"] == pytest.approx(
        metrics["throughput"] * (1 - metrics["underflow_share"])
    )
    assert metrics["samples_per_step"] == 16 and metrics["peak_memory_mb"] > 0
    assert 0 < metrics["compile_s"] < 120 and metrics["step_time_ms"] > 0
    assert steps[0]["loss"] == metrics["loss_first"]


def test_huge_initial_loss_scale_overflows_and_backs_off(tmp_path):
    metrics, steps = train(tmp_path, "o", knobs={"loss_scale": 2**24}, steps=10)
    assert metrics["overflow_steps"] > 0
    assert metrics["overflow_steps"] == sum(s["overflow"] for s in steps)
    # final_loss at equal updates: the trial runs until 10 were applied
    assert metrics["applied_steps"] == 10
    assert metrics["steps"] == len(steps) == 10 + metrics["overflow_steps"]
    assert metrics["final_loss_scale"] == 2.0**24 / 2 ** metrics["overflow_steps"]
    assert steps[0]["overflow"] and steps[0]["loss_scale"] == 2.0**24
    # the leading overflows are the initial back-off, charged once over train.total_steps
    k = next(i for i, s in enumerate(steps) if not s["overflow"])
    assert metrics["backoff_steps"] == k > 2  # some of them measured steps
    settled = [s["overflow"] for s in steps[k:]]
    assert metrics["overflow_rate"] == pytest.approx(sum(settled) / len(settled))
    assert metrics["goodput"] == pytest.approx(
        metrics["throughput"]
        * (1 - metrics["overflow_rate"])
        * (1 - k / 10000)
        * (1 - metrics["underflow_share"])
    )


def test_a_scale_that_keeps_overflowing_stops_at_the_update_cap(tmp_path):
    from autotune.train.program import UPDATE_CAP

    # float16's largest finite value is 65504: every step at 2^40 overflows for 20+ halvings
    metrics, steps = train(tmp_path, "c", knobs={"loss_scale": 2**40}, steps=8)
    assert metrics["steps"] == len(steps) == UPDATE_CAP * 8
    assert metrics["applied_steps"] < 8


def test_mlp_fp32_learns(tmp_path):
    metrics, _ = train(
        tmp_path, "m", model={"family": "mlp", "dtype": "float32"}, knobs={"recompute": "full"}
    )
    assert metrics["loss_last"] < 0.9 * metrics["loss_first"] and not metrics["diverged"]
    assert metrics["overflow_steps"] == 0 and metrics["final_loss_scale"] == 1.0


def test_pynative_matches_graph(tmp_path):
    common = {"model": {"dtype": "float32"}, "steps": 3}
    graph, _ = train(tmp_path, "g", knobs={"grad_accum": 2}, **common)
    eager, _ = train(
        tmp_path,
        "p",
        knobs={"grad_accum": 2, "jit_level": "pynative", "recompute": "full"},
        **common,
    )
    assert eager["loss_first"] == pytest.approx(graph["loss_first"], rel=1e-5)
    assert eager["loss_last"] == pytest.approx(graph["loss_last"], rel=1e-4)


def test_user_entry_model(tmp_path):
    entry = f"{ROOT / 'examples' / 'user_model.py'}:build"
    metrics, _ = train(tmp_path, "u", model={"entry": entry, "family": None, "num_classes": 5})
    assert metrics["loss_last"] < 0.8 * metrics["loss_first"]


def test_bad_config_exits_2_with_one_line(tmp_path):
    code, _, err = run(
        [sys.executable, "-m", "autotune.train", make_config(tmp_path, knobs={"tp": 3})]
    )
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "autotune.train: ConfigError: knobs: tp = 3 does not divide "
        "embed.tok.embedding_table dim 0 (64)"
    )


def test_failure_exits_1_with_one_line(tmp_path):
    user = tmp_path / "short.py"
    user.write_text(
        "import numpy as np\nfrom mindspore import nn\n"
        "def build(config):\n"
        "    data = lambda step, shard, n: (np.zeros((3, 4), np.float32), np.zeros(3, np.int32))\n"
        "    return nn.Dense(4, 2), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean'), data\n"
    )
    code, _, err = run(
        [
            sys.executable,
            "-m",
            "autotune.train",
            make_config(tmp_path / "f", model={"entry": f"{user}:build"}),
        ]
    )
    assert code == 1
    assert (
        err.strip().splitlines()[-1]
        == "autotune.train: ValueError: dataset(0, 0, 1) returned 3 samples, expected 16"
    )


def test_data_parallel_under_msrun(tmp_path):
    """dp=2, fp16 with overflowing steps, accumulation: ranks agree bit for bit, and match dp=1."""
    knobs = {"dp": 2, "grad_accum": 2, "loss_scale": 2**20, "fusion_mb": 1}
    out = tmp_path / "dp2"
    config = make_config(out, knobs=knobs, steps=8)
    code, _, err = run(
        [
            BIN / "msrun",
            "--worker_num=2",
            "--local_worker_num=2",
            f"--master_port={free_port()}",
            f"--log_dir={out / 'logs'}",
            "--join=True",
            PROGRAM_PATH,
            config,
        ]
    )
    assert code == 0, err[-3000:]
    assert (out / "logs" / "worker_0.log").exists() and (out / "logs" / "worker_1.log").exists()
    ranks = [json.loads((out / f"metrics.rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    metrics = json.loads((out / "metrics.json").read_text())
    # 8 applied updates: the overflowed steps come on top
    assert metrics["overflow_steps"] > 0 and metrics["applied_steps"] == 8
    assert metrics["steps"] == 8 + metrics["overflow_steps"]
    assert metrics["peak_memory_mb"] == max(r["peak_memory_mb"] for r in ranks)
    # the same micro-batches (fp16 overflow depends on their size) in one process: same trajectory
    single, _ = train(tmp_path, "dp1", knobs={"loss_scale": 2**20, "grad_accum": 4}, steps=8)
    assert single["overflow_steps"] == metrics["overflow_steps"]
    assert math.isclose(single["loss_last"], metrics["loss_last"], rel_tol=1e-3)


BF16_STEP = """
import sys
import mindspore as ms
from autotune.train.models import entry
from autotune.train.runtime import session
from autotune.train.step import engine, train_step as step

ms.set_device(sys.argv[1])
ms.set_context(mode=ms.GRAPH_MODE)
session.numpy2_workaround(ms)
config = {"seed": 0, "train": {"global_batch_size": 4},
          "model": {"family": "transformer", "entry": None, "num_layers": 1, "hidden_size": 16, "num_heads": 2,
                    "ffn_hidden_size": 32, "seq_length": 8, "vocab_size": 32}}
network, loss_fn, dataset = entry.build(config)
step.set_compute_dtype(network, ms.bfloat16)
optimizer = engine.make_optimizer(network.trainable_params(), 1e-3)
_, apply = step.build_steps(network, loss_fn, optimizer, accum_steps=1, scaling=False, loss_scale=1)
x, y = dataset(0)
loss, _, _ = apply(ms.Tensor(x), ms.Tensor(y))
print("loss", float(loss.asnumpy()))
"""


def test_bfloat16_follows_the_backend_rule(tmp_path):
    """One bfloat16 training step on every backend this machine has (CPU): whether it runs is
    what the cpu backend's compute_dtypes (and so model.yaml validation) must say."""
    from autotune.spec.backends import BACKENDS

    script = tmp_path / "bf16.py"
    script.write_text(BF16_STEP)
    code, out, err = run([sys.executable, script, "CPU"])
    ran = code == 0 and out.startswith("loss ")
    assert ran == ("bfloat16" in BACKENDS["cpu"].compute_dtypes), (out + err)[-2000:]
    if not ran:  # and it fails for the reason the rule states
        assert "Unsupported data type" in err
