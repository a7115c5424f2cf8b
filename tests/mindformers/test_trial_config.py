"""The config a MindFormers trial runs is its export's mindformers.yaml but for run length, outputs
and data: built by the export's own writer, diffed against the export, both read with the one
reader (`autotune.spec.mindformers_file.load_config`, MindFormers' rule)."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from autotune.export import write_export
from autotune.mindformers import CLUSTER_DIR
from autotune.mindformers.config import document
from autotune.mindformers.launch import ENTRY, launch
from autotune.mindformers.trial import (
    DROPPED_CALLBACKS,
    RECORDER,
    RECORDER_FILE,
    RUN_KEYS,
    TRIAL_FILE,
    compile_cache_key,
    trial_document,
    trial_section,
)
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import trial_warmup
from autotune.spec.mindformers_file import load_config
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from autotune.train.config import UPDATE_CAP
from tests.mindformers.conftest import RUN_MINDFORMER, mindformers_model

# candidates over what a CPU MindFormers trial runs: recompute, loss scale, warmup, jit level, dp
CANDIDATES = {
    "baseline": {},
    "full-recompute-warmup": {"recompute": "full", "warmup_steps": 2},
    "O0-scale": {"jit_level": "O0", "loss_scale": 2**12, "recompute": "selective"},
    "pynative": {"jit_level": "pynative", "grad_accum": 1},
}


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def _differing(a: dict, b: dict) -> set[str]:
    left, right = dict(_leaves(a)), dict(_leaves(b))
    return {
        k for k in left.keys() | right.keys() if left.get(k, KeyError) != right.get(k, KeyError)
    }


def _run_key(dotted: str) -> str | None:
    return next((key for key in RUN_KEYS if dotted == key or dotted.startswith(key + ".")), None)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mf")
    spec = load_spec(mindformers_model(folder, **{"trial.steps": 6, "trial.measure_after": 1}))
    return spec, build_space(spec).baseline(), folder


def test_the_export_writes_the_document_the_trial_starts_from(study, tmp_path):
    spec, baseline, _ = study
    trial = {"number": 3, "study": spec.study, "metrics": {}, "estimate": None}
    write_export(spec, baseline, trial, tmp_path / "x", mindformers_base=spec.mindformers_base)
    exported = (tmp_path / "x" / "mindformers.yaml").read_text()
    assert exported.rstrip("\n") == document(spec, baseline, trial, spec.mindformers_base)[
        0
    ].rstrip("\n")


@pytest.mark.parametrize("name", CANDIDATES)
def test_a_trial_runs_its_export_but_for_run_length_outputs_and_data(study, tmp_path, name):
    spec, baseline, _ = study
    c = Candidate(**{**baseline.as_dict(), **CANDIDATES[name]})
    trial_dir = tmp_path / "trials" / "3"
    text, changes = trial_document(spec, c, 3, trial_dir)
    exported, _ = document(spec, c, {"study": spec.study, "number": 3}, spec.mindformers_base)
    (tmp_path / "export.yaml").write_text(exported)
    (tmp_path / TRIAL_FILE).write_text(text)
    ran, export = load_config(tmp_path / TRIAL_FILE), load_config(tmp_path / "export.yaml")
    differing = _differing(ran, export)
    assert differing and all(_run_key(k) for k in differing), [
        k for k in differing if not _run_key(k)
    ]
    assert {key for key, _, _ in changes} == {_run_key(k) for k in differing}
    for key, _, _ in changes:  # the header names each changed key and why
        assert f"#   {key}: {RUN_KEYS[key]}" in text
    # the run length: the trial's steps, the warmup compressed as autotune's trainer does
    assert ran["lr_schedule"]["total_steps"] == spec.trial.steps
    assert ran["lr_schedule"]["warmup_steps"] == trial_warmup(
        c.warmup_steps, spec.train.total_steps, spec.trial.steps
    )
    assert export["lr_schedule"]["total_steps"] == spec.train.total_steps
    # outputs: no checkpoint saving, the recorder registered from the package's cluster files
    types = [cb["type"] for cb in ran["callbacks"]]
    assert "CheckpointMonitor" in [cb["type"] for cb in export["callbacks"]]
    assert not set(types) & set(DROPPED_CALLBACKS) and types[-1] == RECORDER
    recorder = ran["callbacks"][-1]
    assert recorder["auto_register"] == f"autotune_mf_recorder.{RECORDER}"
    assert (CLUSTER_DIR / RECORDER_FILE).is_file()
    assert (
        recorder["steps"] == spec.trial.steps and recorder["cap"] == UPDATE_CAP * spec.trial.steps
    )
    assert ran["output_dir"].startswith(str(trial_dir))
    # the candidate as the export writes it, e.g. the CPU form: data parallel, no sink
    assert ran["parallel"]["parallel_mode"] == 0 and ran["runner_config"]["sink_mode"] is False
    assert ran["parallel_config"]["data_parallel"] == c.dp


def test_the_trial_section_carries_what_its_launch_and_results_need(study, tmp_path):
    spec, baseline, _ = study
    trial_dir = tmp_path / "7"
    mf = trial_section(spec, baseline, 7, trial_dir, data="/data/tokens.mindrecord")
    assert json.loads(json.dumps(mf)) == mf  # config.json carries it to every node
    assert mf["trial_yaml"] == trial_document(spec, baseline, 7, trial_dir)[0]
    assert mf["loss_scaled"] and mf["initial_scale"] == baseline.loss_scale
    # data parallel: each rank's loss its shard's, averaged; no micro-batch sum on CPU
    assert mf["ranks"] == baseline.devices and mf["loss_rank"] is None and mf["loss_divisor"] == 1
    argv, env, cwd = launch(
        mf,
        trial_dir,
        trial_dir / "logs",
        {"PATH": "/bin", "MS_ENABLE_TFT": "{TTP:1}"},
        workers=2,
        local_workers=2,
        master_port=8123,
        bind_core=True,
    )
    python = spec.trial.python
    # msrun beside MindFormers' interpreter, always; the entry runs run_mindformer.py
    assert argv[0] == str(Path(python).with_name("msrun"))
    assert "--worker_num=2" in argv and "--bind_core=True" in argv and "--join=True" in argv
    program = argv[argv.index(str(ENTRY)) :]
    assert program[1:] == [
        str(RUN_MINDFORMER),
        "--config",
        str(trial_dir / TRIAL_FILE),
        "--run_mode",
        "train",
        "--register_path",
        str(CLUSTER_DIR),
        "--train_dataset_dir",
        "/data/tokens.mindrecord",
    ]
    assert cwd == RUN_MINDFORMER.parent  # users' configs name files relative to the checkout
    assert env["PATH"].split(":")[0] == str(Path(python).parent)
    assert env["PYTHONPATH"].split(":")[0] == str(RUN_MINDFORMER.parent)
    assert env["OM_MODULES_CACHE"].startswith(str(trial_dir))
    assert env["LOG_MF_PATH"].startswith(str(trial_dir / "logs"))
    assert env["MS_OM_PATH"].startswith(str(trial_dir)) and "MS_ENABLE_TFT" not in env


def test_the_cpu_screens_what_mindformers_refuses_there_and_says_so_first(study):
    spec, baseline, _ = study
    space = build_space(spec)
    assert space.notes[0].startswith("trial.program mindformers on cpu: MindFormers runs data")
    assert space.domains["tp"] == space.domains["pp"] == (1,)
    assert space.domains["parallel_optimizer"] == (False,)
    assert space.domains["grad_accum"] == (baseline.grad_accum,)  # folded: one run whatever K
    from autotune.spec.constraints import violations

    for knobs in ({"dp": 1, "tp": 2}, {"parallel_optimizer": True}):
        reasons = violations(spec, Candidate(**{**baseline.as_dict(), **knobs}))
        assert any(r.startswith("MindFormers on CPU: ") for r in reasons), reasons
    # autotune's own trainer runs them on CPU
    plain = dataclasses.replace(spec, trial=dataclasses.replace(spec.trial, program="autotune"))
    assert not violations(plain, Candidate(**{**baseline.as_dict(), "parallel_optimizer": True}))


def test_the_trial_yaml_is_valid_yaml_with_its_header_first(study, tmp_path):
    spec, baseline, _ = study
    text, _ = trial_document(spec, baseline, 0, tmp_path)
    assert text.startswith("# autotune study ")
    assert yaml.safe_load(text)["callbacks"][-1]["type"] == RECORDER


def test_a_rerun_of_a_candidate_and_only_it_finds_its_compile_cache(study, tmp_path):
    """MindSpore's compile cache finds a graph by compile order, not by graph: a folder per
    candidate, the same for its re-runs (another trial folder and number), another for any
    other candidate, MindFormers or MindSpore version, or dataset."""
    spec, baseline, _ = study
    key = compile_cache_key(trial_section(spec, baseline, 3, tmp_path / "3", "/d"), "1.9.0 2.9.0")
    rerun = trial_section(spec, baseline, 11, tmp_path / "11", "/d", stop_rule=True)
    assert compile_cache_key(rerun, "1.9.0 2.9.0") == key
    other = Candidate(**{**baseline.as_dict(), "recompute": "full"})
    assert (
        compile_cache_key(trial_section(spec, other, 3, tmp_path / "3", "/d"), "1.9.0 2.9.0") != key
    )
    assert compile_cache_key(rerun, "1.9.0 2.10.0") != key
    assert (
        compile_cache_key(trial_section(spec, baseline, 3, tmp_path / "3", "/e"), "1.9.0 2.9.0")
        != key
    )
    mf = {**rerun, "compile_cache": str(tmp_path / "cache" / key)}
    _, env, _ = launch(
        mf, tmp_path, tmp_path / "logs", {}, workers=2, local_workers=2, master_port=1
    )
    assert env["MS_COMPILER_CACHE_ENABLE"] == "1" and env["MS_COMPILER_CACHE_PATH"].endswith(key)
