"""An exported expert-parallel layout (dp2·ep2, real msrun, 2 workers): its strategy.ckpt lays
the stacked experts out on dim 0 over the ep ranks (device matrix (dp·tp / ep, ep), tensor map
[0, -1, -1]), and MindSpore's transform_checkpoints merges the run's per-rank checkpoints with it
into the whole model, which computes the run's loss."""

import json

import pytest

ms = pytest.importorskip("mindspore")

from autotune.export import write_export  # noqa: E402
from autotune.spec.candidate import Candidate  # noqa: E402
from autotune.spec.model_yaml import parse_spec  # noqa: E402
from tests.export.test_runs import launch, merged_step_2, whole_model_loss  # noqa: E402
from tests.train.test_moe import MOE  # noqa: E402

pytestmark = pytest.mark.slow

EXPERTS = "model.layers.1.feed_forward.experts.w1.weight"


def test_an_expert_parallel_run_merges_into_the_whole_model(tmp_path):
    model = MOE | {"dtype": "float32", "seq_length": 16}
    spec = parse_spec(
        {
            "study": "experts",
            "model": model,
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
        dp=2,
        tp=1,
        pp=1,
        ep=2,
        micro_batches=1,
        fusion_mb=16,
        grad_accum=2,
        loss_scale=1024,
        warmup_steps=10,
        jit_level="O1",
        recompute="none",
        parallel_optimizer=False,
    )
    out = tmp_path / "dp2ep2"
    write_export(spec, c, {"number": 1, "study": "experts", "metrics": {}, "estimate": None}, out)
    from mindspore.train.node_strategy_pb2 import ParallelStrategyMap

    written = ParallelStrategyMap()
    written.ParseFromString((out / "strategy.ckpt").read_bytes())
    items = {i.param_name: i.parallel_layouts for i in written.parallel_layout_item}
    assert list(items[EXPERTS].dev_matrix[0].dim) == [1, 2]
    assert list(items[EXPERTS].tensor_map[0].dim) == [0, -1, -1]
    steps = launch(out, "--steps", "3")
    for rank in range(2):  # each rank saved its 2 of the 4 experts
        saved = out / "run" / "checkpoint" / f"rank_{rank}" / "step_00000002.ckpt"
        assert list(ms.load_checkpoint(str(saved))[EXPERTS].shape) == [2, 16, 32]
    merged = merged_step_2(out, tmp_path)
    assert list(merged[EXPERTS].shape) == [4, 16, 32]
    assert whole_model_loss(merged, 2, model) == pytest.approx(steps[2]["loss"], rel=1e-5)
    assert json.loads((out / "summary.json").read_text())["knobs"]["ep"] == 2


# MindFormers 1.9 reshards a checkpoint with its own MindSpore (2.9.0, pinned): what its
# auto_trans_ckpt calls, run in its venv on the strategy this export writes
MINDFORMERS_SPLIT = """
import sys, numpy as np, mindspore as ms
from mindspore.parallel import transform_checkpoints
folder, ranks = sys.argv[1], int(sys.argv[2])
transform_checkpoints(folder + "/src", folder + "/dst", "part_", None, folder + "/strategy.ckpt")
name = "model.layers.1.feed_forward.experts.w1.weight"
print([ms.load_checkpoint(f"{folder}/dst/rank_{r}/part_{r}.ckpt")[name].asnumpy().tolist()
       for r in range(ranks)])
"""


def test_mindformers_own_mindspore_splits_the_experts_as_the_ranks_hold_them(tmp_path):
    """dp2·tp2·ep2: the experts sit on the tp axis (ep index = tp index), so ranks 0 and 2 hold
    experts 0–1 and ranks 1 and 3 experts 2–3, in MindFormers' venv as in autotune's."""
    import subprocess

    import numpy as np

    from autotune import layout
    from autotune.export.strategy import write_strategies
    from tests.export.test_mindformers_consumer import _venv

    python = _venv()
    plan, _ = layout.builtin_layout(MOE, 2, 1, 2)
    write_strategies(plan, 2, 2, 1, tmp_path, 2)
    full = {n: np.random.default_rng(0).standard_normal(p.shape) for n, p in plan.items()}
    (tmp_path / "src" / "rank_0").mkdir(parents=True)
    ms.save_checkpoint(
        [{"name": n, "data": ms.Tensor(v.astype(np.float32))} for n, v in full.items()],
        str(tmp_path / "src" / "rank_0" / "full.ckpt"),
    )
    done = subprocess.run(
        [python, "-c", MINDFORMERS_SPLIT, str(tmp_path), "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads(done.stdout.strip().splitlines()[-1])
    w1 = full[EXPERTS].astype(np.float32)
    for rank, block in enumerate(held):
        first = 2 * (rank % 2)
        np.testing.assert_array_equal(np.array(block, np.float32), w1[first : first + 2])
