"""Cost model: published formulas on hand-checked cases, feasibility, profiles, calibration.

Expected numbers are worked out here from the formulas (numbers written out), not by calling the
cost model's own helpers. No MindSpore needed.
"""

import json
import math
from pathlib import Path

import pytest

from autotune.costmodel import (
    NOT_ESTIMATED,
    PROFILES,
    Calibration,
    estimate,
    format_estimate,
    resolve_profile,
)
from autotune.costmodel.memory import memory_per_stage
from autotune.costmodel.moe_time import MOE_PARTS
from autotune.costmodel.step_time import allreduce_time
from autotune.costmodel.workload import workload_for
from autotune.layout import builtin_layout, rank_elements
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import parse_spec

GIB = 2**30
TIME_KEYS = {
    "compute",
    "recompute",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "bubble",
    "optimizer",
    "host",
    *MOE_PARTS,
}
MEMORY_KEYS = {"params", "grads", "accumulators", "optimizer_states", "activations", "overhead"}


def spec_of(model=None, batch=8, cluster=None):
    model = {
        "family": "transformer",
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "ffn_hidden_size": 256,
        "seq_length": 32,
        "vocab_size": 256,
        "dtype": "float16",
        **(model or {}),
    }
    cluster = {
        "backend": "simulate",
        "devices": 1,
        "devices_per_node": 8,
        "device": "a100-80g",
        **(cluster or {}),
    }
    return parse_spec(
        {"model": model, "train": {"global_batch_size": batch}, "cluster": cluster}, Path("t.yaml")
    )


def cand(dp=1, tp=1, pp=1, micro_batches=1, fusion_mb=64, grad_accum=1, jit="O1", recompute="none"):
    return Candidate(dp, tp, pp, micro_batches, fusion_mb, grad_accum, 2**16, 0, jit, recompute)


def states_bytes(est):
    m = est.breakdown["memory_gb"]
    return (m["params"] + m["grads"] + m["optimizer_states"]) * GIB


# -- model states: the trainer's float32 parameters, gradients and Adam moments ---------------


def test_sixteen_bytes_per_parameter_for_a_known_parameter_count():
    # the transformer family's layout, L=2, h=64, ffn=256, s=32, V=256:
    # per layer: qkv 3·64·64+3·64 = 12480, proj 64·64+64 = 4160, fc_in 64·256+256 = 16640,
    #            fc_out 256·64+64 = 16448, two layer norms 2·2·64 = 256  → 49984
    # embeddings 256·64 = 16384, positions 32·64 = 2048, final norm 128, head 256·64+256 = 16640
    params = 2 * 49984 + 16384 + 2048 + 128 + 16640
    assert params == 135168
    # The trainer keeps float32 parameters and gradients whatever the compute dtype, and
    # AdamWeightDecay's two float32 moments: 4 + 4 + 8 in float16 as in float32.
    for dtype in ("float16", "float32"):
        m = estimate(spec_of({"dtype": dtype}), cand()).breakdown["memory_gb"]
        assert (m["params"] * GIB, m["grads"] * GIB, m["optimizer_states"] * GIB) == pytest.approx(
            (4 * params, 4 * params, 8 * params)
        )
        assert m["accumulators"] == 0  # one micro-batch per step: no accumulators
    # Megatron-LM's mixed precision (ZeRO §3.1): 16-bit parameters and gradients, fp32 master
    # weights, momentum and variance: 2 + 2 + 12
    m = estimate(spec_of(), cand(grad_accum=2), engine="megatron").breakdown["memory_gb"]
    assert (
        m["params"] * GIB,
        m["grads"] * GIB,
        m["accumulators"],
        m["optimizer_states"] * GIB,
    ) == pytest.approx((2 * params, 2 * params, 0, 12 * params))


def test_parameter_count_matches_the_trial_programs_shapes():
    from autotune.families import parameter_shapes

    cfg = {
        "family": "transformer",
        "num_layers": 2,
        "hidden_size": 64,
        "ffn_hidden_size": 256,
        "seq_length": 32,
        "vocab_size": 256,
    }
    total = sum(math.prod(shape) for shape in parameter_shapes(cfg).values())
    assert states_bytes(estimate(spec_of(), cand())) == pytest.approx(16 * total)


def test_tensor_parallel_splits_matrices_and_keeps_norms_and_row_biases_whole():
    # tp=2: per layer split part (3h²+3h + h² + h·ffn+ffn + ffn·h) = 49600 → 24800, whole part
    # (proj bias, fc_out bias, 2 norms) = 6·64 = 384; token embedding 16384/2, positions 2048;
    # head (16384+256)/2, final norm 128.
    per_device = 2 * (24800 + 384) + 16384 / 2 + 2048 + (16384 + 256) / 2 + 128
    est = estimate(spec_of(cluster={"devices": 2}), cand(tp=2))
    assert states_bytes(est) == pytest.approx(16 * per_device)


@pytest.mark.parametrize("family", ["transformer", "mlp"])
@pytest.mark.parametrize("tp, pp", [(1, 2), (2, 1), (2, 2)])
def test_model_states_per_device_are_the_layouts_elements(family, tp, pp):
    cfg = {
        "family": family,
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "ffn_hidden_size": 256,
        "seq_length": 32,
        "vocab_size": 256,
    }
    layouts, reasons = builtin_layout(cfg, tp, pp)
    assert not reasons
    spec = spec_of({"family": family}, cluster={"devices": tp * pp})
    c = cand(tp=tp, pp=pp, micro_batches=2 if pp > 1 else 1)
    stages = memory_per_stage(workload_for(spec.model), c, 4, 2 if pp > 1 else 1, "float16", 0.0)
    for stage, parts in enumerate(stages):
        elements = rank_elements(layouts, tp, stage)
        states = (parts["params"] + parts["grads"] + parts["optimizer_states"]) * GIB
        assert states == pytest.approx(16 * elements)
        # pp > 1 means several micro-batches per step: a float32 accumulator per parameter
        assert parts["accumulators"] * GIB == pytest.approx(4 * elements if pp > 1 else 0)


