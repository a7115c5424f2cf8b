"""A real CPU study of a tiny Qwen3 (heads 16 wide over a hidden size of 32, q/k norms) read from
MindFormers' own mcore config, through autotune's trainer in dp, tp and pp; its export handed to
MindFormers 1.9's own config loader and model-config builder (slow tier)."""

import json

import optuna
import pytest
import yaml

import autotune
from autotune.cli import main
from tests.conftest import ROOT
from tests.export.test_mindformers_consumer import consumer

pytestmark = pytest.mark.slow

TINY_QWEN3 = ROOT / "tests" / "mindformers" / "tiny_qwen3_cpu.yaml"


def test_a_qwen3_study_on_this_cpu_in_every_layout_and_its_export(tmp_path, capsys):
    model = tmp_path / "model.yaml"
    assert (
        main(["init", "--mindformers", str(TINY_QWEN3), "--backend", "cpu", "--out", str(model)])
        == 0
    )
    data = yaml.safe_load(model.read_text())
    assert data["model"]["head_dim"] == 16 and data["model"]["qk_norm"] is True
    base = data["baseline"]
    # the layouts of 2 devices, every other knob at the config's own value
    data["search"] = {
        "space": {
            "tp": [1, 2],
            "pp": [1, 2],
            "micro_batches": 2,
            "grad_accum": base["grad_accum"],
            "fusion_mb": 64,
            "loss_scale": 65536,
            "warmup_steps": base["warmup_steps"],
            "jit_level": base["jit_level"],
            "recompute": base["recompute"],
            "parallel_optimizer": False,
        },
        "n_trials": 3,
        "sampler": "grid",
    }
    data["trial"] = {"steps": 6, "measure_after": 2, "timeout_s": 300}
    model.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(model), "--storage", storage, "--artifacts", str(tmp_path / "trials")]
    assert main([*args, "--no-confirm"]) == 0
    every = autotune.trials_frame("tiny_qwen3_cpu", storage)
    frame = every[every["outcome"] == "ok"]
    assert sorted(zip(frame["dp"], frame["tp"], frame["pp"])) == [(1, 1, 2), (1, 2, 1), (2, 1, 1)]
    assert len(every) == 4  # the grid's tp2·pp2 needs 4 devices: recorded, never run
    # float32, the same weights and micro-batches: every layout trains to the same losses
    for column in ("loss_first", "loss_last"):
        assert frame[column].max() == pytest.approx(frame[column].min(), rel=1e-4), column
    assert frame["loss_last"].max() < frame["loss_first"].min()

    out = tmp_path / "export"
    assert main(["export", "tiny_qwen3_cpu", "--storage", storage, "--out", str(out)]) == 0
    exported = out / "mindformers.yaml"
    merged = yaml.safe_load(exported.read_text())
    assert merged["use_legacy"] is False and merged["model"]["model_config"]["head_dim"] == 16
    read, built = consumer(tmp_path, [{"read": str(exported)}, {"model": str(exported)}])
    assert read["template"] is None  # MindFormers' section templates accept every key
    summary = json.loads((out / "summary.json").read_text())
    knobs = summary["knobs"]
    assert read["raw"]["parallel_config"]["model_parallel"] == knobs["tp"]
    transformer = built["transformer"]
    assert built["class"] == "Qwen3Config" and built["qk_layernorm_built"] is True
    assert built["strict"] is None  # no key the network's build refuses (a legacy llama key)
    assert (transformer["num_layers"], transformer["hidden_size"], transformer["kv_channels"]) == (
        2,
        32,
        16,
    )
    assert transformer["num_query_groups"] == 2
    assert optuna.load_study(study_name="tiny_qwen3_cpu", storage=storage).trials
