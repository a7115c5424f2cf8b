"""The MoE mechanisms priced after the first validation against published runs (docs/costmodel.md,
"Table 4"): each switched by what a model.yaml states, each failing here without it."""

from pathlib import Path

import pytest

from autotune.costmodel import PROFILES, estimate
from autotune.costmodel.collectives import allreduce_time, dp_exposed
from autotune.costmodel.memory import rank_params
from autotune.costmodel.moe_time import FP8_MOVED, ep_peers, expert_replicas
from autotune.costmodel.workload import workload_for
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import parse_spec
from tests.costmodel.test_moe import DEEPSEEK_V3, QWEN3_30B_A3B, candidate, spec_of

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


def h800(model, devices=2048, batch=15360, device="h800", **extra):
    data = {
        "model": {"dtype": "bfloat16", "flash_attention": True, **model, **extra},
        "train": {"global_batch_size": batch},
        "cluster": {"backend": "simulate", "devices": devices, "devices_per_node": 8},
    }
    data["cluster"]["device"] = device
    return parse_spec(data, Path("model.yaml"))


# DeepSeek-V3's layers, all MoE and 4 per stage, no MTP module: every stage alike but the last
# (the head), which paces each variant below, so their parts compare
UNIFORM = {**DEEPSEEK_V3, "num_layers": 64, "dense_layers": 0, "mtp_layers": 0}
# the report's layout (docs/costmodel.md, Table 4)
DSV3_LAYOUT = Candidate(
    dp=128,
    tp=1,
    pp=16,
    micro_batches=120,
    fusion_mb=64,
    grad_accum=1,
    loss_scale=2**16,
    warmup_steps=0,
    jit_level="O1",
    recompute="selective",
    parallel_optimizer=False,
    ep=64,
    cp=1,
)


def priced(spec, engine="megatron", **knobs):
    est = estimate(spec, DSV3_LAYOUT.replace(**knobs), engine=engine)
    return est, est.breakdown["time_s"], est.breakdown["memory_gb"]


def test_fp8_linear_layers_run_at_the_fp8_peak_and_dispatch_fp8_where_the_device_has_it():
    bf16, t0, m0 = priced(h800(UNIFORM))
    fp8, t1, m1 = priced(h800(UNIFORM, fp8_linear=True))
    speed = PROFILES["h800"].peak_tflops_fp8 / PROFILES["h800"].peak_tflops  # ≈ 2: datasheet
    routed_share = 1 - 256 / (3 * 2048 * (8 + 1) + 256)  # the router stays in BF16
    assert t1["experts"] == pytest.approx(
        t0["experts"] * (1 - routed_share * (1 - 1 / speed)), rel=1e-9
    )
    assert t1["mla"] == pytest.approx(t0["mla"] / speed, rel=1e-9)
    assert t1["ep_comm_inter"] == pytest.approx(t0["ep_comm_inter"] * FP8_MOVED / 2, rel=1e-9)
    assert m1["activations"] < m0["activations"]  # dispatched copies and SwiGLU inputs in FP8
    mtp = {**UNIFORM, "mtp_layers": 1}  # its projection and layer FP8, its logits not
    logits = priced(h800({**mtp, "mtp_layers": 0}, fp8_linear=True))[1]
    assert logits["mtp"] == 0
    with_mtp = priced(h800(mtp))[1]["mtp"], priced(h800(mtp, fp8_linear=True))[1]["mtp"]
    work = workload_for(h800(mtp).model, fused_attention=True)  # megatron's flash attention
    assert with_mtp[1] / with_mtp[0] == pytest.approx(
        1 - work.mtp_flops(linear=True) / work.mtp_flops() * (1 - 1 / speed), rel=1e-9
    )
    assert not fp8.not_modelled
    ascend = spec_of(UNIFORM, devices=2048, batch=15360, fp8_linear=True)
    plain = spec_of(UNIFORM, devices=2048, batch=15360)
    assert priced(ascend)[1]["experts"] == priced(plain)[1]["experts"]  # no FP8 on a 910B
    assert "has no FP8" in priced(ascend)[0].not_modelled[0]


