"""model.recompute_modules: Megatron-Core's selective recompute modules, each priced by what the
layer then does not keep (and, for MLA's up-projections, the FLOPs it repeats) — under the
megatron engine only; refused where a module is not priced or the model has no such part."""

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.workload import workload_for
from autotune.spec.errors import SpecError
from tests.costmodel.test_moe import DEEPSEEK_V3, DENSE, QWEN3_30B_A3B, candidate, spec_of

S = 4096  # the fixtures' sequence


def kept(model, modules, tp=1):
    """Bytes per sample one layer keeps under selective recompute (megatron engine, BF16)."""
    spec = spec_of(model, recompute_modules=list(modules), flash_attention=True)
    work = workload_for(spec.model, fused_attention=True).executed_by("megatron")
    return work.layer_activations(tp, "selective", 2), work


def test_each_module_drops_what_its_part_keeps():
    base, _ = kept(DEEPSEEK_V3, ["core_attn"])  # Megatron's default
    h, f, k, heads, d_qk, d_v = 7168, 2048, 8, 128, 192, 128
    moe_share = 58 / 61  # DeepSeek-V3's 3 dense first layers
    norms, _ = kept(DEEPSEEK_V3, ["core_attn", "layernorm"])
    assert base - norms == pytest.approx(S * 4 * h)  # the two norms' 16-bit outputs
    act, _ = kept(DEEPSEEK_V3, ["core_attn", "moe_act"])
    assert base - act == pytest.approx(S * moe_share * k * 4 * f)  # the routed SwiGLU's output
    up, work = kept(DEEPSEEK_V3, ["core_attn", "mla_up_proj"])
    # q, k and v per head no longer kept; the output projection's input still is
    assert base - up == pytest.approx(S * (4 * heads * d_qk + 2 * heads * d_v))
    up_flops = 2 * (1536 * heads * d_qk + 512 * heads * (128 + d_v))
    assert work.recompute_flops("selective") == pytest.approx(S * up_flops)
    _, plain = kept(DEEPSEEK_V3, ["core_attn"])
    assert plain.recompute_flops("selective") == 0  # flash attention: nothing to redo
    # under tensor parallelism the per-head tensors are split, the latents not
    up2, _ = kept(DEEPSEEK_V3, ["core_attn", "mla_up_proj"], tp=2)
    base2, _ = kept(DEEPSEEK_V3, ["core_attn"], tp=2)
    assert base2 - up2 == pytest.approx(S * (4 * heads * d_qk + 2 * heads * d_v) / 2)


def test_modules_price_the_megatron_engine_only():
    with_modules = spec_of(QWEN3_30B_A3B, recompute_modules=["layernorm", "moe_act"])
    without = spec_of(QWEN3_30B_A3B)
    c = candidate(without, dp=8, pp=8, ep=8, micro_batches=32, recompute="selective")
    mindspore = estimate(with_modules, c)
    assert mindspore.feasible, mindspore.reason
    assert mindspore.memory_gb_per_device == estimate(without, c).memory_gb_per_device
    assert any("recompute_modules" in note for note in mindspore.not_modelled)
    megatron = estimate(with_modules, c, engine="megatron")
    assert (
        megatron.memory_gb_per_device
        != estimate(without, c, engine="megatron").memory_gb_per_device
    )
    assert not megatron.not_modelled


@pytest.mark.parametrize(
    "model, modules, message",
    [
        (DEEPSEEK_V3, ["mlp"], "'mlp': Megatron's, not priced"),
        (DEEPSEEK_V3, ["attention"], "unknown module 'attention'"),
        (QWEN3_30B_A3B, ["mla_up_proj"], "no latent attention"),
        (DENSE, ["moe_act"], "no experts"),
    ],
)
def test_a_module_not_priced_or_absent_is_refused_by_field(model, modules, message):
    with pytest.raises(SpecError, match=f"model.recompute_modules: .*{message}"):
        spec_of(model, recompute_modules=modules)
