"""The smaller verbs as a user runs them: estimate, validate, studies, compare."""

import json

import pandas as pd

import autotune
from autotune.cli import main
from tests.conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama7b_64dev_simulate.yaml")


def test_estimate_json_has_the_contracted_keys(capsys):
    assert (
        main(
            [
                "estimate",
                LLAMA,
                "--set",
                "tp=8",
                "--set",
                "pp=2",
                "--set",
                "micro_batches=16",
                "--set",
                "jit_level=O1",
                "--set",
                "recompute=selective",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for key in (
        "feasible",
        "memory_gb_per_device",
        "step_time_s",
        "samples_per_s",
        "tflops_per_device",
        "mfu",
        "breakdown",
    ):
        assert key in out, key
    assert out["candidate"]["tp"] == 8 and out["candidate"]["dp"] == 4  # 64 / (8·2)
    assert out["feasible"] is True
    assert {"compute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer", "recompute"} <= set(
        out["breakdown"]["time_s"]
    )


def test_estimate_fills_the_knobs_not_set_with_the_studys_baseline(capsys):
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    assert main(["estimate", LLAMA, "--set", "tp=8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # each knob's default (fusion 64 MB, O1, no recompute, no accumulation, one stage), not the
    # first value of its domain (fusion 1 MB, O0)
    assert out["candidate"] == {
        "dp": 8,
        "tp": 8,
        "pp": 1,
        "micro_batches": 1,
        "fusion_mb": 64,
        "grad_accum": 1,
        "loss_scale": 65536,
        "warmup_steps": 2000,
        "jit_level": "O1",
        "recompute": "none",
        "parallel_optimizer": False,
        "ep": 1,
        "cp": 1,
        "ulysses": 1,
    }
    baseline = build_space(load_spec(LLAMA), {"tp": 8}).baseline()
    assert out["candidate"] == baseline.as_dict()


def test_estimate_reports_an_infeasible_layout_with_its_reason(capsys):
    # tp = 1, pp = 1: a 7B model's activations at sequence 4096 cannot fit one 64 GB device
    assert (
        main(
            [
                "estimate",
                LLAMA,
                "--set",
                "tp=1",
                "--set",
                "pp=1",
                "--set",
                "recompute=none",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False and "GB" in out["reason"]
    assert main(["estimate", LLAMA, "--set", "tp=8"]) == 0  # the readable table
    assert "memory" in capsys.readouterr().out.lower()


def test_estimate_rejects_an_unknown_knob(capsys):
    assert main(["estimate", LLAMA, "--set", "warp=2"]) == 2
    assert "warp" in capsys.readouterr().err


def test_studies_and_compare(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    for name, fusion in (("a", "[16, 256]"), ("b", "[1, 4]")):
        assert (
            main(
                [
                    "search",
                    LLAMA,
                    "--storage",
                    storage,
                    "--study",
                    name,
                    "--trials",
                    "4",
                    "--set",
                    "tp=8",
                    "--set",
                    "pp=2",
                    "--set",
                    "micro_batches=16",
                    "--set",
                    f"fusion_mb={fusion}",
                    "--set",
                    "recompute=selective",
                ]
            )
            == 0
        )
    capsys.readouterr()
    assert main(["studies", "--storage", storage]) == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [name for name, _ in listed] == ["a", "b"]
    assert all(int(count.split()[0]) >= 4 for _, count in listed)  # repeats are listed too
    csv = tmp_path / "all.csv"
    assert main(["compare", "a", "b", "--storage", storage, "--csv", str(csv)]) == 0
    printed = capsys.readouterr().out
    assert "best_trial" in printed and "fusion_mb" in printed
    frame = pd.read_csv(csv)
    assert set(frame["study"]) == {"a", "b"}
    both = autotune.compare(["a", "b"], storage)
    assert len(both) == len(frame)
    assert set(both.loc[both["study"] == "b", "fusion_mb"]) <= {1, 4}
    assert main(["compare", "a", "nope", "--storage", storage]) == 2
    assert "nope" in capsys.readouterr().err


def test_export_against_a_mindformers_base(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                LLAMA,
                "--storage",
                storage,
                "--study",
                "mf",
                "--trials",
                "3",
                "--set",
                "tp=8",
                "--set",
                "pp=2",
                "--set",
                "micro_batches=16",
                "--set",
                "recompute=selective",
                "--no-confirm",
            ]
        )
        == 0
    )
    qwen3 = ROOT / "tests" / "fixtures" / "mindformers" / "pretrain_qwen3_bf16.yaml"  # bf16 too
    capsys.readouterr()
    assert (
        main(
            [
                "export",
                "mf",
                "--storage",
                storage,
                "--out",
                str(tmp_path / "out"),
                "--mindformers-base",
                str(qwen3),
            ]
        )
        == 0
    )
    assert "keys changed" in capsys.readouterr().out
    assert (
        "base_config" not in (tmp_path / "out" / "mindformers.yaml").read_text().split("\nseed:")[1]
    )
    missing = tmp_path / "nope.yaml"
    assert (
        main(
            [
                "export",
                "mf",
                "--storage",
                storage,
                "--out",
                str(tmp_path / "out2"),
                "--mindformers-base",
                str(missing),
            ]
        )
        == 2
    )
    assert f"{missing}: cannot read" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