def test_overlapped_all_to_alls_hide_behind_the_stage_computation():
    _, exposed, _ = priced(h800(UNIFORM))
    _, hidden, _ = priced(h800(UNIFORM, moe_comm_overlap=True))
    assert exposed["ep_comm_inter"] > 0 and hidden["ep_comm_inter"] == 0.0
    assert hidden["experts"] == exposed["experts"]  # nothing else moves
    # a narrow model's all-to-all outlasts its computation: the rest stays, split as it was
    slim = {**UNIFORM, "hidden_size": 1024, "num_heads": 8, "moe_ffn_hidden_size": 128}
    _, open_, _ = priced(h800(slim))
    _, left, _ = priced(h800(slim, moe_comm_overlap=True))
    assert 0 < left["ep_comm_inter"] < open_["ep_comm_inter"]
    ratio = left["ep_comm"] / open_["ep_comm"]
    assert left["ep_comm_inter"] / open_["ep_comm_inter"] == pytest.approx(ratio, rel=1e-9)


def test_node_limited_routing_crosses_to_each_node_once():
    _, each, _ = priced(h800(UNIFORM))
    _, limited, _ = priced(h800(UNIFORM, moe_node_limit=4))
    # per token: 8 copies, 56 of 64 peers remote → 7 across nodes; at most 4 of 8 nodes,
    # 4·(1 − (3/4)^8) = 3.6 reached, 7/8 of them remote → 3.15 (and 8·7/8 forwarded inside)
    distinct = 4 * (1 - 0.75**8) * 7 / 8
    assert limited["ep_comm_inter"] == pytest.approx(each["ep_comm_inter"] * distinct / 7, rel=1e-9)
    # the forwarding inside the node (7 copies at 200 GB/s) runs while IB delivers (3.15 at 50):
    # hidden, but for a collective's latency
    assert limited["ep_comm"] < each["ep_comm"] / 100
    _, within, _ = priced(h800(UNIFORM, moe_node_limit=4), ep=8, dp=128)
    _, plain, _ = priced(h800(UNIFORM), ep=8, dp=128)
    assert within["ep_comm"] == plain["ep_comm"]  # one node: nothing to limit


def test_megatron_distributed_optimizer_shards_master_weights_and_moments():
    spec = h800(DEEPSEEK_V3, optimizer_dtype="bfloat16")
    _, _, whole = priced(spec)
    _, _, sharded = priced(spec, parallel_optimizer=True)
    assert sharded["params"] == whole["params"] and sharded["grads"] == whole["grads"]
    # the experts' states over the 2 ranks that hold them, the rest over 128
    assert sharded["optimizer_states"] < 0.55 * whole["optimizer_states"]
    _, _, fp32 = priced(h800(DEEPSEEK_V3))
    assert whole["optimizer_states"] == pytest.approx(fp32["optimizer_states"] * 8 / 12)


def test_expert_gradients_are_reduced_over_the_ranks_holding_those_experts():
    """dp 128 · tp 1 / ep 64: each expert's gradient is all-reduced over 2 ranks, not 128."""
    spec = h800(DEEPSEEK_V3)
    _, t, _ = priced(spec)
    work = workload_for(spec.model)
    stage = max(rank_params(work, 1, 16, 64))
    assert stage < 4e9  # its 1/64 of the stage's experts (45 B in stage 1), dense whole
    share, holders = expert_replicas(work, DSV3_LAYOUT, stage)
    assert holders == 2 and 0 < share < 1
    h800_ = PROFILES["h800"]
    over_dp = dp_exposed(DSV3_LAYOUT, h800_, h800_.inter_node_gbps, 2 * stage, 0.0, 128)
    assert t["dp_comm"] < over_dp


def test_dualpipe_pairs_stage_r_with_stage_pp_minus_1_minus_r_and_shrinks_the_bubble():
    spec = h800(DEEPSEEK_V3)
    dual = h800(DEEPSEEK_V3, pipeline_schedule="dualpipe")
    one, t1, m1 = priced(spec)
    two, t2, m2 = priced(dual)
    assert two.step_time_s < one.step_time_s  # the head and MTP stage shares a rank
    pace = sum(t2[p] for p in t2 if p not in ("dp_comm", "bubble", "optimizer", "host")) / 120
    assert t2["bubble"] == pytest.approx((16 / 2 - 1) * 2 / 3 * pace, rel=1e-9)
    assert t1["bubble"] > 2 * t2["bubble"]
    assert m2["params"] > 1.5 * m1["params"] / 2  # two stages' parameters on a rank
    assert not two.not_modelled
    mindspore = estimate(dual, DSV3_LAYOUT, engine="mindspore")
    assert "runs no DualPipe" in mindspore.not_modelled[0]
    assert mindspore.breakdown == estimate(spec, DSV3_LAYOUT, engine="mindspore").breakdown