def test_gradient_accumulation_adds_a_float32_accumulator_per_parameter():
    spec = spec_of(batch=8)  # 135168 parameters (counted above)
    one, two = (
        estimate(spec, cand(grad_accum=k), engine="trainer").breakdown["memory_gb"] for k in (1, 2)
    )
    assert one["accumulators"] == 0
    assert two["accumulators"] * GIB == pytest.approx(4 * 135168)
    states = ("params", "grads", "accumulators", "optimizer_states", "overhead")
    assert sum(two[k] - one[k] for k in states) * GIB == pytest.approx(4 * 135168)
    # MindSpore adds each micro-batch's gradient into its accu_grads: no separate gradients
    one, two = (
        estimate(spec, cand(grad_accum=k), engine="mindspore").breakdown["memory_gb"]
        for k in (1, 2)
    )
    assert (two["accumulators"], two["grads"]) == (one["grads"], 0)
    assert one["grads"] * GIB == pytest.approx(4 * 135168)


def test_a_layout_the_trainer_cannot_build_is_infeasible():
    est = estimate(spec_of({"vocab_size": 255}, cluster={"devices": 2}), cand(tp=2))
    assert not est.feasible and "tp = 2 does not divide embed.tok.embedding_table" in est.reason
    assert math.isnan(est.memory_gb_per_device)


# -- activations: Korthikanti et al. 2022 -------------------------------------------------------


@pytest.mark.parametrize(
    "mode, per_layer, working",
    [
        # s·h·34 + 5·a·s² with s = h = 1024, a = 16 (16-bit, t = 1)
        ("none", 1024 * 1024 * 34 + 5 * 16 * 1024**2, 0),
        ("selective", 1024 * 1024 * 34, 0),
        # 2·s·h kept per layer; the layer being back-propagated is rebuilt whole once
        ("full", 2 * 1024 * 1024, 1024 * 1024 * 34 + 5 * 16 * 1024**2),
    ],
)
def test_activation_memory_per_recompute_mode(mode, per_layer, working):
    spec = spec_of(
        {
            "num_layers": 8,
            "hidden_size": 1024,
            "num_heads": 16,
            "ffn_hidden_size": 4096,
            "seq_length": 1024,
            "vocab_size": 1024,
        },
        batch=1,
    )
    head = 4 * 1024 * 1024 * (1 + 1024 / 1024)  # 4·s·h·(1 + V/h): final norm and fp32 logits
    embedding_mask = 1024 * 1024  # s·h dropout mask, 1 byte
    expected = 8 * per_layer + working + head + embedding_mask
    est = estimate(spec, cand(recompute=mode))
    assert est.breakdown["memory_gb"]["activations"] * GIB == pytest.approx(expected)


PIPELINE_MODEL = {
    "num_layers": 8,
    "hidden_size": 1024,
    "num_heads": 16,
    "ffn_hidden_size": 4096,
    "seq_length": 1024,
    "vocab_size": 1024,
}


def test_megatron_first_pipeline_stage_holds_pp_micro_batches_in_flight():
    spec = spec_of(PIPELINE_MODEL, batch=8, cluster={"devices": 4})
    est = estimate(spec, cand(pp=4, micro_batches=8, recompute="selective"), engine="megatron")
    # first stage: 4 in flight × micro-batch 1 × 2 layers × 34·s·h, plus 4 embedding masks
    expected = 4 * 2 * 34 * 1024**2 + 4 * 1024**2
    assert est.breakdown["memory_gb"]["activations"] * GIB == pytest.approx(expected)
    with pytest.raises(ValueError, match="engine"):
        estimate(spec, cand(pp=4, micro_batches=8), engine="gpipe")


def test_trainer_pipeline_keeps_only_stage_inputs_between_forward_and_backward():
    spec = spec_of(PIPELINE_MODEL, batch=8, cluster={"devices": 4})
    c = cand(pp=4, micro_batches=8, recompute="selective")
    stages = memory_per_stage(workload_for(spec.model), c, 1, 8, "float16", 0.0)
    sh = 1024 * 1024
    one = 2 * 34 * sh  # one micro-batch's activations of a stage's 2 layers, in its backward
    expected = [
        one + sh,  # stage 0: 4 in flight, but the waiting ones keep token ids only
        2 * (2 * sh) + one,  # stage 1: 3 in flight, 2 waiting keep their input s·h·2 bytes
        1 * (2 * sh) + one,  # stage 2: 2 in flight
        one + 4 * sh * 2,  # last: one in flight, plus the head's 4·s·h·(1 + V/h)
    ]
    assert [parts["activations"] * GIB for parts in stages] == pytest.approx(expected)


# -- time: pipeline bubble, ring all-reduce, recompute, placement -------------------------------


def test_bubble_fraction_for_four_stages_and_eight_micro_batches():
    est = estimate(
        spec_of({"num_layers": 4}, batch=8, cluster={"devices": 4}), cand(pp=4, micro_batches=8)
    )
    t = est.breakdown["time_s"]
    pipeline = t["compute"] + t["recompute"] + t["tp_comm"] + t["pp_comm"] + t["bubble"]
    assert t["bubble"] / pipeline == pytest.approx((4 - 1) / (8 + 4 - 1))  # = 3/11


def test_ring_allreduce_time_for_eight_ranks():
    ideal = PROFILES["a100-80g"].__class__(
        **{
            **PROFILES["a100-80g"].__dict__,
            "link_efficiency": 1.0,
            "collective_latency_us": 0.0,
            "hop_latency_us": 0.0,
        }
    )
    # 2·(n−1)/n · S / B = 2 · 7/8 · 1e9 B / 100e9 B/s
    assert allreduce_time(1e9, 8, 100.0, ideal) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    # α terms: launch + 2·(n−1) hops
    latency = ideal.__class__(
        **{**ideal.__dict__, "collective_latency_us": 20.0, "hop_latency_us": 2.0}
    )
    assert allreduce_time(0.0, 8, 100.0, latency) == pytest.approx(20e-6 + 2 * 7 * 2e-6)
    assert allreduce_time(1e9, 1, 100.0, latency) == 0.0


