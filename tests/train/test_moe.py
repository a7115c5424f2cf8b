"""The llama family's experts and latent attention in the trainer: the parameters
`autotune.families.moe` lists, each part against numpy, and a model of both that learns."""

import numpy as np
import pytest

from autotune.families import parameter_shapes
from tests.conftest import train

# 3 layers, the first dense (DeepSeek's first_k_dense_replace), 4 routed experts of which a token
# takes 2 and a shared one; latent attention with a query bottleneck
MOE = {
    "family": "llama",
    "num_layers": 3,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 48,
    "seq_length": 8,
    "vocab_size": 64,
    "num_experts": 4,
    "experts_per_token": 2,
    "moe_ffn_hidden_size": 16,
    "shared_ffn_hidden_size": 16,
    "dense_layers": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
}


@pytest.fixture(scope="module")
def ms():
    import mindspore

    from autotune.train.runtime import session

    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    session.numpy2_workaround(mindspore)
    return mindspore


def _built(cfg, seed=5):
    from autotune.train import models
    from autotune.train.models import weights

    network = models.build_network(cfg)
    weights.initialize(network, cfg, models.SINGLE, seed=seed)
    return network


@pytest.mark.parametrize("q_lora_rank", [24, None], ids=["q-bottleneck", "whole-wq"])
def test_network_holds_the_parameters_the_family_lists(ms, q_lora_rank):
    cfg = MOE | {"q_lora_rank": q_lora_rank}
    network = _built(cfg)
    real = [(name, tuple(p.shape)) for name, p in network.parameters_and_names()]
    assert real == list(parameter_shapes(cfg).items())
    names = dict(real)
    assert names["model.layers.1.feed_forward.experts.w1.weight"] == (4, 16, 32)
    assert names["model.layers.1.feed_forward.router.weight"] == (4, 32)
    assert "model.layers.0.feed_forward.w1.weight" in names  # the dense first layer


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _swiglu(x, w1, w2, w3):
    return (_silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def test_moe_layer_routes_each_token_to_its_top_k_experts(ms):
    """Softmax over the experts, the top 2 renormalised, each expert a SwiGLU, plus the shared
    expert: against numpy, token by token."""
    layer = _built(MOE).model.layers[1].feed_forward
    x = np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)
    w = {n.rsplit("feed_forward.", 1)[-1]: p.asnumpy() for n, p in layer.parameters_and_names()}
    tokens = x.reshape(-1, 32)
    logits = tokens @ w["router.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.zeros_like(tokens)
    for t, row in enumerate(probs):
        top = np.argsort(-row)[:2]
        for e in top:
            expert = [w[f"experts.{k}.weight"][e] for k in ("w1", "w2", "w3")]
            expected[t] += row[e] / row[top].sum() * _swiglu(tokens[t], *expert)
    shared = [w[f"shared.{k}.weight"] for k in ("w1", "w2", "w3")]
    expected += _swiglu(tokens, *shared)
    got = layer(ms.Tensor(x)).asnumpy().reshape(-1, 32)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _rms(x, weight, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope(y, d):
    s = y.shape[-2]
    angles = np.outer(np.arange(s), 10000.0 ** -(np.arange(0, d, 2) / d))
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    return y * cos + np.concatenate([-y[..., d // 2 :], y[..., : d // 2]], -1) * sin


def test_latent_attention_matches_numpy(ms):
    """DeepSeek-V2's MLA: queries through the q bottleneck and its norm, keys and values from
    the normalised latent, one rotary key shared by the heads, scores over nope + rope."""
    attn = _built(MOE).model.layers[0].attention
    w = {n.rsplit("attention.", 1)[-1]: p.asnumpy() for n, p in attn.parameters_and_names()}
    b, s, h, heads, nope, rope, v = 2, 8, 32, 4, 8, 4, 8
    x = np.random.default_rng(1).standard_normal((b, s, h)).astype(np.float32)
    q = _rms(x @ w["wq_a.weight"].T, w["q_a_norm.weight"]) @ w["wq_b.weight"].T
    q = q.reshape(b, s, heads, nope + rope).transpose(0, 2, 1, 3)
    compressed = x @ w["wkv_a.weight"].T
    kv = _rms(compressed[..., :16], w["kv_a_norm.weight"]) @ w["wkv_b.weight"].T
    kv = kv.reshape(b, s, heads, nope + v).transpose(0, 2, 1, 3)
    k_rope = np.repeat(_rope(compressed[:, None, :, 16:], rope), heads, axis=1)
    q = np.concatenate([q[..., :nope], _rope(q[..., nope:], rope)], -1)
    k = np.concatenate([kv[..., :nope], k_rope], -1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(nope + rope) + np.triu(np.full((s, s), -1e4), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    ctx = (probs / probs.sum(-1, keepdims=True)) @ kv[..., nope:]
    expected = ctx.transpose(0, 2, 1, 3).reshape(b, s, heads * v) @ w["wo.weight"].T
    np.testing.assert_allclose(attn(ms.Tensor(x)).asnumpy(), expected, rtol=1e-4, atol=1e-5)


def test_a_model_of_experts_and_latent_attention_learns_in_one_process(tmp_path):
    metrics, steps = train(
        tmp_path,
        "moe",
        model=MOE | {"dtype": "float32"},
        knobs={"warmup_steps": 0, "grad_accum": 2},
        steps=6,
        batch=16,
    )
    losses = [s["loss"] for s in steps]
    assert len(losses) == 6 and np.isfinite(losses).all()
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("mtp_layers", 1, "multi-token prediction"),
        ("moe_capacity_factor", 1.25, "dropless"),
        ("experts_tensor_parallel", True, "over ep only"),
    ],
)
def test_what_the_trainer_does_not_build_is_refused_by_key(ms, key, value, says):
    from autotune.train import models
    from autotune.train.config import ConfigError

    with pytest.raises(ConfigError, match=f"model.{key}: .*{says}"):
        models.build_network(MOE | {key: value})
