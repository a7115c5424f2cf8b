"""In-process tests of the trial program's parts: shapes, schedule, data, accumulation, entry."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune import families as shapes
from autotune.train.models import data
from autotune.train.step import schedule
from tests.conftest import ROOT

TRANSFORMER = {
    "family": "transformer",
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 64,
    "seq_length": 8,
    "vocab_size": 64,
}
MLP = {"family": "mlp", "num_layers": 3, "hidden_size": 16, "ffn_hidden_size": 48, "vocab_size": 10}
LLAMA = {
    "family": "llama",
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "num_kv_heads": 2,
    "ffn_hidden_size": 48,
    "seq_length": 8,
    "vocab_size": 64,
}
# Qwen3-shaped: heads 16 wide over a hidden size of 32 / 4 = 8, and q/k norms
QWEN3 = LLAMA | {"head_dim": 16, "qk_norm": True}


@pytest.fixture(scope="module")
def ms():
    import mindspore

    from autotune.train.runtime import session

    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    session.numpy2_workaround(mindspore)
    return mindspore


def test_package_import_does_not_load_mindspore():
    code = "import sys, autotune.train as t; assert 'mindspore' not in sys.modules; print(t.PROGRAM_PATH)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    assert Path(out.stdout.strip()) == ROOT / "autotune" / "train" / "__main__.py"


@pytest.mark.parametrize(
    "cfg", [TRANSFORMER, MLP, LLAMA, QWEN3], ids=["transformer", "mlp", "llama", "qwen3"]
)
def test_parameter_shapes_match_network(ms, cfg):
    from autotune.train import models

    network = models.build_network(cfg)
    real = [(name, tuple(p.shape)) for name, p in network.parameters_and_names()]
    assert real == list(shapes.parameter_shapes(cfg).items())


def test_qwen3_heads_are_head_dim_wide_with_a_norm_each():
    got = shapes.parameter_shapes(QWEN3)
    layer = "model.layers.1.attention"
    assert got[f"{layer}.wq.weight"] == (4 * 16, 32) and got[f"{layer}.wo.weight"] == (32, 64)
    assert got[f"{layer}.wk.weight"] == got[f"{layer}.wv.weight"] == (2 * 16, 32)
    assert got[f"{layer}.q_layernorm.weight"] == got[f"{layer}.k_layernorm.weight"] == (16,)
    assert "model.layers.0.attention.q_layernorm.weight" not in shapes.parameter_shapes(LLAMA)


def test_parameter_shapes_transformer_names():
    got = shapes.parameter_shapes(TRANSFORMER)
    assert got["blocks.1.attn.qkv.weight"] == (96, 32)
    assert got["blocks.0.mlp.fc_out.weight"] == (32, 64)
    assert got["embed.pos.embedding_table"] == (8, 32)
    assert got["head.weight"] == (64, 32)
    with pytest.raises(ValueError, match="model.family"):
        shapes.parameter_shapes({"family": "cnn"})


def test_schedule_cell_matches_reference(ms):
    lr = schedule.WarmupCosineLR(1e-3, warmup_steps=4, total_steps=20, end_learning_rate=1e-5)
    for step in range(0, 24):
        got = float(lr(ms.Tensor([step], ms.int32)).asnumpy())
        assert got == pytest.approx(schedule.warmup_cosine(step, 1e-3, 4, 20, 1e-5), rel=1e-5)
    assert schedule.warmup_cosine(0, 1.0, 4, 20) == 0.25  # the first step already learns
    assert schedule.warmup_cosine(4, 1.0, 4, 20) == 1.0
    assert schedule.warmup_cosine(20, 1.0, 4, 20) == pytest.approx(0.0)


def test_trial_schedule_compresses_the_run():
    assert schedule.trial_schedule(2000, 10000, 30) == (6, 30)
    assert schedule.trial_schedule(100, 10000, 30) == (0, 30)
    assert schedule.trial_schedule(500, 100, 30) == (30, 30)


def test_data_is_deterministic_and_sharded():
    tokens = data.TokenChains(8, 16, 64, seed=3)
    x, y = tokens(5)
    assert x.shape == y.shape == (8, 16) and x.dtype == np.int32
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert np.mean((5 * x + 3) % 64 == y) > 0.8  # the learnable signal
    parts = [tokens(5, r, 4) for r in range(4)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), x)
    assert not np.array_equal(tokens(6)[0], x)
    feats, labels = data.TeacherClasses(32, 16, 10, seed=3)(0, 1, 2)
    assert feats.shape == (16, 16) and labels.shape == (16,) and labels.dtype == np.int32


# seconds of real MindSpore compiling and training: the slow tier keeps `make test` in its
# 5 minutes
@pytest.mark.slow
def test_grad_accumulation_equals_full_batch(ms):
    """K=4 micro-batches give the same update as one batch of 4× (fp32, SGD so the update is the gradient)."""
    from mindspore import nn

    from autotune.train import models
    from autotune.train.models import weights
    from autotune.train.parallel import tp_layers
    from autotune.train.step import train_step as step

    x, y = data.TokenChains(16, 8, 64, seed=1)(0)
    updates, losses = {}, {}
    for k in (1, 4):
        network = models.build_network(TRANSFORMER)
        weights.initialize(network, TRANSFORMER, models.SINGLE, seed=0)
        before = {n: p.asnumpy().copy() for n, p in network.parameters_and_names()}
        # a large rate makes the update dominate the weights' float32 rounding
        optimizer = nn.SGD(network.trainable_params(), learning_rate=100.0)
        accumulate, apply = step.build_steps(
            network,
            tp_layers.TokenCrossEntropy(),
            optimizer,
            accum_steps=k,
            scaling=False,
            loss_scale=1,
        )
        micro = len(x) // k
        batches = [
            (ms.Tensor(x[j * micro : (j + 1) * micro]), ms.Tensor(y[j * micro : (j + 1) * micro]))
            for j in range(k)
        ]
        if accumulate is None:
            out = apply(*batches[0])
        else:
            for batch in batches:
                accumulate(*batch)
            out = apply()
        updates[k] = {n: p.asnumpy() - before[n] for n, p in network.parameters_and_names()}
        losses[k] = float(out[0].asnumpy())
        if k > 1:
            assert all(
                not a.asnumpy().any() for a in apply.state.accum
            )  # drained for the next step
    assert losses[4] == pytest.approx(
        losses[1], rel=1e-6
    )  # the apply step reports the global-batch mean
    for name, full in updates[1].items():
        rel = np.linalg.norm(updates[4][name] - full) / np.linalg.norm(full)
        assert rel <= 1e-5, name


def test_entry_loads_a_file_and_checks_the_contract(ms, tmp_path):
    from autotune.train.models import entry

    config = {
        "seed": 0,
        "train": {"global_batch_size": 8},
        "model": {
            "entry": str(ROOT / "examples" / "user_model.py") + ":build",
            "hidden_size": None,
        },
    }
    network, loss_fn, dataset = entry.build(config)
    x, y = dataset(0, 1, 2)
    assert x.shape == (4, 16) and y.shape == (4,)
    assert math.isfinite(float(loss_fn(network(ms.Tensor(x)), ms.Tensor(y)).asnumpy()))
    bad = tmp_path / "bad.py"
    bad.write_text("def build(config):\n    return 1, 2\n")
    with pytest.raises(entry.EntryError, match="must return"):
        entry.build({"model": {"entry": f"{bad}:build"}})
    with pytest.raises(entry.EntryError, match="no callable 'nope'"):
        entry.entry_loader.load(f"{bad}:nope", tmp_path)
    with pytest.raises(entry.EntryError, match="importing no_such_module_here failed"):
        entry.entry_loader.load("no_such_module_here:build", tmp_path)
    with pytest.raises(entry.EntryError, match="model.family"):
        entry.build({"model": {"family": "cnn", "entry": None}})


@pytest.mark.parametrize("family", ["llama", "transformer", "qwen3"])
def test_fused_attention_calls_mindsporess_operator_with_the_cores_inputs(ms, family, monkeypatch):
    """flash_attention_score has no CPU kernel: what is checked here is the call the fused core
    makes — BNSD inputs as the plain core gets them (grouped-query key/value heads unrepeated),
    the causal mask of discarded positions, the 1/√d scale — standing in for the operator with
    the plain core's own result."""
    from autotune.train import models
    from autotune.train.models import SINGLE, fused

    cfg = {
        "family": family,
        "num_layers": 2,
        "hidden_size": 32,
        "num_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 48,
        "seq_length": 8,
        "vocab_size": 64,
    }
    if family == "transformer":
        cfg.pop("num_kv_heads")
    d = 16 if family == "qwen3" else 8  # qwen3: heads of head_dim, not hidden / heads
    if family == "qwen3":
        cfg = QWEN3
    network = models.build_network(cfg, SINGLE)
    plain = [cell.core for _, cell in network.cells_and_names() if hasattr(cell, "core")]
    assert fused.use_fused_attention(network, cfg["seq_length"]) == 2
    cores = [cell.core for _, cell in network.cells_and_names() if hasattr(cell, "core")]
    assert all(isinstance(core, fused.FusedCore) for core in cores)
    calls = []

    def operator(q, k, v, head_num, **kwargs):
        calls.append((q.shape, k.shape, head_num, kwargs))
        return plain[0](q, k, v)

    monkeypatch.setattr(ms.ops, "flash_attention_score", operator)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        kv = 4 if family == "transformer" else 2
        rng = np.random.default_rng(0)
        q = ms.Tensor(rng.standard_normal((2, 4, 8, d)).astype(np.float32))
        k, v = (ms.Tensor(rng.standard_normal((2, kv, 8, d)).astype(np.float32)) for _ in range(2))
        np.testing.assert_allclose(cores[0](q, k, v).asnumpy(), plain[0](q, k, v).asnumpy())
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    ((q_shape, k_shape, heads, kwargs),) = calls
    assert (q_shape, k_shape, heads) == ((2, 4, 8, d), (2, kv, 8, d), 4)
    assert kwargs["input_layout"] == "BNSD" and kwargs["sparse_mode"] == 0
    # causal as MindFormers calls it: every earlier token, no later one (the kernel skips the
    # blocks above the diagonal rather than computing and masking them)
    assert (kwargs["pre_tokens"], kwargs["next_tokens"]) == (2147483647, 0)
    assert kwargs["scalar_value"] == pytest.approx(1 / math.sqrt(d))
    mask = kwargs["attn_mask"].asnumpy()
    assert mask.dtype == np.uint8 and (mask == np.triu(np.ones((8, 8)), 1)).all()