def test_the_trainer_runs_every_expert_on_every_gathered_token_and_all_reduces_the_rows():
    """autotune's trainer computes each local expert over all the ep group's tokens (weight 0
    where not routed): the routed FLOPs and their activations are E/k × the router's choice,
    no rank waits for a busier one, and each dispatch or combine is an all-reduce of ep blocks
    of the rank's tokens."""
    spec = spec_of(QWEN3_30B_A3B, devices=8, batch=8)
    c = candidate(spec, dp=8, tp=1, pp=1, ep=8, micro_batches=1, recompute="none")
    routed = workload_for(spec.model)
    dense = routed.executed_by("trainer")
    assert routed.executed_by("mindspore") is routed
    assert dense.routed_flops() == pytest.approx(routed.routed_flops() * 128 / 8)
    kept = dense.layer_activations(1, "none", 2) - routed.layer_activations(1, "none", 2)
    per_copy = 2 * (2 * 2048 + 4 * 768)  # a dispatched copy, its output, the SwiGLU's four
    assert kept == pytest.approx(spec.model.seq_length * (128 - 8) * per_copy)
    trainer = estimate(spec, c, engine="trainer").breakdown["time_s"]
    mindspore = estimate(spec, c, engine="mindspore").breakdown["time_s"]
    assert trainer["imbalance"] == 0.0 < mindspore["imbalance"]
    assert trainer["experts"] > 10 * mindspore["experts"]
    profile = PROFILES["ascend-910b"]
    rows = 8 * spec.model.seq_length * 2048 * 2  # ep blocks of one sample's bf16 tokens
    one = allreduce_time(rows, 8, profile.group_gbps(8), profile)
    assert trainer["ep_comm"] == pytest.approx(48 * 4 * one)
    assert trainer["ep_comm_inter"] == 0.0


def test_node_limited_forwarding_adds_only_what_outlasts_the_inter_node_transfer():
    """DeepSeek-V3 §3.2.2: IB and NVLink fully overlapped — the forwarding costs only its time
    beyond the IB transfer's."""
    fast_ib = {"base": "h800", "inter_node_gbps": 400.0}  # IB now 2 × NVLink's 200 GB/s
    _, t_slow, _ = priced(h800(UNIFORM, moe_node_limit=4))
    _, t_fast, _ = priced(h800(UNIFORM, device=fast_ib, moe_node_limit=4))
    assert t_fast["ep_comm_inter"] == pytest.approx(t_slow["ep_comm_inter"] * 50 / 400, rel=1e-9)
    # per byte of a token: 7 copies forwarded at 200 GB/s, 3.15 sent across at 400
    forwarded, remote = 8 * 7 / 8 / 200, 4 * (1 - 0.75**8) * 7 / 8 / 400
    beyond = t_fast["ep_comm_inter"] * (forwarded - remote) / remote
    assert beyond < t_fast["ep_comm"] < beyond * 1.05  # and a collective's latency per pass


def test_megatron_weights_the_swiglu_so_its_combine_keeps_no_expert_output():
    """MindFormers' combine multiplies each expert's output by its probability and keeps the k
    outputs for the router's gradient; Megatron-Core multiplies the probabilities into the
    SwiGLU's output and sums the expert outputs as they come: 2·k·h bytes per token and MoE
    layer fewer kept, in every recompute mode but full."""
    spec = spec_of(QWEN3_30B_A3B)
    work = workload_for(spec.model)
    megatron, mindspore = work.executed_by("megatron"), work.executed_by("mindspore")
    assert mindspore.moe.weighted_combine and not megatron.moe.weighted_combine
    outputs = spec.model.seq_length * 8 * 2 * 2048  # k = 8 outputs of h = 2048, 16-bit
    for mode in ("none", "selective"):
        kept = mindspore.layer_activations(1, mode, 2) - megatron.layer_activations(1, mode, 2)
        assert kept == pytest.approx(outputs)
    assert mindspore.layer_activations(1, "full", 2) == megatron.layer_activations(1, "full", 2)
    c = candidate(spec, dp=8, pp=8, ep=8, micro_batches=32, recompute="selective")
    assert (
        estimate(spec, c, engine="megatron").breakdown["memory_gb"]["activations"]
        < estimate(spec, c).breakdown["memory_gb"]["activations"]
    )
