"""Experts, latent attention, MTP modules, and the ep and cp knobs: constrained as MindFormers
checks them, searched where a model has use for them, and priced each as a part of its own."""

from pathlib import Path

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.moe_time import MOE_PARTS, ROUTER_IMBALANCE, ep_peers
from autotune.costmodel.workload import workload_for
from autotune.families.base import parameter_shapes
from autotune.families.moe import active_parameters
from autotune.spec.constraints import violations
from autotune.spec.model_yaml import parse_spec
from autotune.spec.space import build_space
from tests.spec.test_model_experts import DEEPSEEK_V3, QWEN3_30B_A3B

EXPERT_FIELDS = ("num_experts", "experts_per_token", "moe_ffn_hidden_size")
DENSE = {k: v for k, v in QWEN3_30B_A3B.items() if k not in EXPERT_FIELDS}


def spec_of(model, devices=64, batch=256, device="ascend-910b", **model_extra):
    data = {
        "model": {"dtype": "bfloat16", **model, **model_extra},
        "train": {"global_batch_size": batch},
        "cluster": {
            "backend": "simulate",
            "devices": devices,
            "devices_per_node": 8,
            "device": device,
        },
    }
    return parse_spec(data, Path("model.yaml"))


def candidate(spec, **knobs):
    return build_space(spec).baseline().replace(**knobs)


def parts(spec, **knobs):
    est = estimate(spec, candidate(spec, **knobs))
    assert est.feasible or "predicted" in est.reason, est.reason
    return est, est.breakdown["time_s"], est.breakdown["memory_gb"]


def test_ep_and_cp_are_refused_as_mindformers_refuses_them():
    moe = spec_of(QWEN3_30B_A3B)
    base = candidate(moe)
    assert any("divide num_experts" in r for r in violations(moe, base.replace(ep=3, dp=63)))
    assert any("divide dp·tp" in r for r in violations(moe, base.replace(dp=2, tp=4, pp=8, ep=16)))
    assert any("sequence_parallel" in r for r in violations(moe, base.replace(dp=32, tp=2)))
    dense = spec_of(DENSE)
    assert violations(dense, candidate(dense).replace(ep=2)) == [
        "ep = 2: the model has no experts to split"
    ]
    assert any("flash_attention" in r for r in violations(dense, candidate(dense, dp=32, cp=2)))
    long = spec_of(DENSE, flash_attention=True, seq_length=32768)
    ok = candidate(long, dp=16, cp=4)
    assert ok.devices == 64 and violations(long, ok) == []
    assert "dp·tp·cp·pp = 128" in violations(long, ok.replace(dp=32))[0]


def test_cp_is_refused_before_dispatch_where_the_trainer_runs_the_trial():
    """The trainer splits no sequence: on a backend whose trials are its runs a cp > 1 candidate
    is infeasible (recorded, never dispatched to fail), while an estimate prices it."""
    long = dict(DENSE, flash_attention=True, seq_length=32768, dtype="float16")
    on_gpu = parse_spec(
        {
            "model": long,
            "train": {"global_batch_size": 256},
            "cluster": {"backend": "gpu", "devices": 64, "devices_per_node": 8},
        },
        Path("model.yaml"),
    )
    split = candidate(on_gpu, dp=16, cp=4)
    assert [r for r in violations(on_gpu, split) if "trainer splits no sequence" in r]
    assert not [r for r in violations(on_gpu, split.replace(dp=64, cp=1)) if "cp =" in r]
    simulated = spec_of(DENSE, flash_attention=True, seq_length=32768)
    assert violations(simulated, candidate(simulated, dp=16, cp=4)) == []


def test_the_space_searches_ep_on_experts_and_cp_on_long_sequences():
    moe = build_space(spec_of(QWEN3_30B_A3B))
    assert moe.domains["ep"] == (1, 2, 4, 8, 16, 32, 64) and moe.domains["cp"] == (1,)
    dense = build_space(spec_of(DENSE, flash_attention=True))
    assert dense.domains["ep"] == (1,) and dense.domains["cp"] == (1,)  # 4,096 tokens: no cp
    assert not [n for n in dense.notes if n.startswith(("ep", "cp"))]  # quietly: the default
    long = build_space(spec_of(DENSE, flash_attention=True, seq_length=32768))
    assert long.domains["cp"] == (1, 2, 4, 8)
    layouts = {(c.dp, c.cp) for c in long.candidates()}
    assert (8, 8) in layouts and (64, 1) in layouts  # auto dp: devices / (tp·pp·cp)


