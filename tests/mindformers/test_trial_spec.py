"""model.yaml's ``trial.program: mindformers`` and ``autotune init --run-mindformer``: what a
study whose trials are MindFormers runs must have, each problem an exit 2 naming its key; and
the cost model prices MindSpore's engine for it on every backend."""

import dataclasses
import sys

import pytest
import yaml

from autotune import costmodel
from autotune.cli import main
from autotune.costmodel.estimate import default_engine
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.conftest import ROOT
from tests.mindformers.conftest import RUN_MINDFORMER, TINY, mindformers_model


def _error(path) -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return str(caught.value)


def test_a_mindformers_trial_section_is_read_and_each_problem_names_its_key(tmp_path):
    spec = load_spec(mindformers_model(tmp_path))
    assert spec.trial.program == "mindformers" and spec.trial.data == "synthetic"
    assert spec.trial.run_mindformer == str(RUN_MINDFORMER)
    cases = {
        "trial.python: ": {"trial.python": str(tmp_path / "gone" / "python")},
        "trial.run_mindformer: ": {"trial.run_mindformer": "nowhere/run_mindformer.py"},
        "trial.data: must be one of config, synthetic": {"trial.data": "mock"},
        "trial.program: mindformers on backend gpu: MindFormers supports": {
            "cluster.backend": "gpu"
        },
        # the tiny config names no dataset: its trials need the synthetic one
        "train_dataset.data_loader.dataset_dir: is empty": {"trial.data": "config"},
    }
    for expected, settings in cases.items():
        folder = tmp_path / str(len(expected))
        folder.mkdir()
        assert expected in _error(mindformers_model(folder, **settings)), expected
    data = yaml.safe_load((tmp_path / "model.yaml").read_text())
    del data["export"]
    (tmp_path / "none.yaml").write_text(yaml.safe_dump(data))
    assert "export.mindformers_base: is required with trial.program mindformers" in _error(
        tmp_path / "none.yaml"
    )
    data = yaml.safe_load((tmp_path / "model.yaml").read_text())
    data["trial"] = {"run_mindformer": str(RUN_MINDFORMER)}
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(data))
    assert "trial.run_mindformer: is read by trial.program mindformers only" in _error(
        tmp_path / "plain.yaml"
    )


def test_mindformers_trials_of_an_mcore_config_on_cpu_are_refused_before_any_trial(
    tmp_path, capsys
):
    """MindFormers 1.9 trains no mcore model on this CPU (the slow tier's evidence:
    tests/mindformers/test_mcore_trial_cpu.py): validate and search refuse such a study in one
    line, exit 2, where each trial would fail; the legacy llama's is a study, and so is the mcore
    one whose trials are autotune's trainer's."""
    qwen3 = ROOT / "tests" / "mindformers" / "tiny_qwen3_mindformers.yaml"
    (tmp_path / "mcore").mkdir()
    model = mindformers_model(tmp_path / "mcore", base=qwen3)
    for verb in (["validate"], ["search", "--storage", f"sqlite:///{tmp_path}/s.db"]):
        assert main([*verb[:1], str(model), *verb[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"trial.program: mindformers on backend cpu: {qwen3}: an mcore config" in err
        assert "does not train on CPU" in err
    data = yaml.safe_load(model.read_text())
    del data["trial"]
    model.write_text(yaml.safe_dump(data))
    assert main(["validate", str(model)]) == 0
    (tmp_path / "legacy").mkdir()
    assert main(["validate", str(mindformers_model(tmp_path / "legacy"))]) == 0


def test_the_dataset_a_mindformers_trial_reads_is_checked_before_any_trial(tmp_path):
    config = tmp_path / "with_data.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "base_config": str(TINY),
                "train_dataset": {"data_loader": {"dataset_dir": "data/wiki.mindrecord"}},
            }
        )
    )
    path = mindformers_model(tmp_path, base=config, **{"trial.data": "config"})
    missing = RUN_MINDFORMER.parent / "data" / "wiki.mindrecord"
    assert f"train_dataset.data_loader.dataset_dir: {missing}: no such file or folder" in _error(
        path
    )


def test_init_writes_the_trial_section_or_says_in_one_line_how_to(tmp_path, capsys):
    out = tmp_path / "model.yaml"
    assert main(["init", "--mindformers", str(TINY), "--backend", "cpu", "--out", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1].startswith("note: trials run autotune's own trainer; to make each trial a ")
    assert "--run-mindformer PATH/run_mindformer.py" in said[-1]
    assert "trial" not in yaml.safe_load(out.read_text())
    # the flags that need --run-mindformer, and an interpreter without MindFormers
    assert (
        main(["init", "--mindformers", str(TINY), "--synthetic-data", "--out", str(out), "--force"])
        == 2
    )
    assert "--synthetic-data: is for MindFormers trials" in capsys.readouterr().err
    flags = ["--run-mindformer", str(RUN_MINDFORMER), "--mindformers-python", sys.executable]
    assert main(["init", "--mindformers", str(TINY), *flags, "--out", str(out), "--force"]) == 2
    assert f"--mindformers-python {sys.executable}: does not run, or finds no mindformers" in (
        capsys.readouterr().err
    )


def test_mindformers_trials_are_priced_on_mindspores_engine_on_every_backend(tmp_path):
    """The published Llama 2 7B and 13B configs' own layouts: over their 58 GB cap as autotune's
    trainer would run them (a second forward per micro-batch, its own optimizer step), within it
    as MindFormers runs them — the engine a study of MindFormers trials prices, on ascend too."""
    for name in ("pretrain_llama2_7b", "pretrain_llama2_13b"):
        out = tmp_path / f"{name}.model.yaml"
        config = ROOT / "tests" / "fixtures" / "mindformers" / f"{name}.yaml"
        args = ["init", "--mindformers", str(config), "--backend", "ascend"]
        assert main([*args, "--total-steps", "1000", "--out", str(out)]) == 0
        spec = load_spec(out)
        baseline = build_space(spec).baseline()
        assert default_engine(spec) == "trainer"
        assert not costmodel.estimate(spec, baseline).feasible, name
        trials = dataclasses.replace(
            spec, trial=dataclasses.replace(spec.trial, program="mindformers")
        )
        assert default_engine(trials) == "mindspore"
        estimate = costmodel.estimate(trials, baseline)
        assert estimate.feasible, (name, estimate.reason)
        assert estimate.memory_gb_per_device <= spec.cluster.max_device_memory_gb


def test_synthetic_rows_are_sliced_as_the_config_says(tmp_path):
    """The legacy llama slices inputs and labels out of seq_length + 1 tokens; an mcore config
    with input_sliced_sig takes rows of seq_length as they come (its GPTModel does not slice)."""
    from autotune.mindformers.data import dataset_shape

    (tmp_path / "llama").mkdir()
    (tmp_path / "qwen3").mkdir()
    llama = load_spec(mindformers_model(tmp_path / "llama"))
    qwen3 = load_spec(  # on Ascend (float32: no fused attention): none trains on the CPU
        mindformers_model(
            tmp_path / "qwen3",
            base=ROOT / "tests" / "mindformers" / "tiny_qwen3_mindformers.yaml",
            **{"cluster.backend": "ascend", "model.flash_attention": False},
        )
    )
    assert dataset_shape(llama)[1:] == (33, 128, ["input_ids", "labels"])
    assert dataset_shape(qwen3)[1:] == (16, 64, ["input_ids", "labels"])
