"""examples/tiny_moe_cpu.yaml as a user runs it (slow tier): a real CPU study of a tiny mixture of
experts with latent attention through autotune's trainer (Ray, MindSpore, SQLite), its
expert-parallel trial exported and handed to MindFormers 1.9 (its own venv): its config loader,
section templates, parallel checks and mcore LayerSetting accept the mindformers.yaml, and its
MindSpore splits a whole checkpoint by the exported strategy.ckpt into the experts each rank
holds. That every layout trains to one process's losses is tests/train/test_moe.py's."""

import json
import subprocess

import numpy as np
import pytest
import yaml

import autotune
from autotune.cli import main
from tests.conftest import ROOT
from tests.export.test_experts import EXPERTS, MINDFORMERS_SPLIT
from tests.export.test_mindformers_consumer import FIXTURES, _venv, consumer

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "tiny_moe_cpu.yaml"
DEEPSEEK = FIXTURES / "deepseekv3_train.yaml"  # MindFormers' mcore DeepSeek-V3 (MLA + MoE) test
DEEPSEEK_JSON = ROOT / "tests" / "fixtures" / "huggingface" / "DeepSeek-V3"


def test_a_moe_study_on_this_cpu_and_its_expert_parallel_export_in_mindformers(tmp_path, capsys):
    ms = pytest.importorskip("mindspore")
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(EXAMPLE), "--storage", storage, "--artifacts", str(tmp_path / "trials")]
    assert main([*args, "--no-confirm"]) == 0
    assert "best " in capsys.readouterr().out
    every = autotune.trials_frame("tiny-moe", storage)
    frame = every[every["outcome"] == "ok"]
    # ran on this CPU, in the grid's order: the baseline dp2, the experts split over the two
    # workers (dp2·ep2), pp2, tp2 and tp2·ep2; pp2·ep2 recorded with MindFormers' reason, never run
    layouts = list(zip(frame["dp"], frame["tp"], frame["pp"], frame["ep"]))
    assert layouts == [(2, 1, 1, 1), (2, 1, 1, 2), (1, 1, 2, 1), (1, 2, 1, 1), (1, 2, 1, 2)]
    assert frame["baseline"].tolist() == [True, False, False, False, False]
    refused = every[every["outcome"] != "ok"]["detail"]
    assert refused.str.contains("ep = 2 does not divide dp·tp = 1").sum() == 1
    # each from the same weights and batches (float32): the same first loss, then learning
    assert frame["loss_first"].max() == pytest.approx(frame["loss_first"].min(), rel=1e-4)
    assert (frame["loss_last"] < frame["loss_first"]).all()
    # the experts split over the workers route the same tokens as the baseline's whole experts
    ep2 = frame[frame["ep"] == 2].iloc[0]
    assert ep2["router_imbalance"] > 1
    assert ep2["router_imbalance"] == pytest.approx(frame["router_imbalance"].iloc[0], rel=1e-4)
    # and so do the others: pp2's stages, tp2's split tokens (each rank counts its block)
    imbalance = frame["router_imbalance"].to_numpy(dtype=float)
    np.testing.assert_allclose(imbalance, imbalance[0], rtol=1e-4)

    out = tmp_path / "export"
    number = str(ep2["number"])
    assert (
        main(["export", "tiny-moe", "--storage", storage, "--out", str(out), "--trial", number])
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["trial"], summary["knobs"]["ep"], summary["knobs"]["dp"]) == (
        ep2["number"],
        2,
        2,
    )
    # the overlay over MindFormers' own DeepSeek-V3 config, its base_config set as a user would
    exported = out / "mindformers.yaml"
    overlay = yaml.safe_load(exported.read_text())
    assert overlay["parallel_config"]["expert_parallel"] == 2
    # and, as MindFormers' own test of that config does (run_deepseek3.py), the model's
    # config.json beside it: its class (DeepseekV3Config) is named there, not in the YAML
    exported.write_text(
        exported.read_text().replace("SET-ME-your-model-mindformers-config.yaml", str(DEEPSEEK))
        + f"pretrained_model_dir: {DEEPSEEK_JSON}\n"
    )
    # its loader and templates, then build_parallel_config and its trainer's two batch checks
    read, batch, layers = consumer(
        tmp_path,
        [
            {"read": str(exported)},
            {"batch": str(exported), "device_num": 2},
            {"layers": str(exported)},
        ],
    )
    assert read["template"] is None, read["template"]  # its section templates accept every key
    # the tuned dp2·ep2 over the base's dp2·tp2·pp2·ep2, its routed experts and latent attention
    parallel = read["raw"]["parallel_config"]
    assert [parallel[k] for k in ("data_parallel", "model_parallel", "pipeline_stage")] == [2, 1, 1]
    assert parallel["expert_parallel"] == 2
    assert read["raw"]["model"]["model_config"]["n_routed_experts"] > 1
    assert batch["global_batch_size"] == 16, batch  # the study's batch, as MindFormers computes it
    assert batch["batch_size"] == 16 and batch["gradient_accumulation_steps"] == 1, batch
    # its mcore layers (LayerSetting over the TransformerConfig the model is built with) place the
    # base's 4 layers on the one stage; the study's sequence parallelism is not written without
    # tp (MindFormers' ModelParallelConfig refuses it)
    assert layers == {**layers, "layer_list": [[4]]}, layers
    assert parallel["use_seq_parallel"] is False

    # MindFormers' MindSpore splits a whole checkpoint by the exported strategy: rank r holds
    # experts [2r, 2r + 2) of the 4
    from autotune.families import parameter_shapes

    model = yaml.safe_load(EXAMPLE.read_text())["model"]
    shapes = parameter_shapes(model)
    rng = np.random.default_rng(0)
    full = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    (out / "src" / "rank_0").mkdir(parents=True)
    ms.save_checkpoint(
        [{"name": n, "data": ms.Tensor(v)} for n, v in full.items()],
        str(out / "src" / "rank_0" / "full.ckpt"),
    )
    done = subprocess.run(
        [_venv(), "-c", MINDFORMERS_SPLIT, str(out), "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(held) == 2 and full[EXPERTS].shape == (4, 16, 32)
    for rank, block in enumerate(held):
        np.testing.assert_array_equal(
            np.array(block, np.float32), full[EXPERTS][2 * rank : 2 * rank + 2]
        )
