"""The MoE mechanisms priced after the first validation against published runs (docs/costmodel.md,
"Table 4"): each switched by what a model.yaml states, each failing here without it."""

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.moe_time import ep_peers
from tests.costmodel.test_moe import QWEN3_30B_A3B, candidate, spec_of

MODEL = {**QWEN3_30B_A3B, "num_kv_heads": 8}  # tp 8 splits its key/value heads
LEGACY = {**MODEL, "experts_tensor_parallel": True, "moe_capacity_factor": 2.0}


def test_legacy_moe_dispatches_over_dp_ranks_tp_apart_and_whole_without_sequence_parallel():
    """MindFormers' legacy MoE carves ep out of dp (peers tp ranks apart: with tp 8 on 8 per node
    every peer is on another node) and, without sequence parallelism, each tp rank dispatches
    its dp share whole and all-reduces the experts' output buffer over tp."""
    assert ep_peers(4, 8, stride=8) == (0, 3) and ep_peers(4, 8, stride=2) == (3, 0)
    on = spec_of(LEGACY, sequence_parallel=True)
    off = spec_of(LEGACY, sequence_parallel=False)
    knobs = dict(dp=4, tp=8, pp=2, ep=4, micro_batches=8, recompute="none")
    t_on = estimate(on, candidate(on, **knobs)).breakdown["time_s"]
    t_off = estimate(off, candidate(on, **knobs), refuse=False).breakdown["time_s"]
    assert t_on["ep_comm_inter"] > 0 and t_on["ep_comm"] < t_on["ep_comm_inter"] / 100  # α only
    assert t_off["ep_comm_inter"] == pytest.approx(8 * t_on["ep_comm_inter"], rel=1e-9)
    assert t_off["tp_comm"] > 2 * t_on["tp_comm"]  # the dispatched buffer, not the hidden state
    mcore = spec_of(MODEL, sequence_parallel=True)  # ep groups of consecutive ranks
    assert estimate(mcore, candidate(mcore, **knobs)).breakdown["time_s"]["ep_comm_inter"] == 0
