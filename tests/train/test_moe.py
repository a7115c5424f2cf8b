"""The llama family's experts and latent attention in the trainer: the parameters
`autotune.families.moe` lists, each part against numpy, and a model of both that learns."""

import json

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


# seconds of real MindSpore compiling and training: the slow tier keeps `make test` in its
# 5 minutes
@pytest.mark.slow
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
    # the busiest of 4 experts over the mean: above even, below every token's 2 on the same 2
    assert 1.0 < metrics["router_imbalance"] < 2.0


def test_router_imbalance_is_busiest_over_mean_averaged_over_layers_and_steps():
    from autotune.train.metrics import router_imbalance

    even, skewed, dense = [2, 2, 2, 2], [4, 2, 1, 1], [0, 0, 0, 0]
    assert router_imbalance([[even, dense]]) == 1.0  # a dense layer routes nothing
    assert router_imbalance([[even, skewed], [skewed, skewed]]) == pytest.approx(
        (1 + 2 + 2 + 2) / 4
    )
    assert router_imbalance([[dense]]) is None


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


@pytest.mark.parametrize(
    "dp, tp, ep, groups",
    [
        # ep carved out of dp·tp, its axis fastest: an ep group is ep adjacent ranks, the ranks
        # holding the same experts stride by ep; groups of the same ranks are reused by name
        (2, 2, 2, [("tp-0-1", "dp-0-2", 0), ("tp-0-1", "dp-1-3", 1), ("tp-2-3", "dp-0-2", 0)]),
        (4, 1, 2, [("ep-0-1", "experts-0-2", 0), ("ep-0-1", "experts-1-3", 1)]),
        (2, 1, 2, [(None, None, 0), (None, None, 1)]),  # the world; one rank per expert block
    ],
)
def test_expert_groups_are_carved_out_of_dp_and_tp(ms, dp, tp, ep, groups):
    from autotune.train.parallel.groups import Placement

    for rank, (ep_group, expert_group, ep_index) in enumerate(groups):
        p = Placement.of(rank, dp, tp, 1, ep)
        assert (p.ep_group, p.expert_group, p.ep_index) == (ep_group, expert_group, ep_index)
        assert p.expert_replicas == dp * tp // ep


def test_the_trainer_runs_ep_and_refuses_cp(tmp_path):
    from autotune.train.config import ConfigError
    from autotune.train.config_check import check_config
    from tests.conftest import make_config

    def config(model, **knobs):
        return json.loads(make_config(tmp_path, model=model, knobs=knobs).read_text())

    check_config(config(MOE, dp=2, ep=2))
    with pytest.raises(ConfigError, match="knobs.cp: 2: the trial program runs no context"):
        check_config(config(MOE, dp=2, cp=2))
    with pytest.raises(ConfigError, match="knobs.ep: 2: the model has no experts"):
        check_config(config({"family": "llama"}, dp=2, ep=2))
    with pytest.raises(ConfigError, match="ep = 8 does not divide"):
        check_config(config(MOE, dp=8, ep=8))


# -- expert parallelism: every layout trains to one process's losses --------------------------------
# ep is carved out of dp·tp (`autotune.layout.ep_coords`); tp with experts runs with sequence
# parallelism around them, as MindFormers requires (`autotune.spec.constraints.expert_reasons`)
MOE_LAYOUTS = {
    "dp2-ep2": dict(dp=2, tp=1, pp=1, ep=2, grad_accum=2),
    "tp2-ep2": dict(dp=1, tp=2, pp=1, ep=2, grad_accum=2),
    "tp2": dict(dp=1, tp=2, pp=1, grad_accum=2),
    "pp2": dict(dp=1, tp=1, pp=2, micro_batches=2),
    "dp2-tp2-ep2": dict(dp=2, tp=2, pp=1, ep=2, grad_accum=2),
    "dp2-pp2-ep2": dict(dp=2, tp=1, pp=2, ep=2, micro_batches=2),
    "dp4-ep2": dict(dp=4, tp=1, pp=1, ep=2, grad_accum=2),
}
# experts of 128: each stacked weight 64 KB, so the parallel optimizer shards it
WIDE_EXPERTS = MOE | {"moe_ffn_hidden_size": 128, "sequence_parallel": True}


def _imbalance(out) -> float:
    return json.loads((out / "metrics.json").read_text())["router_imbalance"]


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    from tests.train.test_parallel import _launch

    one = dict(dp=1, tp=1, pp=1, grad_accum=2)
    out = tmp_path_factory.mktemp("moe") / "r"
    losses, ranks = _launch(out, one, base=MOE | {"sequence_parallel": True})
    # 3 measured steps (measure_after 1) × 2 MoE layers × 16·8 tokens × top 2
    assert ranks[0]["routed_slots"] == 3 * 2 * 128 * 2
    return {
        "moe": losses,
        "imbalance": _imbalance(out),
        "wide": _launch(tmp_path_factory.mktemp("wide") / "r", one, base=WIDE_EXPERTS)[0],
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE_LAYOUTS)
def test_expert_parallel_layouts_train_to_the_losses_of_one_process(tmp_path, moe_reference, name):
    """Routed experts split over ep (all-gather dispatch over the ep group, the experts'
    gradients reduced over the ranks that hold them), with dp, tp and pp: the same losses, and
    the same router load statistics (every rank's counts summed; under tp each rank counts its
    block of the group's tokens, so the tokens are counted once, as one process counts them)."""
    from tests.train.test_parallel import _launch

    knobs = MOE_LAYOUTS[name]
    losses, ranks = _launch(tmp_path / name, knobs, base=MOE | {"sequence_parallel": True})
    reference = moe_reference["moe"]
    assert len(losses) == 4 and reference[-1] < reference[0]
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    assert _imbalance(tmp_path / name) == pytest.approx(moe_reference["imbalance"], rel=1e-6)
    # the imbalance is a ratio: the slots show no token was counted on two ranks (or none);
    # a stage before the last runs its forward twice (autotune.train.step.routing)
    pp = knobs["pp"]
    slots = sum(r["routed_slots"] / (1 if r["stage"] == pp - 1 else 2) for r in ranks)
    assert slots == 3 * 2 * 128 * 2
    if knobs.get("ep", 1) > 1 and knobs["tp"] == 1 and knobs["pp"] == 1:
        # replicas but for their experts: each ep rank ends with other weights
        assert len({r["weights_sha256"] for r in ranks}) == knobs["ep"]


@pytest.mark.slow
def test_parallel_optimizer_shards_experts_over_their_replicas(tmp_path, moe_reference):
    """dp4·ep2: each expert block is held by 2 ranks, and the parallel optimizer splits its
    update between them (step ep in the stage's rank order): the losses of one process."""
    from autotune import layout
    from tests.train.test_parallel import _launch

    plan, _ = layout.builtin_layout(WIDE_EXPERTS, 1, 1, 2)
    sharded = layout.with_optimizer_shards(plan, 4, 1, 4, ep=2)
    shard = sharded["model.layers.1.feed_forward.experts.w1.weight"].opt_shard
    assert (shard.size, shard.step) == (2, 2)
    knobs = dict(dp=4, tp=1, pp=1, ep=2, grad_accum=2, parallel_optimizer=True)
    losses, _ = _launch(tmp_path / "dp4-ep2", knobs, base=WIDE_EXPERTS)
    np.testing.assert_allclose(losses, moe_reference["wide"], rtol=1e-4)
