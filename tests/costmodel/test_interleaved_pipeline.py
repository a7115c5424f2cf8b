"""model.pipeline_interleave: Megatron's virtual pipeline (interleaved 1F1B), priced by the
megatron engine — the bubble over v, v times the pipeline sends overlapped with the chunks,
Megatron-Core's warm-up activations — and noted, not priced, by the others; refused beside DualPipe."""

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.memory import memory_per_stage
from autotune.costmodel.workload import workload_for
from autotune.spec.errors import SpecError
from tests.costmodel.test_moe import QWEN3_30B_A3B, candidate, spec_of

PP, V, MICRO = 4, 4, 16
PER_MICRO = ("dp_comm", "bubble", "optimizer", "host")  # the parts not paid per micro-batch


def priced(interleave=None, engine="megatron"):
    """Qwen3-30B-A3B (48 layers) on one node of 8: tp 2 × pp 4, 16 micro-batches."""
    extra = {"pipeline_interleave": interleave} if interleave else {}
    spec = spec_of(QWEN3_30B_A3B, devices=8, batch=64, **extra)
    c = candidate(spec, dp=1, tp=2, pp=PP, ep=1, micro_batches=MICRO, recompute="selective")
    return spec, c, estimate(spec, c, engine=engine, refuse=False)


def test_the_bubble_shrinks_v_times_and_the_sends_hide_behind_the_chunks():
    _, _, plain = priced()
    _, _, chunked = priced(V)
    t1, t2 = plain.breakdown["time_s"], chunked.breakdown["time_s"]
    pace = sum(t2[p] for p in t2 if p not in PER_MICRO) / MICRO
    assert t2["bubble"] == pytest.approx((PP - 1) * pace / V, rel=1e-9)
    assert t1["bubble"] > 3 * t2["bubble"]
    # v times the sends, overlapped with the chunks' kernels (Megatron's overlap_p2p_comm)
    assert t2["pp_comm"] == 0.0 < t1["pp_comm"]
    assert t2["compute"] == t1["compute"]
    assert not chunked.not_modelled


def test_the_first_stage_keeps_megatrons_warm_up_chunks():
    """Rank r keeps (pp − r − 1)·2 + (v − 1)·pp + 1 chunks of L / (pp·v) layers: rank 0
    pp + (pp − 1)/v micro-batches' worth of its stage, 1F1B's pp times 1 + (pp − 1)/(pp·v)."""
    stages = {}
    for interleave in (None, V):
        spec, c, _ = priced(interleave)
        work = workload_for(spec.model, fused_attention=True).executed_by("megatron")
        stages[interleave] = memory_per_stage(work, c, 1, MICRO, "bfloat16", 0.0, "megatron")
    first = stages[V][0]["activations"] / stages[None][0]["activations"]
    assert first == pytest.approx(1 + (PP - 1) / (PP * V), rel=1e-9)
    last = stages[V][-1]["activations"] / stages[None][-1]["activations"]
    assert last > 1  # 1F1B's last stage keeps one micro-batch; interleaved, (v − 1)·pp + 1 chunks


def test_other_engines_price_1f1b_and_say_so():
    _, c, plain = priced(engine="mindspore")
    _, _, chunked = priced(V, engine="mindspore")
    assert chunked.breakdown == plain.breakdown
    assert any("pipeline_interleave" in note for note in chunked.not_modelled)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"pipeline_interleave": 0}, "pipeline_interleave"),
        ({"pipeline_interleave": 2, "pipeline_schedule": "dualpipe"}, "not with pipeline_schedule"),
    ],
)
def test_an_interleave_below_1_or_beside_dualpipe_is_refused_by_field(extra, message):
    with pytest.raises(SpecError, match=message):
        spec_of(QWEN3_30B_A3B, **extra)