def test_tensor_parallel_group_crossing_a_node_pays_the_inter_node_link():
    model = {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_heads": 16,
        "ffn_hidden_size": 4096,
        "seq_length": 1024,
    }
    inside = estimate(spec_of(model, cluster={"devices": 16, "devices_per_node": 16}), cand(tp=16))
    across = estimate(spec_of(model, cluster={"devices": 16, "devices_per_node": 8}), cand(tp=16))
    # micro-batch 8 over 16 ranks, α = 20 µs + 2·15·2 µs; NVLink 300 GB/s vs InfiniBand 25 GB/s,
    # both at 80% efficiency. 4 layers × 4 all-reduces of the hidden state S = 8·1024·1024·2
    # bytes, 1 more for the vocab-parallel embedding (forward), 1 for the head (backward); the
    # vocab-parallel cross-entropy's float32 max (16·N), sum (N) and target logit (N), N = 8·1024.
    alpha, tokens = 20e-6 + 2 * 15 * 2e-6, 8 * 1024

    def allreduce(size, gbps):
        return alpha + 2 * 15 / 16 * size / (gbps * 1e9 * 0.8)

    for est, gbps in ((inside, 300), (across, 25)):
        expected = (
            18 * allreduce(8 * 1024 * 1024 * 2, gbps)
            + allreduce(16 * tokens * 4, gbps)
            + 2 * allreduce(tokens * 4, gbps)
        )
        assert est.breakdown["time_s"]["tp_comm"] == pytest.approx(expected)
    assert across.samples_per_s < inside.samples_per_s


def test_pipeline_sends_are_two_rank_allreduces_inter_node_only_across_a_node_boundary():
    model = {"num_layers": 4, "vocab_size": 50000}  # a heavy head: the last stage sets the pace
    message = 32 * 64 * 2  # one sample's hidden state, s·h in float16

    def pp_comm_per_micro_batch(dp, pp, per_node):
        spec = spec_of(
            model, batch=4 * dp, cluster={"devices": dp * pp, "devices_per_node": per_node}
        )
        est = estimate(spec, cand(dp=dp, pp=pp, micro_batches=4))
        assert est.feasible
        return est.breakdown["time_s"]["pp_comm"] / 4

    def two_transfers(gbps):  # forward activation + backward gradient, n = 2 all-reduces
        return 2 * (20e-6 + 2 * 2e-6 + message / (gbps * 1e9 * 0.8))

    # 16 devices, 8 per node, dp·tp = 8, pp = 2: every stage-0 rank's neighbour is on node 1
    assert pp_comm_per_micro_batch(8, 2, 8) == pytest.approx(two_transfers(25))
    # dp·tp = 4, pp = 4 on 2 nodes: only the boundary between stages 1 and 2 (ranks 4–7 → 8–11)
    # crosses; the last stage, the slowest, sends to stage 2 inside node 1
    assert pp_comm_per_micro_batch(4, 4, 8) == pytest.approx(two_transfers(300))
    assert pp_comm_per_micro_batch(2, 4, 8) == pytest.approx(two_transfers(300))  # one node


def test_stages_before_the_last_run_each_forward_twice_and_the_slowest_stage_sets_the_pace():
    # 4 layers, pp 2: a stage has 2 layers. Forward FLOPs per layer and sample:
    # s·(8h² + 4h·ffn) + 4s²h = 1024·(8 + 16)·2^20 + 4·2^30 = 28·2^30; the head 6·s·h·V = 6·2^30.
    model = {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_heads": 16,
        "ffn_hidden_size": 4096,
        "seq_length": 1024,
        "vocab_size": 1024,
    }
    # memory-bound kernels made free, so time is FLOPs over 312 TFLOP/s × 0.74
    fast = {"base": "a100-80g", "hbm_gbps": 1e12}
    spec = spec_of(model, batch=8, cluster={"devices": 2, "device": fast})
    c = cand(pp=2, micro_batches=4)  # micro-batch 2
    rate, fwd = 312e12 * 0.74, 28 * 2**30
    trainer, megatron = estimate(spec, c, engine="trainer"), estimate(spec, c, engine="megatron")
    t = trainer.breakdown["time_s"]
    # stage 0 (2 layers × 3 forwards + 1 more = 8 forwards) outruns the last (6 forwards + head)
    assert t["compute"] == pytest.approx(4 * 2 * 2 * 3 * fwd / rate, rel=1e-6)
    assert t["recompute"] == pytest.approx(4 * 2 * 2 * fwd / rate, rel=1e-6)
    model_flops = 8 * (4 * 3 * fwd + 6 * 2**30)
    assert trainer.mfu * trainer.step_time_s * 2 * 312e12 == pytest.approx(model_flops)
    executed = model_flops + 8 * 2 * fwd  # stage 0's 2 layers, once more per sample
    assert trainer.tflops_per_device * 1e12 * trainer.step_time_s * 2 == pytest.approx(executed)
    m = megatron.breakdown["time_s"]
    assert m["recompute"] == 0  # Megatron keeps the activations: the last stage sets the pace
    assert m["compute"] == pytest.approx(4 * 2 * (2 * 3 * fwd + 6 * 2**30) / rate, rel=1e-6)
    assert megatron.step_time_s < trainer.step_time_s
    # MindSpore's own pipeline (the simulate backend's engine) runs one forward per micro-batch
    mindspore = estimate(spec, c)
    ms = mindspore.breakdown["time_s"]
    assert ms["recompute"] == 0 and ms["compute"] == pytest.approx(m["compute"], rel=1e-9)
    assert mindspore.tflops_per_device * 1e12 * mindspore.step_time_s * 2 == pytest.approx(
        model_flops
    )


def test_full_recompute_trades_a_third_of_compute_for_activation_memory():
    spec = spec_of(
        {
            "num_layers": 8,
            "hidden_size": 1024,
            "num_heads": 16,
            "ffn_hidden_size": 4096,
            "seq_length": 1024,
            "vocab_size": 1024,
        }
    )
    none, full = estimate(spec, cand()), estimate(spec, cand(recompute="full"))
    t = full.breakdown["time_s"]
    # one more forward = 1/3 of forward+backward, less the head, which is not recomputed
    assert 0.30 < t["recompute"] / t["compute"] <= 1 / 3
    assert t["compute"] == pytest.approx(none.breakdown["time_s"]["compute"])
    kept_full, kept_none = (e.breakdown["memory_gb"]["activations"] for e in (full, none))
    assert kept_full < 0.2 * kept_none
    assert full.step_time_s > none.step_time_s


