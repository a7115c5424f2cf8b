"""Exported tp2 and pp2 layouts train through their own launch.sh (real msrun, 2 workers): the
per-rank checkpoints hold exactly the slices summary.json promises, MindSpore's
transform_checkpoints merges them with the exported strategy.ckpt into the whole model, which
computes the sharded run's loss, and --resume continues a run exactly."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore.parallel import transform_checkpoints  # noqa: E402

from autotune.execution.runner import free_port  # noqa: E402
from autotune.export import write_export  # noqa: E402
from autotune.layout import rank_coords  # noqa: E402
from autotune.spec.candidate import Candidate  # noqa: E402
from autotune.spec.model_yaml import parse_spec  # noqa: E402
from tests.conftest import run  # noqa: E402

# multi-process proofs: make test-slow
pytestmark = pytest.mark.slow

MODEL = {
    "family": "transformer",
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 64,
    "seq_length": 16,
    "vocab_size": 64,
    "dtype": "float32",
}
SCALARS = {
    "global_step",
    "loss_scale",
    "loss_scale.cur_iter",
    "loss_scale.last_overflow_iter",
    "step",
}


# big enough for the parallel optimizer: qkv (384·128), fc_in (512·128), fc_out (128·512) are over
# its 64 KB threshold in float32, the rest is not
SHARDED_MODEL = {**MODEL, "hidden_size": 128, "ffn_hidden_size": 512}


def export(
    tmp_path, tp, pp, dtype="float32", loss_scale=1024, parallel_optimizer=False, model=MODEL
) -> Path:
    spec = parse_spec(
        {
            "study": "runs",
            "model": {**model, "dtype": dtype},
            "train": {
                "global_batch_size": 16,
                "learning_rate": 0.01,
                "total_steps": 100,
                "save_every": 2,
            },
            "cluster": {"backend": "cpu", "devices": 2, "devices_per_node": 2},
            "trial": {"steps": 10, "measure_after": 4},
        },
        tmp_path / "model.yaml",
    )
    c = Candidate(
        dp=2 // (tp * pp),
        tp=tp,
        pp=pp,
        micro_batches=2 if pp > 1 else 1,
        fusion_mb=16,
        grad_accum=1 if pp > 1 else 2,
        loss_scale=loss_scale,
        warmup_steps=10,
        jit_level="O1",
        recompute="none",
        parallel_optimizer=parallel_optimizer,
    )
    out = tmp_path / f"tp{tp}pp{pp}"
    write_export(spec, c, {"number": 1, "study": "runs", "metrics": {}, "estimate": None}, out)
    return out


def launch(out: Path, *args) -> list[dict]:
    """``bash launch.sh ARGS`` as a user runs it, with this venv's python and msrun first on PATH."""
    env = {**os.environ, "MASTER_PORT": str(free_port()), "GLOG_v": "3"}
    run_dir = Path(args[args.index("--out") + 1]) if "--out" in args else out / "run"
    code, _, err = run(["bash", out / "launch.sh", *args], timeout=400, env=env)
    logs = "".join(p.read_text()[-1500:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert code == 0, (err + logs)[-4000:]
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def whole_model_loss(merged: dict, step: int, model=MODEL) -> float:
    """The tp1·pp1 model with the merged weights, on the global batch of ``step``."""
    from autotune.train import models
    from autotune.train.models import data
    from autotune.train.parallel import tp_layers
    from autotune.train.runtime import session

    ms.set_context(mode=ms.GRAPH_MODE)
    session.numpy2_workaround(ms)
    network = models.build_network(model)
    not_loaded, _ = ms.load_param_into_net(network, merged, strict_load=True)
    assert not not_loaded
    x, y = data.TokenChains(16, model["seq_length"], model["vocab_size"], seed=0)(step)
    logits = ms.ops.cast(network(ms.Tensor(x)), ms.float32)
    return float(tp_layers.TokenCrossEntropy()(logits, ms.Tensor(y)).asnumpy())


def merged_step_2(out: Path, tmp_path: Path) -> dict:
    """The two ranks' step-2 checkpoints of ``out``'s run merged by ``transform_checkpoints`` with
    the exported strategy.ckpt into the whole model."""
    source = tmp_path / "step2"
    for rank in range(2):
        (source / f"rank_{rank}").mkdir(parents=True)
        shutil.copy(
            out / "run" / "checkpoint" / f"rank_{rank}" / "step_00000002.ckpt",
            source / f"rank_{rank}",
        )
    transform_checkpoints(
        str(source), str(tmp_path / "merged"), "whole_", str(out / "strategy.ckpt"), None
    )
    return ms.load_checkpoint(str(tmp_path / "merged" / "rank_0" / "whole_0.ckpt"))


@pytest.mark.parametrize(
    "tp, pp", [(2, 1), pytest.param(1, 2, marks=pytest.mark.slow)], ids=["tp2", "pp2"]
)
def test_checkpoints_hold_the_promised_slices_and_merge_into_the_whole_model(tmp_path, tp, pp):
    out = export(tmp_path, tp, pp)
    steps = launch(out, "--steps", "3")
    assert [s["step"] for s in steps] == [0, 1, 2]
    summary = json.loads((out / "summary.json").read_text())
    for rank in range(2):
        saved = sorted((out / "run" / "checkpoint" / f"rank_{rank}").glob("*.ckpt"))
        assert [p.name for p in saved] == [
            "step_00000002.ckpt",
            "step_00000003.ckpt",
        ]  # save_every 2, end
        held = ms.load_checkpoint(str(saved[0]))
        stage, _, tp_index = rank_coords(rank, 2 // (tp * pp), tp)
        promised = {}
        for name, p in summary["parameters"].items():
            if p["stage"] != stage:
                continue
            shape = list(p["shape"])
            if p["split_dim"] is not None:
                shape[p["split_dim"]] //= tp
            promised.update({f"{prefix}{name}": shape for prefix in ("", "adam_m.", "adam_v.")})
        assert set(held) == set(promised) | SCALARS, f"rank {rank} (stage {stage}, tp {tp_index})"
        for name, shape in promised.items():
            assert list(held[name].shape) == shape, f"rank {rank} {name}"
    # merge the step-2 checkpoints: their weights computed the loss the run logged for step 2
    merged = merged_step_2(out, tmp_path)
    assert whole_model_loss(merged, 2) == pytest.approx(steps[2]["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_resume_continues_exactly_where_the_run_stopped(tmp_path, tp, pp):
    """float16 from a loss scale that overflows: the scaler's state must survive the resume too."""
    out = export(tmp_path, tp, pp, dtype="float16", loss_scale=2**20)
    launch(out, "--steps", "3")
    resumed = launch(out, "--steps", "5", "--resume")
    assert [s["step"] for s in resumed] == [0, 1, 2, 3, 4]
    straight = launch(out, "--steps", "5", "--out", str(tmp_path / "straight"))
    np.testing.assert_allclose(
        [s["loss"] for s in resumed], [s["loss"] for s in straight], rtol=1e-5
    )
    assert [s["loss_scale"] for s in resumed] == [s["loss_scale"] for s in straight]
    assert resumed[0]["overflow"] and len({s["loss_scale"] for s in resumed}) > 1


@pytest.mark.slow
def test_a_parallel_optimizer_run_saves_shards_that_merge_into_the_whole_model(tmp_path):
    """dp2 with the parallel optimizer: each rank saves its half of the sharded parameters and of
    their moments; transform_checkpoints with the exported strategy.ckpt (opt_weight_shard_*)
    merges them into the whole model, which computes the run's loss; --resume continues exactly."""
    out = export(tmp_path, 1, 1, parallel_optimizer=True, model=SHARDED_MODEL)
    steps = launch(out, "--steps", "3")
    summary = json.loads((out / "summary.json").read_text())
    # 64 KB or more in float32 (MindSpore skips only smaller ones): proj's 128 × 128 is exactly 64 KB
    sharded = {
        f"blocks.{i}.{part}.weight"
        for i in range(2)
        for part in ("attn.qkv", "attn.proj", "mlp.fc_in", "mlp.fc_out")
    }
    halves = {}
    for rank in range(2):
        held = ms.load_checkpoint(
            str(out / "run" / "checkpoint" / f"rank_{rank}" / "step_00000002.ckpt")
        )
        for name, p in summary["parameters"].items():
            rows = p["shape"][0] // 2 if name in sharded else p["shape"][0]
            for prefix in ("", "adam_m.", "adam_v."):
                assert list(held[prefix + name].shape) == [rows, *p["shape"][1:]], (
                    f"rank {rank} {prefix}{name}"
                )
        halves[rank] = held
    # the two ranks hold different halves of a sharded parameter, the same whole of any other
    name = "blocks.0.mlp.fc_in.weight"
    assert not np.array_equal(halves[0][name].asnumpy(), halves[1][name].asnumpy())
    np.testing.assert_array_equal(
        halves[0]["embed.tok.embedding_table"].asnumpy(),
        halves[1]["embed.tok.embedding_table"].asnumpy(),
    )
    merged = merged_step_2(out, tmp_path)
    assert list(merged[name].shape) == summary["parameters"][name]["shape"]
    np.testing.assert_array_equal(merged[name].asnumpy()[:256], halves[0][name].asnumpy())
    assert whole_model_loss(merged, 2, SHARDED_MODEL) == pytest.approx(steps[2]["loss"], rel=1e-5)
    # resuming rebuilds the whole parameters from the restored shards
    resumed = launch(out, "--steps", "5", "--resume")
    straight = launch(out, "--steps", "5", "--out", str(tmp_path / "straight"))
    np.testing.assert_allclose(
        [s["loss"] for s in resumed], [s["loss"] for s in straight], rtol=1e-5
    )
