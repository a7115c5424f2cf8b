"""model.fsdp: Megatron-FSDP (ZeRO-3), priced by the megatron engine — parameters and gradients
sharded as the distributed optimizer shards the states, two layers' worth whole; each
micro-batch's gathers and reduce-scatter behind its kernels — and noted by the others."""

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.collectives import allgather_time
from autotune.costmodel.fsdp import TRANSFERS, UNITS_UNSHARDED
from autotune.costmodel.memory import distributed_elements, rank_params
from autotune.costmodel.profiles import resolve_profile
from autotune.costmodel.workload import workload_for
from tests.costmodel.test_moe import DENSE, candidate, spec_of

LAYERS = DENSE["num_layers"]


# a 910B whose nodes are joined by a tenth of its links: the gathers outlast a micro-batch
SLOW_NODES = {"base": "ascend-910b", "inter_node_gbps": 2.5}


def priced(fsdp, engine="megatron", devices=8, batch=64, grad_accum=4, device="ascend-910b"):
    """A dense Qwen3-30B-A3B shape, dp over every device (8 per node), full recompute."""
    spec = spec_of(DENSE, devices=devices, batch=batch, device=device, fsdp=fsdp)
    c = candidate(
        spec,
        dp=devices,
        tp=1,
        pp=1,
        ep=1,
        micro_batches=1,
        grad_accum=grad_accum,
        recompute="full",
        parallel_optimizer=True,
    )
    return spec, c, estimate(spec, c, engine=engine, refuse=False)


def test_parameters_and_gradients_shard_as_the_states_with_two_layers_whole():
    spec, c, zero1 = priced(False)
    _, _, zero3 = priced(True)
    work = workload_for(spec.model, fused_attention=True).executed_by("megatron")
    local = rank_params(work, 1, 1, 1)[0]
    owned = distributed_elements(work, c.dp, 1, 1, 1)[0]
    share = (owned + UNITS_UNSHARDED * local / LAYERS) / local
    m1, m3 = zero1.breakdown["memory_gb"], zero3.breakdown["memory_gb"]
    for part in ("params", "grads"):
        assert m3[part] == pytest.approx(m1[part] * share, rel=1e-9)
    assert m3["optimizer_states"] == m1["optimizer_states"]  # ZeRO-1 sharded them already
    assert zero3.memory_gb_per_device < zero1.memory_gb_per_device
    assert not zero3.not_modelled


def test_each_micro_batch_gathers_twice_and_scatters_once_behind_its_kernels():
    """16 devices on two slowly joined nodes, one sample each."""
    spec, c, zero3 = priced(True, devices=16, batch=16, grad_accum=1, device=SLOW_NODES)
    _, _, zero1 = priced(False, devices=16, batch=16, grad_accum=1, device=SLOW_NODES)
    work = workload_for(spec.model, fused_attention=True).executed_by("megatron")
    profile = resolve_profile(spec.cluster)
    nbytes = TRANSFERS * rank_params(work, 1, 1, 1)[0] * 2  # bf16
    comm = allgather_time(nbytes, 16, profile.inter_node_gbps, profile)
    t3 = zero3.breakdown["time_s"]
    kernels = t3["compute"] + t3["recompute"]
    assert comm > kernels
    assert t3["dp_comm"] == pytest.approx(comm - kernels, rel=1e-9)
    assert t3["dp_comm"] != zero1.breakdown["time_s"]["dp_comm"]


def test_other_engines_and_one_replica_price_it_as_before():
    _, _, plain = priced(False, engine="mindspore")
    _, _, sharded = priced(True, engine="mindspore")
    assert sharded.breakdown == plain.breakdown
    assert any("model.fsdp" in note for note in sharded.not_modelled)
    _, _, alone = priced(True, devices=1, batch=4)
    assert alone.breakdown == priced(False, devices=1, batch=4)[2].breakdown