def test_flops_follow_megatron_formula_with_and_without_recompute():
    spec = spec_of(
        {
            "num_layers": 8,
            "hidden_size": 1024,
            "num_heads": 16,
            "ffn_hidden_size": 4096,
            "seq_length": 1024,
            "vocab_size": 1024,
        },
        batch=8,
    )
    # Narayanan et al. 2021: 72·B·s·l·h²·(1 + s/6h + V/12lh) model FLOPs per step;
    # with full recompute the layers' forward runs twice: 96·B·s·l·h²·(1 + s/6h + V/16lh).
    model = 72 * 8 * 1024 * 8 * 1024**2 * (1 + 1024 / (6 * 1024) + 1024 / (12 * 8 * 1024))
    executed = 96 * 8 * 1024 * 8 * 1024**2 * (1 + 1024 / (6 * 1024) + 1024 / (16 * 8 * 1024))
    est = estimate(spec, cand(recompute="full"))
    assert est.mfu * est.step_time_s * 312e12 == pytest.approx(model)
    assert est.tflops_per_device * 1e12 * est.step_time_s == pytest.approx(executed)


def test_gradient_accumulation_reduces_once_per_step():
    spec = spec_of(batch=64, cluster={"devices": 8})
    one, four = estimate(spec, cand(dp=8)), estimate(spec, cand(dp=8, grad_accum=4))
    assert four.breakdown["time_s"]["dp_comm"] == pytest.approx(
        one.breakdown["time_s"]["dp_comm"], rel=0.05
    )
    assert four.breakdown["memory_gb"]["activations"] < one.breakdown["memory_gb"]["activations"]


def test_one_fusion_bucket_hides_nothing_and_tiny_buckets_pay_latency():
    spec = spec_of(batch=64, cluster={"devices": 8})
    one_bucket = estimate(spec, cand(dp=8, fusion_mb=512))
    # 135168 params × 4 bytes (float32 gradients, though the model computes in float16) over
    # 8 ranks on NVLink (300 GB/s × 0.8): α + 2·7/8·S/B
    grads = 135168 * 4
    expected = 20e-6 + 2 * 7 * 2e-6 + 2 * 7 / 8 * grads / (300e9 * 0.8)
    assert one_bucket.breakdown["time_s"]["dp_comm"] == pytest.approx(expected)
    # 400 MB of float32 gradients against a backward of 8 sequences of 128 tokens
    big = spec_of(
        {
            "num_layers": 8,
            "hidden_size": 1024,
            "num_heads": 16,
            "ffn_hidden_size": 4096,
            "seq_length": 128,
        },
        batch=64,
        cluster={"devices": 8},
    )
    comm = {
        mb: estimate(big, cand(dp=8, fusion_mb=mb)).breakdown["time_s"]["dp_comm"]
        for mb in (1, 64, 4096)
    }
    assert comm[64] < comm[1] and comm[64] < comm[4096]


def test_pipeline_stages_reduce_gradients_after_the_last_micro_batch():
    # dp 2 × pp 2, 4 micro-batches of 4; stage 0 holds the most parameters: per layer 49984,
    # token embeddings 16384, positions 2048 (the last stage: final norm 128 and head 16640)
    spec = spec_of(batch=16, cluster={"devices": 4})
    c = cand(dp=2, pp=2, micro_batches=4, fusion_mb=1)  # 256 KiB buckets
    grads = (49984 + 16384 + 2048) * 4  # float32: 273664 bytes → 2 buckets
    alpha = 20e-6 + 2 * 2e-6  # 2 ranks on NVLink
    whole = 2 * alpha + grads / (300e9 * 0.8)
    # the trainer's update is a graph of its own: nothing overlaps the backward
    assert estimate(spec, c).breakdown["time_s"]["dp_comm"] == pytest.approx(whole)
    assert estimate(spec, c, engine="megatron").breakdown["time_s"]["dp_comm"] < whole


