"""The device check's step 10 as far as this CPU takes it (slow tier): its study of the tiny mcore
Qwen3-MoE (tests/mindformers/tiny_qwen3_moe_mindformers.yaml) built as the device check builds it
for Ascend, and each of its four trials' config (dp2, dp2·ep2, tp2, tp2·ep2) handed to MindFormers
1.9 in its venv: its loader and section templates, its mcore model config and the strict
conversion its weight template runs (the MoE keys it knows), the TransformerConfig's expert
parallelism, its LayerSetting over that config, and the global batch its trainer computes. What
only a device shows (the trials' runs: semi-auto parallel, the all-to-all dispatch) is the device
check's, on Ascend."""

import subprocess
import sys

import pytest

from autotune.mindformers.trial import trial_document
from autotune.spec.constraints import violations
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.conftest import ROOT
from tests.export.test_mindformers_consumer import consumer
from tests.mindformers.conftest import mf_python

pytestmark = pytest.mark.slow


PRELUDE = (
    "import sys; from pathlib import Path; sys.path[:0] = sys.argv[1:3]; "
    "import device_check_mindformers as d; from autotune.spec.backends import BACKENDS; "
    "folder = Path(sys.argv[3]); "
)


def device_check(tmp_path, code: str) -> list[str]:
    """The lines ``code`` prints with the device check's module as ``d`` and ``folder`` =
    ``tmp_path``, in a process of its own (no test imports a benchmark)."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, str(ROOT / "benchmarks"), str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_the_device_checks_moe_trials_are_configs_mindformers_builds(tmp_path):
    mf_python()
    # the device check's own model.yaml for 2 Ascend devices
    model, grid = device_check(
        tmp_path,
        "space = {'tp': [1, 2], 'ep': [1, 2], **{k: [v] for k, v in d.FIXED_QWEN3.items()}}; "
        "print(d._model(folder, BACKENDS['ascend'], 2, space, d.TINY_QWEN3_MOE)); "
        "print(d.MOE_GRID)",
    )[-2:]
    assert grid == "((1, 1), (1, 2), (2, 1), (2, 2))"  # (tp, ep): dp2, dp2·ep2, tp2, tp2·ep2
    grid = ((1, 1), (1, 2), (2, 1), (2, 2))
    spec = load_spec(model)
    assert (spec.model.num_experts, spec.model.experts_per_token) == (4, 2)
    assert spec.model.sequence_parallel and spec.trial.program == "mindformers"
    baseline = build_space(spec).baseline()
    jobs = []
    for tp, ep in grid:
        c = baseline.replace(dp=2 // tp, tp=tp, ep=ep)
        assert violations(spec, c) == [], (tp, ep)  # autotune runs every one
        path = tmp_path / f"tp{tp}-ep{ep}.yaml"
        path.write_text(trial_document(spec, c, 0, tmp_path / f"t{tp}{ep}")[0])
        jobs += [
            {"read": str(path)},
            {"model": str(path)},
            {"layers": str(path)},
            {"batch": str(path), "device_num": 2},
        ]
    results = consumer(tmp_path, jobs)
    for n, (tp, ep) in enumerate(grid):
        read, built, layers, batch = results[4 * n : 4 * n + 4]
        where = (tp, ep)
        assert read["template"] is None, (where, read["template"])
        parallel = read["raw"]["parallel_config"]
        assert (parallel["data_parallel"], parallel["model_parallel"]) == (2 // tp, tp), where
        assert parallel["expert_parallel"] == ep and parallel["use_seq_parallel"] == (tp > 1)
        assert read["raw"]["parallel"]["enable_alltoall"] == (ep > 1), where
        assert built["class"] == "Qwen3MoeConfig" and built["strict"] is None, (where, built)
        t = built["transformer"]
        assert (t["num_moe_experts"], t["moe_router_topk"]) == (4, 2), where
        assert "error" not in layers and layers["layer_list"] == [[2]], (where, layers)
        assert batch["global_batch_size"] == spec.train.global_batch_size, (where, batch)


def test_the_device_checks_mcore_qwen3_study_is_written_for_ascend(tmp_path):
    """Step 9's tiny mcore Qwen3 computes in float32 for this CPU; on Ascend the device check
    layers bfloat16 over it (its flash attention runs no float32), so its model.yaml is valid
    there and MindFormers 1.9 builds its config computing in bfloat16."""
    mf_python()
    model = device_check(
        tmp_path,
        "space = {'tp': [1, 2], **{k: [v] for k, v in d.FIXED_QWEN3.items()}}; "
        "print(d._model(folder, BACKENDS['ascend'], 2, space, d.bfloat16(d.TINY_QWEN3, folder)))",
    )[-1]
    spec = load_spec(model)
    assert spec.model.dtype == "bfloat16" and spec.model.flash_attention
    baseline = build_space(spec).baseline()
    path = tmp_path / "tp2.yaml"
    path.write_text(trial_document(spec, baseline.replace(dp=1, tp=2), 0, tmp_path / "t")[0])
    read, built = consumer(tmp_path, [{"read": str(path)}, {"model": str(path)}])
    assert read["template"] is None and built["strict"] is None, (read, built)
    assert built["transformer"]["compute_dtype"] in ("bfloat16", "mstype.bfloat16", "BFloat16")
