"""What MindFormers 1.9's mcore path does with a trial on this CPU (slow tier): the evidence behind
``autotune validate``/``search`` refusing a study whose trials are MindFormers runs of an mcore
config on ``cpu`` (`autotune.spec.mindformers_trial.MCORE_ON_CPU`; the fast tier checks the
refusal). The tiny mcore Qwen3 (tests/mindformers/tiny_qwen3_mindformers.yaml) is run past that
refusal, through the runner as a study's trial would be, on a synthetic MindRecord of sliced
rows: MindFormers cannot train it here, and each way it stops is the trial's verdict
(docs/mindformers.md, "What the CPU run cannot show"); the device check's step 9 runs the same
study on Ascend. When MindFormers changes so that it runs, this test fails, and the refusal and
the docs have to go.
"""

import pytest

from autotune.cli import main
from autotune.execution.runner import run_trial
from autotune.mindformers.data import synthetic_dataset
from autotune.mindformers.trial import SECTION, trial_section
from autotune.spec.model_yaml import parse_spec
from autotune.spec.space import build_space
from autotune.spec.yaml_file import load_yaml
from autotune.train.config import trial_config
from tests.conftest import ROOT
from tests.mindformers.conftest import mf_python, mindformers_model

pytestmark = pytest.mark.slow

TINY_QWEN3 = ROOT / "tests" / "mindformers" / "tiny_qwen3_mindformers.yaml"
FIXED = {  # the config's own values, one candidate per study
    "tp": 1,
    "pp": 1,
    "micro_batches": 1,
    "grad_accum": 1,
    "fusion_mb": 64,
    "loss_scale": 65536,
    "warmup_steps": 0,
    "jit_level": "O0",
    "recompute": "none",
    "parallel_optimizer": False,
}


def _one_trial(tmp_path, python, devices: int):
    """``(outcome, detail, worker 0's log)`` of the study's one trial on ``devices`` ranks."""
    folder = tmp_path / f"dp{devices}"
    folder.mkdir()
    settings = {
        "study": f"mcore-dp{devices}",
        "cluster.devices": devices,
        "cluster.devices_per_node": devices,
        "baseline.dp": devices,
        "search.space": FIXED,
        "trial.steps": 4,
        "trial.measure_after": 1,
    }
    model = mindformers_model(folder, python, base=TINY_QWEN3, **settings)
    assert main(["validate", str(model)]) == 2  # refused before any trial ...
    spec = parse_spec(load_yaml(model), model, stored=True)  # ... which runs here past it
    c, trial_dir = build_space(spec).baseline(), folder / "trial"
    config = trial_config(
        spec, c, study=spec.study, number=0, out_dir=trial_dir, steps=4, measure_after=1
    )
    data = synthetic_dataset(spec, folder / ".mindformers-data")
    config.update(
        program=spec.trial.program, **{SECTION: trial_section(spec, c, 0, trial_dir, data)}
    )
    result = run_trial(config, trial_dir, 600, None, c.devices)
    log = trial_dir / "logs" / "worker_0.log"
    return result.outcome, result.detail, log.read_text(errors="replace")


def test_mindformers_mcore_qwen3_does_not_train_on_this_cpu(tmp_path, capsys):
    python = mf_python()
    # data parallel, MindFormers' only mode here, resets parallel_config to 1 (the stand-alone
    # and data-parallel branch of _check_global_batch_size_for_auto_parallel), and mcore's
    # initialize_model_parallel then refuses the two ranks: the candidate is refused at build
    outcome, detail, _ = _one_trial(tmp_path, python, 2)
    assert outcome == "infeasible", detail
    assert "total_model_size(1) = data_parallel_size(1)" in detail and "world_size (2)" in detail
    # one rank builds the model, and its first step needs the fused RmsNorm Qwen3's layers are
    # built with (get_gpt_layer_local_spec's fused_norm default): no CPU kernel
    outcome, detail, log = _one_trial(tmp_path, python, 1)
    assert outcome == "error" and "autotune.train: RuntimeError" in detail, detail
    assert "Unsupported op [RmsNorm] on CPU" in log and "input_layernorm" in log
    assert "an mcore config (use_legacy: False)" in capsys.readouterr().err  # the refusals said