def test_cpu_does_not_hide_the_gradient_all_reduce_behind_the_backward():
    """MindSpore's CPU backend runs a graph's kernels in turn (profile comm_overlap 0): with many
    buckets the whole all-reduce is exposed, where an accelerator hides all but the last one."""
    model = {
        "num_layers": 4,
        "hidden_size": 512,
        "num_heads": 8,
        "ffn_hidden_size": 2048,
        "seq_length": 64,
    }
    c = cand(dp=2, fusion_mb=1)
    cpu = estimate(
        spec_of(
            model,
            batch=16,
            cluster={"backend": "cpu", "devices": 2, "devices_per_node": 2, "device": None},
        ),
        c,
    )
    grads = rank_elements(builtin_layout(spec_of(model).model.as_config(), 1, 1)[0], 1, 0) * 4
    buckets = -(-grads // (2**20 // 4))
    exposed = buckets * 215e-6 + grads / (0.45e9 * 0.8)
    assert cpu.breakdown["time_s"]["dp_comm"] == pytest.approx(exposed)

    def gpu(overlap):
        spec = spec_of(
            model,
            batch=16,
            cluster={"devices": 2, "device": {"base": "a100-80g", "comm_overlap": overlap}},
        )
        return estimate(spec, c).breakdown["time_s"]["dp_comm"]

    assert gpu(1.0) < gpu(0.0)  # an accelerator hides part of it behind the backward


def test_the_trainers_accumulating_step_reduces_after_its_last_micro_batch():
    """With grad_accum > 1 the trainer's update is a graph of its own (`step.ApplyStep`): an
    accelerator's overlap hides nothing there, where a one-graph step (grad_accum 1) and
    Megatron's accumulation hide part of it behind the last backward."""
    model = {
        "num_layers": 4,
        "hidden_size": 512,
        "num_heads": 8,
        "ffn_hidden_size": 2048,
        "seq_length": 64,
    }

    def dp_comm(accum, overlap, engine="trainer"):
        spec = spec_of(
            model,
            batch=16,
            cluster={"devices": 2, "device": {"base": "a100-80g", "comm_overlap": overlap}},
        )
        return estimate(spec, cand(dp=2, fusion_mb=1, grad_accum=accum), engine=engine).breakdown[
            "time_s"
        ]["dp_comm"]

    assert dp_comm(2, 1.0) == pytest.approx(dp_comm(2, 0.0))
    assert dp_comm(1, 1.0) < dp_comm(1, 0.0)
    assert dp_comm(2, 1.0, "megatron") < dp_comm(2, 0.0, "megatron")


def test_cpu_prices_16_bit_hidden_state_messages_slower():
    """benchmarks/records/allreduce_in_graph.py: a float16 all-reduce costs ≈3.5× its α–β price
    on CPU."""

    def pp_comm(factor=None):
        device = {"half_collective_factor": factor} if factor else None
        spec = spec_of(
            batch=8,
            cluster={"backend": "cpu", "devices": 2, "devices_per_node": 2, "device": device},
        )
        return estimate(spec, cand(pp=2, micro_batches=2)).breakdown["time_s"]["pp_comm"]

    assert pp_comm() == pytest.approx(3.5 * pp_comm(1.0))


def test_jit_level_scales_compute_and_loss_scale_warmup_do_nothing():
    spec = spec_of()
    o1 = estimate(spec, cand(jit="O1"))
    pynative = estimate(spec, cand(jit="pynative"))
    ratio = pynative.breakdown["time_s"]["compute"] / o1.breakdown["time_s"]["compute"]
    assert ratio == pytest.approx(PROFILES["a100-80g"].jit_pynative)
    other = Candidate(1, 1, 1, 1, 64, 1, 2**8, 1000, "O1", "none")
    assert estimate(spec, other).as_dict() == o1.as_dict()


# -- the MLP family: one row per sample ------------------------------------------------------

MLP_MODEL = {
    "family": "mlp",
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 2,
    "ffn_hidden_size": 256,
    "vocab_size": 10,
}


def test_mlp_prices_one_row_per_sample():
    short, long = (
        estimate(spec_of({**MLP_MODEL, "seq_length": s}, batch=8), cand()) for s in (4, 4096)
    )
    assert short.as_dict() == long.as_dict()  # seq_length plays no part
    # per sample: 2 layers × 3 × 2·(2·h·ffn), plus the head and input projection 6·h·(V + h)
    flops = 8 * (2 * 3 * 2 * 2 * 64 * 256 + 6 * 64 * (10 + 64))
    assert short.mfu * short.step_time_s * 312e12 == pytest.approx(flops)
    # kept per row: 2 layers × (2h + 2·ffn) at 2 bytes, the head 4·h·(1 + V/h) (16-bit count)
    rows = 8 * (2 * (2 * 64 + 2 * 256) * 2 + 4 * 64 * (1 + 10 / 64))
    assert short.breakdown["memory_gb"]["activations"] * GIB == pytest.approx(rows)


def test_mlp_tensor_parallel_messages_are_one_row_per_sample():
    est = estimate(
        spec_of({**MLP_MODEL, "vocab_size": 16}, batch=8, cluster={"devices": 2}), cand(tp=2)
    )

    def allreduce(size):  # 2 ranks on NVLink: α = 20 + 2·2 µs, 2·(1/2)·S/B
        return 24e-6 + size / (300e9 * 0.8)

    # per layer 1 forward + 1 backward, the head's backward: (8 rows × 64) in float16; the
    # cross-entropy's float32 max (2·8), sum (8) and target logit (8)
    expected = 5 * allreduce(8 * 64 * 2) + allreduce(2 * 8 * 4) + 2 * allreduce(8 * 4)
    assert est.breakdown["time_s"]["tp_comm"] == pytest.approx(expected)


# -- CPU profile against the MLP measurement it was fitted to ---------------------------------
# docs/mindspore-cpu.md, "Activation recompute": the numbers below are the first measurement;
# the doc's re-measurement on 2026-11-29 differs (2,139 MB / 9.38 s, full 1,104 MB / 12.39 s).


@pytest.mark.parametrize(
    "mode, measured_mb, measured_s", [("none", 1938, 7.35), ("full", 1019, 9.50)]
)
def test_cpu_profile_reproduces_the_measured_mlp(mode, measured_mb, measured_s):
    # 8 residual MLP blocks, d 256, 64 × 256 = 16384 rows of d features, fp32, GRAPH_MODE, one
    # process. An MLP sample is one row, so the batch is 16384.
    spec = spec_of(
        {
            "family": "mlp",
            "num_layers": 8,
            "hidden_size": 256,
            "num_heads": 1,
            "ffn_hidden_size": 1024,
            "seq_length": 256,
            "vocab_size": 256,
            "dtype": "float32",
        },
        batch=64 * 256,
        cluster={"backend": "cpu", "devices_per_node": 1, "device": None, "device_memory_gb": 16},
    )
    est = estimate(spec, cand(jit="O1", recompute=mode))
    assert est.memory_gb_per_device * 1024 == pytest.approx(measured_mb, rel=0.10)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.10)


# -- feasibility -----------------------------------------------------------------------------


def test_out_of_memory_candidate_is_infeasible_with_its_memory_in_the_reason():
    spec = spec_of(
        {
            "num_layers": 32,
            "hidden_size": 4096,
            "num_heads": 32,
            "ffn_hidden_size": 11008,
            "seq_length": 4096,
            "vocab_size": 32000,
        },
        batch=8,
        cluster={"devices": 1},
    )
    est = estimate(spec, cand(grad_accum=8))
    assert not est.feasible
    assert f"predicted {est.memory_gb_per_device:.1f} GB/device > 80 GB × 0.9" in est.reason
    assert est.memory_gb_per_device > 72


def test_constraint_violation_is_infeasible_with_that_reason():
    est = estimate(spec_of(cluster={"devices": 4}), cand(dp=2))
    assert not est.feasible
    assert "dp·tp·pp = 2 ≠ cluster.devices = 4" in est.reason
    assert math.isnan(est.step_time_s)


def test_o2_is_infeasible_off_ascend():
    assert not estimate(spec_of(), cand(jit="O2")).feasible
    assert estimate(spec_of(cluster={"device": "ascend-910b"}), cand(jit="O2")).feasible


def test_entry_model_without_dimensions_is_not_estimated():
    spec = parse_spec(
        {
            "model": {"entry": "json:loads"},
            "train": {"global_batch_size": 8},
            "cluster": {"backend": "cpu", "devices": 1},
        },
        Path("t.yaml"),
    )
    est = estimate(spec, cand())
    assert est.feasible and est.reason == NOT_ESTIMATED and math.isnan(est.memory_gb_per_device)
    json.dumps(est.as_dict(), allow_nan=False)  # NaN → null


