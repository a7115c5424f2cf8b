"""ep and cp in the export: mindformers.yaml states them as MindFormers' MoE configs do;
strategy.ckpt lays the experts out over ep (MindSpore splits a full checkpoint by it into the
slices the trainer's ranks hold) and refuses cp, which nothing here splits."""

import numpy as np
import pytest

from autotune.export.configs import export_reasons
from autotune.mindformers.config import overlay
from tests.costmodel.test_moe import DENSE, QWEN3_30B_A3B, candidate, spec_of


def test_mindformers_yaml_states_expert_and_context_parallel():
    spec = spec_of(QWEN3_30B_A3B)
    doc = overlay(spec, candidate(spec, ep=8))
    assert doc["parallel_config"]["expert_parallel"] == 8
    assert doc["parallel_config"]["context_parallel"] == 1
    assert doc["parallel"]["enable_alltoall"] is True
    assert overlay(spec, candidate(spec, ep=1))["parallel"]["enable_alltoall"] is False
    dense = spec_of(DENSE, flash_attention=True, seq_length=32768)
    doc = overlay(dense, candidate(dense, dp=16, cp=4))
    assert doc["parallel_config"]["context_parallel"] == 4
    assert "expert_parallel" not in doc["parallel_config"]  # a dense config never had it


def test_the_strategy_export_lays_out_ep_and_refuses_cp():
    spec = spec_of(QWEN3_30B_A3B)
    assert export_reasons(spec, candidate(spec, ep=1)) == []
    assert export_reasons(spec, candidate(spec, ep=8)) == []
    dense = spec_of(DENSE, flash_attention=True, seq_length=32768)
    (reason,) = export_reasons(dense, candidate(dense, dp=16, cp=4))
    assert reason.startswith("cp = 4: strategy.ckpt")


def test_transform_checkpoints_splits_the_experts_as_the_ranks_hold_them(tmp_path):
    """dp2·tp2·ep2 (experts on the tp axis) and dp4·ep2 (every other rank): MindSpore's own
    transform_checkpoints, driven by the exported strategy.ckpt, gives every rank the experts
    `autotune.layout.ep_coords` says it holds, and the rest as tp splits them."""
    ms = pytest.importorskip("mindspore")
    from mindspore.parallel import transform_checkpoints

    from autotune import layout
    from autotune.export.strategy import write_strategies
    from tests.train.test_moe import MOE

    rng = np.random.default_rng(0)
    for dp, tp, ep in ((2, 2, 2), (4, 1, 2)):
        plan, reasons = layout.builtin_layout(MOE, tp, 1, ep)
        assert not reasons
        folder = tmp_path / f"dp{dp}tp{tp}ep{ep}"
        (folder / "src" / "rank_0").mkdir(parents=True)
        write_strategies(plan, dp, tp, 1, folder, ep)
        full = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in plan.items()}
        ms.save_checkpoint(
            [{"name": n, "data": ms.Tensor(v)} for n, v in full.items()],
            str(folder / "src" / "rank_0" / "full.ckpt"),
        )
        transform_checkpoints(
            str(folder / "src"), str(folder / "dst"), "part_", None, str(folder / "strategy.ckpt")
        )
        for rank in range(dp * tp):
            _, dp_index, tp_index = layout.rank_coords(rank, dp, tp)
            ep_index = layout.ep_coords(rank, dp, tp, ep)[0]
            held = ms.load_checkpoint(str(folder / "dst" / f"rank_{rank}" / f"part_{rank}.ckpt"))
            for name, p in plan.items():
                expected = full[name][p.local_slice(tp_index, tp, ep_index, ep)]
                np.testing.assert_array_equal(held[name].asnumpy(), expected, err_msg=name)
