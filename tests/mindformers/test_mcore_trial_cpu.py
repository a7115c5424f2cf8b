"""What MindFormers 1.9's mcore path does with a trial on this CPU (slow tier): a study of the
tiny mcore Qwen3 (tests/mindformers/tiny_qwen3_mindformers.yaml) whose trials are MindFormers
runs on a synthetic MindRecord of sliced rows, through ``autotune search``. MindFormers cannot
train it here, and each way it stops is recorded as the trial's verdict (docs/mindformers.md, "On
CPU"); the device check's step 9 runs the same study on Ascend. When MindFormers changes so that
it runs, this test fails and the docs have to say so.
"""

import pytest

from autotune.cli import main
from autotune.storage.connection import load_study
from autotune.storage.schema import outcome_of
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
    storage = f"sqlite:///{folder}/s.db"
    args = ["search", str(model), "--storage", storage, "--artifacts", str(folder / "trials")]
    assert main([*args, "--trials", "1", "--no-confirm"]) == 0
    (trial,) = load_study(f"mcore-dp{devices}", storage).get_trials(deepcopy=False)
    log = folder / "trials" / f"mcore-dp{devices}" / "0" / "logs" / "worker_0.log"
    return outcome_of(trial), trial.user_attrs.get("detail", ""), log.read_text(errors="replace")


def test_mindformers_mcore_qwen3_does_not_train_on_this_cpu(tmp_path):
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