def test_as_dict_is_strict_json_with_exactly_the_contract_keys():
    d = estimate(spec_of(), cand()).as_dict()
    assert set(d) == {
        "feasible",
        "reason",
        "memory_gb_per_device",
        "step_time_s",
        "samples_per_s",
        "tflops_per_device",
        "mfu",
        "breakdown",
        "not_modelled",
    }
    assert d["not_modelled"] == []
    assert set(d["breakdown"]["time_s"]) == TIME_KEYS
    assert set(d["breakdown"]["memory_gb"]) == MEMORY_KEYS
    assert sum(d["breakdown"]["time_s"].values()) == pytest.approx(d["step_time_s"])
    assert sum(d["breakdown"]["memory_gb"].values()) == pytest.approx(d["memory_gb_per_device"])
    json.dumps(d, allow_nan=False)


def test_format_estimate_is_a_readable_table():
    text = format_estimate(estimate(spec_of(), cand()))
    assert "feasible" in text and "MFU" in text and "tp_comm" in text and "activations" in text


# -- profiles ---------------------------------------------------------------------------------


def test_profiles_by_name_mapping_and_backend():
    assert resolve_profile(spec_of().cluster).memory_gb == 80
    h200 = resolve_profile(spec_of(cluster={"device": "h200"}).cluster)
    assert (h200.memory_gb, h200.peak_tflops) == (141, 989)
    h100nvl = {"base": "h100-80g", "memory_gb": 94}
    custom = resolve_profile(spec_of(cluster={"device": h100nvl}).cluster)
    assert (custom.memory_gb, custom.peak_tflops) == (94, 989)
    gpu = resolve_profile(
        spec_of(cluster={"backend": "gpu", "device": None, "device_memory_gb": 40}).cluster
    )
    assert (gpu.name, gpu.memory_gb) == ("a100-80g", 40)
    ascend = resolve_profile(spec_of(cluster={"backend": "ascend", "device": None}).cluster)
    assert ascend.name == "ascend-910b"
    cpu = resolve_profile(
        spec_of(
            cluster={
                "backend": "cpu",
                "device": None,
                "devices": 2,
                "devices_per_node": 2,
                "device_memory_gb": 8,
            }
        ).cluster
    )
    assert cpu.kind == "cpu" and cpu.memory_gb == 8


@pytest.mark.parametrize(
    "device, message",
    [
        ("tpu-v9", "unknown device profile"),
        ({"base": "a100-80g", "flops": 1}, "cluster.device.flops: unknown field"),
        ({"memory_gb": 80}, "give base"),
        ({"base": "a100-80g", "memory_gb": "lots"}, "must be a number"),
        ({"base": "a100-80g", "peak_tflops": 0}, "must be a number > 0"),
    ],
)
def test_bad_device_input_is_a_spec_error(device, message):
    with pytest.raises(SpecError, match=message):
        estimate(spec_of(cluster={"device": device}), cand())


# -- calibration -----------------------------------------------------------------------------


def test_calibration_moves_the_estimate_onto_measured_values():
    spec = spec_of()
    raw = estimate(spec, cand())
    measured_mb, measured_ms = raw.memory_gb_per_device * 1024 * 2, raw.step_time_s * 1000 / 2
    cal = Calibration.from_pairs(
        [
            (raw, measured_mb, measured_ms),
            (raw, measured_mb, measured_ms),
            (raw, float("nan"), None),
        ]
    )  # unusable numbers are skipped
    assert (cal.memory_factor, cal.time_factor, cal.n_memory, cal.n_time) == pytest.approx(
        (2.0, 0.5, 2, 2)
    )
    fixed = estimate(spec, cand(), calibration=cal)
    assert fixed.memory_gb_per_device * 1024 == pytest.approx(measured_mb)
    assert fixed.step_time_s * 1000 == pytest.approx(measured_ms)
    assert fixed.samples_per_s == pytest.approx(2 * raw.samples_per_s)
    # a calibrated estimate fed back does not compound
    again = Calibration.from_pairs([(fixed, measured_mb, measured_ms)])
    assert (again.memory_factor, again.time_factor) == pytest.approx((2.0, 0.5))
    assert Calibration.from_dict(json.loads(json.dumps(cal.as_dict()))) == cal
    assert Calibration.from_pairs([]) == Calibration()


def test_calibrated_memory_decides_feasibility():
    spec = spec_of()
    raw = estimate(spec, cand())
    cal = Calibration(memory_factor=80 * 0.95 / raw.memory_gb_per_device)
    est = estimate(spec, cand(), calibration=cal)
    assert raw.feasible and not est.feasible and "predicted 76.0 GB/device" in est.reason


# -- the parallel optimizer, as the trainer runs it ----------------------------------------------