# MindFormers' LayerSetting default patterns (mindformers/models/utils.py at 15218ea4)
MINDFORMERS_SELECT_PATTERNS = (r"feed_forward\.mul", r"feed_forward\.w1\.activation\.silu")


def _pattern_targets(layer, pattern: str) -> list:
    """What MindFormers' LayerSetting.set_pattern_recompute reaches in ``layer`` for
    ``pattern``: cells matched level by level by name, then the attribute (a primitive)."""
    *cells, attr = pattern.split(r"\.")
    nodes = [layer]
    for part in cells:
        nodes = [
            cell
            for node in nodes
            for name, cell in node.name_cells().items()
            if re.fullmatch(part, name)
        ]
    return [getattr(node, name) for node in nodes for name in dir(node) if re.fullmatch(attr, name)]


def test_llama_selective_recompute_is_mindformers_patterns_on_the_layers_they_mark(ms):
    from mindspore import ops

    from autotune.train import models
    from autotune.train.models import SINGLE

    network = models.build_network(LLAMA, SINGLE)
    for layer in network.model.layers.cells():  # the patterns name one primitive each here
        assert [len(_pattern_targets(layer, p)) for p in MINDFORMERS_SELECT_PATTERNS] == [1, 1]
    network.apply_recompute("selective")
    for layer in network.model.layers.cells():
        prims = [t for p in MINDFORMERS_SELECT_PATTERNS for t in _pattern_targets(layer, p)]
        assert all(t.attrs.get("recompute") is True for t in prims)
        assert isinstance(prims[0], ops.Mul)
        # unfused, the attention core too, as MindFormers' LLamaAttention; not the layer whole
        assert layer.attention.core._has_config_recompute and not layer._has_config_recompute
    # model.recompute_layers: only the layers MindFormers' per-stage list marks
    marked = models.build_network({**LLAMA, "recompute_layers": {"select_recompute": [1]}}, SINGLE)
    marked.apply_recompute("selective")
    flags = {
        int(n): _pattern_targets(layer, MINDFORMERS_SELECT_PATTERNS[0])[0].attrs.get("recompute")
        for n, layer in marked.model.layers.name_cells().items()
    }
    assert flags == {0: None, 1: True}


