"""Qwen3 as it is through the cost model: heads head_dim wide (not hidden / heads) and q/k norms
in the parameters, the FLOPs, the activations and fused attention. Expected numbers are worked
out here from the shapes (written out), not by calling the cost model's helpers."""

import pytest

from autotune.costmodel import estimate
from autotune.costmodel.workload import workload_for
from autotune.families.summary import model_line, parameter_count
from tests.costmodel.test_costmodel import cand, spec_of

# Hugging Face's Qwen/Qwen3-32B config.json (tests/fixtures/huggingface/Qwen3-32B)
QWEN3_32B = {
    "family": "llama",
    "num_layers": 64,
    "hidden_size": 5120,
    "num_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "qk_norm": True,
    "ffn_hidden_size": 25600,
    "seq_length": 4096,
    "vocab_size": 151936,
    "dtype": "bfloat16",
}


def test_qwen3_32b_has_the_parameters_hugging_face_counts():
    # per layer: wq 8192·5120, wk and wv 1024·5120, wo 5120·8192, the SwiGLU 3·25600·5120, the
    # two RMSNorms 2·5120 and the q/k norms 2·128; an embedding and an untied head 151936·5120
    layer = 2 * 8192 * 5120 + 2 * 1024 * 5120 + 3 * 25600 * 5120 + 2 * 5120 + 2 * 128
    total = 64 * layer + 2 * 151936 * 5120 + 5120
    assert parameter_count(QWEN3_32B) == total == 32_762_123_264
    assert parameter_count(QWEN3_32B) / 32.8e9 == pytest.approx(1, abs=0.01)  # "32.8B"
    # read as heads hidden / heads = 80 wide, without q/k norms, it was 2.3 B short
    plain = {k: v for k, v in QWEN3_32B.items() if k not in ("head_dim", "qk_norm")}
    assert parameter_count(plain) == 64 * (layer - 2 * 128 - 2 * 3072 * 5120 - 2 * 384 * 5120) + (
        2 * 151936 * 5120 + 5120
    )
    assert model_line(QWEN3_32B).startswith(
        "model: llama, 32.76 B parameters (64 layers, hidden 5120, 64 heads of 128, "
        "8 key/value heads, q/k norm, FFN 25600"
    )


def test_flops_and_activations_follow_the_heads_width():
    s, h, f, q, kv = 4096, 5120, 25600, 64 * 128, 8 * 128
    work = workload_for(spec_of(QWEN3_32B).model)
    assert (work.q_dim, work.kv_dim) == (q, kv)
    # forward per sample and layer: 2·(2h·q + 2h·kv + 3h·f)·s for the GEMMs, 4·s²·q for QKᵀ, AV
    forward = 2 * (2 * h * q + 2 * h * kv + 3 * h * f) * s + 4 * s * s * q
    assert work.layer_flops() == pytest.approx(3 * forward)
    # 16-bit bytes kept per token: norms 8h, q/k/v/o 4q + 4kv, the q/k norms' inputs 2(q + kv),
    # the SwiGLU 8f; the softmax output 2·a·s per token
    per_token = 8 * h + 4 * q + 4 * kv + 2 * (q + kv) + 8 * f
    assert work.layer_activations(1, "none", 2) == pytest.approx(s * per_token + 2 * 64 * s * s)
    without = workload_for(spec_of({**QWEN3_32B, "qk_norm": False}).model)
    assert work.layer_activations(2, "none", 2) - without.layer_activations(
        2, "none", 2
    ) == pytest.approx(s * 2 * (q + kv) / 2)
    # fused (an Ascend profile): no s² scores, the causal half of QKᵀ and AV over q, not h
    fused = workload_for(spec_of(QWEN3_32B, cluster={"device": "ascend-910b"}).model, True)
    assert fused.attention_flops() == 2 * s * s * q
    assert fused.layer_activations(1, "none", 2) == pytest.approx(s * per_token)


def test_the_estimate_of_qwen3_32b_prices_its_parameters():
    spec = spec_of(QWEN3_32B, batch=64, cluster={"devices": 64, "device": "ascend-910b"})
    est = estimate(spec, cand(dp=1, tp=8, pp=8, micro_batches=64))
    memory = est.breakdown["memory_gb"]
    # the first stage's rank (its peak): 8 layers with their matrices split 8 ways and their
    # norms whole, the embedding's rows split 8 ways; float32 parameters (param_dtype's default)
    layer = (2 * 8192 * 5120 + 2 * 1024 * 5120 + 3 * 25600 * 5120) // 8 + 2 * 5120 + 2 * 128
    assert memory["params"] * 2**30 == 4 * (8 * layer + 151936 * 5120 // 8)