def test_parallel_optimizer_memory_and_traffic_by_hand():
    # h=128, ffn=512, V=256, s=32, L=2, float32 parameters: sharded (64 KB or more, dim 0 even)
    # are qkv 384·128, proj 128·128 (64 KB exactly: MindSpore skips only smaller ones), fc_in
    # 512·128, fc_out 128·512 per layer, the token table 256·128 and the head 256·128; biases,
    # norms and the 32·128 position table (16 KB) stay whole.
    sharded = 2 * (384 * 128 + 128 * 128 + 512 * 128 + 128 * 512) + 256 * 128 + 256 * 128
    assert sharded == 458752
    spec = spec_of({"hidden_size": 128, "ffn_hidden_size": 512}, cluster={"devices": 2})
    on_candidate = Candidate(2, 1, 1, 1, 64, 1, 2**16, 0, "O1", "none", True)
    off, on = (estimate(spec, c, engine="trainer") for c in (cand(dp=2), on_candidate))
    m_off, m_on = off.breakdown["memory_gb"], on.breakdown["memory_gb"]
    # each of the 2 ranks keeps Adam's two float32 moments of half the sharded rows …
    assert (m_off["optimizer_states"] - m_on["optimizer_states"]) * GIB == pytest.approx(
        8 * sharded / 2
    )
    # … and a float32 copy of its half, which the optimizer updates before the rows are gathered
    assert (m_on["params"] - m_off["params"]) * GIB == pytest.approx(4 * sharded / 2)
    assert m_on["grads"] == m_off["grads"] and m_on["activations"] == m_off["activations"]
    # the gather: one all-reduce of the sharded parameters (float32) over the dp group of 2
    profile = resolve_profile(spec.cluster)
    gather = allreduce_time(4 * sharded, 2, profile.intra_node_gbps, profile)
    t_off, t_on = off.breakdown["time_s"], on.breakdown["time_s"]
    assert t_on["dp_comm"] - t_off["dp_comm"] == pytest.approx(gather)
    # Adam reads and writes the state of the rows a rank owns only
    whole = t_off["optimizer"] / (states_bytes(off) / 16)
    assert t_on["optimizer"] == pytest.approx(whole * (states_bytes(off) / 16 - sharded / 2))
    # MindSpore's own at its default level (the simulate backend's default engine) keeps the
    # owned half of each sharded parameter, with no copy, and all-gathers it for the forward in
    # the float16 compute dtype (the all-gather moves after the cast); the gathered copy lives
    # until the backward. It reduce-scatters those gradients: the owned half is kept (half an
    # all-reduce's bytes, overlapped alike; one 64 MB bucket here: no overlap).
    ms_off, ms_on = (estimate(spec, c) for c in (cand(dp=2), on_candidate))
    assert ms_off.breakdown == off.breakdown
    m_ms = ms_on.breakdown["memory_gb"]
    assert (m_ms["params"] - m_off["params"]) * GIB == pytest.approx(2 * sharded - 4 * sharded / 2)
    assert (m_off["grads"] - m_ms["grads"]) * GIB == pytest.approx(4 * sharded / 2)
    assert m_ms["optimizer_states"] == m_on["optimizer_states"]
    grads = states_bytes(off) / 16 * 4
    alpha = 20e-6 + 2e-6  # launch + one hop, 2 ranks (a100-80g profile)
    reduced = allreduce_time(grads - 4 * sharded / 2, 2, profile.intra_node_gbps, profile)
    gathered = alpha + 0.5 * 2 * sharded / (profile.intra_node_gbps * 1e9 * profile.link_efficiency)
    assert ms_on.breakdown["time_s"]["dp_comm"] == pytest.approx(reduced + gathered)


def test_parallel_optimizer_changes_nothing_without_a_dp_group_and_megatron_shards_its_states():
    spec = spec_of({"hidden_size": 128, "ffn_hidden_size": 512}, cluster={"devices": 2})
    on = Candidate(1, 2, 1, 1, 64, 1, 2**16, 0, "O1", "none", True)
    assert estimate(spec, on).breakdown == estimate(spec, cand(tp=2)).breakdown
    on_dp = Candidate(2, 1, 1, 1, 64, 1, 2**16, 0, "O1", "none", True)
    # Megatron's distributed optimizer (ZeRO-1): master weights and moments over dp, the
    # update on the owned half; parameters, gradients and their traffic as they were
    sharded = estimate(spec, on_dp, engine="megatron").breakdown
    whole = estimate(spec, cand(dp=2), engine="megatron").breakdown
    for part in ("params", "grads", "activations"):
        assert sharded["memory_gb"][part] == whole["memory_gb"][part]
    assert sharded["time_s"]["dp_comm"] == whole["time_s"]["dp_comm"]
    ratio = sharded["memory_gb"]["optimizer_states"] / whole["memory_gb"]["optimizer_states"]
    # every parameter's states split evenly over dp: no MindSpore threshold, none left whole
    assert ratio == pytest.approx(0.5)
    assert sharded["time_s"]["optimizer"] < 0.6 * whole["time_s"]["optimizer"]  # owned rows


# -- MindSpore's own run (engine "mindspore", the simulate backend's default) -------------------


def test_mindspore_pipeline_runs_one_forward_and_keeps_1f1b_activations_on_stage_0():
    # pp 2, 4 micro-batches of 1: stage 0 holds 2 of them between forward and backward, each
    # with its layers' activations (MindFormers' PipelineCell, 1F1B); no forward runs twice
    spec = spec_of(PIPELINE_MODEL, batch=4, cluster={"devices": 2})
    c = cand(pp=2, micro_batches=4, recompute="selective")
    est = estimate(spec, c, engine="mindspore")
    stages = memory_per_stage(workload_for(spec.model), c, 1, 4, "float16", 0.0, "mindspore")
    sh = 1024 * 1024
    one = 4 * 34 * sh + sh  # 4 layers × 34·s·h, plus the embedding's dropout mask
    assert stages[0]["activations"] * GIB == pytest.approx(2 * one)
    trainer = memory_per_stage(workload_for(spec.model), c, 1, 4, "float16", 0.0, "trainer")
    assert trainer[0]["activations"] * GIB == pytest.approx(one)  # token ids wait, not activations
    assert est.breakdown["time_s"]["recompute"] == pytest.approx(
        estimate(spec, c, engine="megatron").breakdown["time_s"]["recompute"]
    )
    assert (
        estimate(spec, c, engine="trainer").breakdown["time_s"]["recompute"]
        > est.breakdown["time_s"]["recompute"]
    )


LLAMA_MODEL = {
    "family": "llama",
    "num_layers": 4,
    "hidden_size": 1024,
    "num_heads": 16,
    "num_kv_heads": 4,
    "ffn_hidden_size": 2048,
    "seq_length": 1024,
    "vocab_size": 4096,
}


def test_mindformers_token_table_keeps_whole_optimizer_states_unless_its_config_shards_it():
    # dp 2, float32: the 4096 × 1024 table (16 MB) is over the threshold, but MindFormers'
    # LlamaEmbedding creates it with parallel_optimizer=False (model_config.parallel_optimizer's
    # default), so both ranks keep its Adam moments whole; the head (also 4096 × 1024) is sharded
    table = 4096 * 1024
    on = Candidate(2, 1, 1, 1, 64, 1, 2**16, 0, "O1", "none", True)
    default = spec_of(LLAMA_MODEL, batch=2, cluster={"devices": 2})
    sharding = spec_of(
        {**LLAMA_MODEL, "embedding_parallel_optimizer": True}, batch=2, cluster={"devices": 2}
    )
    for engine in ("mindspore", "trainer"):  # the trainer shards what MindFormers shards
        whole, split = (
            estimate(s, on, engine=engine).breakdown["memory_gb"] for s in (default, sharding)
        )
        assert (whole["optimizer_states"] - split["optimizer_states"]) * GIB == pytest.approx(
            8 * table / 2
        )