def test_active_flops_are_twice_the_active_parameters_per_token():
    """A token's forward multiplies each active weight once (a multiply-add, 2 FLOPs): the
    layers' GEMMs and the head against `autotune.families.moe.active_parameters`, whose token
    table is a lookup, not a GEMM."""
    for model in (QWEN3_30B_A3B, {**DEEPSEEK_V3, "mtp_layers": 0}):
        spec = spec_of(model)
        work = workload_for(spec.model)
        cfg = spec.model.as_config()
        active = active_parameters(cfg, parameter_shapes(cfg))
        table = model["vocab_size"] * model["hidden_size"]
        per_token = work.layers * work.seq * (work.projection_flops() + work.ffn_flops())
        per_token += work.last_stage_flops() / 3
        norms = (2 * work.layers + 1) * model["hidden_size"]  # element-wise, not counted
        assert per_token / work.seq == pytest.approx(2 * (active - table - norms), rel=2e-3)


def test_experts_split_their_states_over_ep_and_the_all_to_all_crosses_nodes_past_one():
    spec = spec_of(QWEN3_30B_A3B)
    _, t1, m1 = parts(spec, ep=1)
    _, t8, m8 = parts(spec, ep=8)
    _, t16, m16 = parts(spec, ep=16)
    assert t1["ep_comm"] == t1["ep_comm_inter"] == t1["imbalance"] == 0.0
    assert t8["ep_comm"] > 0 and t8["ep_comm_inter"] == 0.0  # 8 consecutive ranks: one node
    assert t16["ep_comm_inter"] > t16["ep_comm"] > 0  # 16: half the peers on another node
    assert ep_peers(16, 8) == (7, 8) and ep_peers(4, 8) == (3, 0)
    assert t8["imbalance"] == pytest.approx(t8["experts"] * (ROUTER_IMBALANCE - 1), rel=0.05)
    expert_params = 48 * 128 * 3 * 2048 * 768
    saved = (m1["params"] - m8["params"]) * 2**30 / 4  # float32 parameters
    assert saved == pytest.approx(expert_params * (1 - 1 / 8), rel=1e-6)
    assert m16["optimizer_states"] < m8["optimizer_states"] < m1["optimizer_states"]


def test_a_padded_router_runs_its_capacity_and_waits_for_no_rank():
    spec = spec_of(QWEN3_30B_A3B, moe_capacity_factor=1.5)
    _, dropless, _ = parts(spec_of(QWEN3_30B_A3B), ep=8)
    est, padded, _ = parts(spec, ep=8)
    assert padded["imbalance"] == 0.0
    assert padded["experts"] > dropless["experts"]
    assert padded["ep_comm"] > dropless["ep_comm"]  # the padded slots travel too


def test_cp_splits_activations_and_pays_a_key_value_ring():
    spec = spec_of(DENSE, flash_attention=True, seq_length=32768, batch=64)
    _, t1, m1 = parts(spec, dp=64, cp=1)
    _, t4, m4 = parts(spec, dp=16, cp=4)
    _, t16, _ = parts(spec, dp=4, cp=16)
    assert t1["cp_comm"] == 0.0 and t4["cp_comm"] > 0
    # a replica's 4 samples over 4 cp ranks: each device keeps what one sample costs
    assert m4["activations"] == pytest.approx(m1["activations"], rel=1e-9)
    fewer = spec_of(DENSE, flash_attention=True, seq_length=32768, batch=64, devices=16)
    _, _, whole = parts(fewer, dp=16, cp=1)
    assert m4["activations"] == pytest.approx(whole["activations"] / 4, rel=1e-9)
    assert t16["cp_comm"] > t4["cp_comm"]  # tp·cp = 16 > 8 per node: the ring crosses nodes


def test_latent_attention_and_mtp_modules_are_parts_of_their_own():
    model = {**DEEPSEEK_V3, "num_layers": 8, "dense_layers": 1}
    spec = spec_of(model, devices=16, batch=32, flash_attention=True)
    est, t, _ = parts(spec, dp=8, pp=2, micro_batches=4, ep=8)
    assert t["mla"] > 0 and t["mtp"] > 0 and t["experts"] > 0
    assert set(MOE_PARTS) <= set(t)
    no_mtp = spec_of({**model, "mtp_layers": 0}, devices=16, batch=32, flash_attention=True)
    _, t0, _ = parts(no_mtp, dp=8, pp=2, micro_batches=4, ep=8)
    assert t0["mtp"] == 0.0 and sum(t0.values()) < sum(t.values())