# seconds of real MindSpore compiling and training: the slow tier keeps `make test` in its
# 5 minutes
@pytest.mark.slow
def test_llama_selective_recompute_compiles_and_computes_the_same_gradients(ms):
    """The recomputed primitives run on this CPU in a compiled graph and change no gradient."""
    from mindspore import nn, ops

    from autotune.train import models
    from autotune.train.models import SINGLE

    class Loss(nn.Cell):
        def __init__(self, network):
            super().__init__()
            self.network = network

        def construct(self, ids):
            return ops.square(self.network(ids)).mean()

    nets = [models.build_network(LLAMA, SINGLE) for _ in range(2)]
    rng = np.random.default_rng(0)
    for p0, p1 in zip(nets[0].trainable_params(), nets[1].trainable_params()):
        value = ms.Tensor((0.1 * rng.standard_normal(p0.shape)).astype(np.float32))
        p0.set_data(value.copy())
        p1.set_data(value.copy())
    nets[1].apply_recompute("selective")
    ids = ms.Tensor(rng.integers(0, LLAMA["vocab_size"], (2, LLAMA["seq_length"])).astype(np.int32))
    grads = []
    for net in nets:
        step = nn.ForwardValueAndGrad(Loss(net), weights=net.trainable_params(), get_by_list=True)
        grads.append([g.asnumpy() for g in step(ids)[1]])
    for plain, recomputed in zip(*grads):
        np.testing.assert_allclose(recomputed, plain, rtol=1e-5, atol=1e-7)