def test_llama_selective_recompute_is_mindformers_patterns_and_their_activations_are_saved():
    # per layer and sample at t = 2, 16-bit: s·(8h + (4h + 4·kv + 8·ffn)/t) kept without
    # recompute (+ 2·a·s²/t scores unfused); MindFormers' selective patterns (the SwiGLU's SiLU
    # and product) save 4·s·ffn/t, and unfused the attention core (its scores) too
    s, h, kv, f, a = 1024, 1024, 256, 2048, 16
    none = s * (8 * h + (4 * h + 4 * kv + 8 * f) / 2)
    model = spec_of(LLAMA_MODEL).model
    fused, plain = workload_for(model, fused_attention=True), workload_for(model)
    assert fused.layer_activations(2, "none", 2) == pytest.approx(none)
    assert fused.layer_activations(2, "selective", 2) == pytest.approx(none - 4 * s * f / 2)
    assert plain.layer_activations(2, "none", 2) == pytest.approx(none + 2 * a * s * s / 2)
    assert plain.layer_activations(2, "selective", 2) == pytest.approx(none - 4 * s * f / 2)
    # the patterns are element-wise (no FLOPs); unfused, QKᵀ and AV run again
    assert fused.recompute_flops("selective") == 0
    assert plain.recompute_flops("selective") == pytest.approx(4 * s * s * h)


def test_fused_attention_is_priced_as_the_causal_half():
    # forward FLOPs per layer and sample: s·(4h² + 4h·kv + 6h·ffn) + 4·s²·h, the last term the
    # s × s scores; flash attention with next_tokens = 0 computes their lower half
    s, h, kv, f = 1024, 1024, 256, 2048
    model = spec_of(LLAMA_MODEL).model
    gemms = s * (4 * h * h + 4 * h * kv + 6 * h * f)
    assert workload_for(model).layer_flops() == pytest.approx(3 * (gemms + 4 * s * s * h))
    assert workload_for(model, fused_attention=True).layer_flops() == pytest.approx(
        3 * (gemms + 2 * s * s * h)
    )


def test_megatron_runs_flash_attention_on_a_gpu_where_mindspore_stores_the_scores():
    # an A100: MindSpore has no fused attention there, Megatron's --use-flash-attn has
    flash = spec_of({**LLAMA_MODEL, "flash_attention": True}, cluster={"devices": 8})
    plain = spec_of(LLAMA_MODEL, cluster={"devices": 8})
    c = cand(dp=8)  # one sample a device, the 4 layers on one stage, nothing recomputed

    def activations(spec, engine):
        return estimate(spec, c, engine=engine).breakdown["memory_gb"]["activations"] * GIB

    s, a, layers = 1024, 16, 4
    scores = layers * 2 * a * s * s  # the softmax output each layer keeps, 16-bit
    assert activations(plain, "megatron") - activations(flash, "megatron") == pytest.approx(scores)
    assert activations(flash, "mindspore") == activations(plain, "mindspore")
    fused, unfused = (estimate(x, c, engine="megatron") for x in (flash, plain))
    assert fused.breakdown["time_s"]["compute"] < unfused.breakdown["time_s"]["compute"]


def test_megatron_sequence_parallelism_keeps_each_linear_input_as_its_shard():
    # Megatron's sequence-parallel linear layers save their input's shard and all-gather it
    # again in the backward: a layer keeps its two norm inputs and the two matmul inputs as
    # s·h/t shards (8·s·h/t in 16-bit bytes) where without it they are whole (8·s·h)
    spec = spec_of({**LLAMA_MODEL, "sequence_parallel": True}, cluster={"devices": 8})
    whole = spec_of(LLAMA_MODEL, cluster={"devices": 8})
    c = cand(dp=2, tp=4)  # 4 samples a micro-batch, the 4 layers on one stage
    split, kept = (estimate(x, c, engine="megatron") for x in (spec, whole))
    s, h, t = 1024, 1024, 4
    saved = 4 * 4 * s * 8 * h * (1 - 1 / t)
    activations = (
        kept.breakdown["memory_gb"]["activations"] - split.breakdown["memory_gb"]["activations"]
    )
    assert activations * GIB == pytest.approx(saved)
    assert split.not_modelled == ()  # the megatron engine prices it
    assert estimate(spec, c, engine="trainer").not_modelled  # autotune's trainer does not


def test_sequence_parallelism_and_per_stage_recompute_as_mindformers_runs_them():
    # tp 4, pp 2 (2 layers a stage); layer 0 recomputes selectively with its norms' all-gather,
    # the others keep everything: under sequence parallelism the norm inputs are s·h/t each and
    # the matmuls' gathered inputs s·h each (s·h/t when their all-gather is recomputed)
    marks = {"select_recompute": [0], "select_comm_recompute": [0]}
    model = {**LLAMA_MODEL, "sequence_parallel": True, "recompute_layers": marks}
    spec = spec_of(model, batch=8, cluster={"devices": 8, "device": "ascend-910b"})
    s, h, kv, f, t = 1024, 1024, 256, 2048, 4
    body = (4 * h + 4 * kv) / t
    plain = s * (4 * h / t + 4 * h + body + 8 * f / t) + 2 * 16 * s * s / t  # 16-bit bytes
    marked = s * (8 * h / t + body + 4 * f / t)  # selective: no scores, no SiLU and product
    c = cand(tp=4, pp=2, micro_batches=4, recompute="selective")
    work = workload_for(spec.model, sequence_parallel=True)
    assert work.stage_modes("selective", 2, 0) == ((("none", False), 1), (("selective", True), 1))
    assert work.stage_modes("none", 2, 0) == ((("none", False), 1), (("none", True), 1))
    stages = memory_per_stage(work, c, 2, 4, "float16", 0.0, "mindspore")
    assert stages[0]["activations"] * GIB == pytest.approx(2 * 2 * (plain + marked))  # 2 in flight
    est = estimate(spec, c)  # simulate: engine mindspore, the model.yaml's sequence parallelism
    assert est.not_modelled == ()
    trainer = estimate(spec, c, engine="trainer")
    assert [note.split(":")[0] for note in trainer.not_modelled] == [
        "model.sequence_parallel",
        "model.recompute_layers.select_comm_recompute",
    ]
    assert trainer.memory_gb_per_device > est.memory_gb_per_device
    assert "not modelled" in format_estimate(trainer)
