"""The parallel engine: every layout holds what `autotune.layout` promises, starts from the same
weights and trains to the same losses; the 1F1B schedule pairs every transfer."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune import layout
from autotune.execution.runner import free_port
from autotune.train import PROGRAM_PATH
from autotune.train.models.transformer import MASK_VALUE
from autotune.train.parallel.pipeline import schedule
from tests.conftest import BIN, make_config, run  # noqa: E402

TRANSFORMER = {
    "family": "transformer",
    "num_layers": 4,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 64,
    "seq_length": 8,
    "vocab_size": 64,
}
MLP = {"family": "mlp", "num_layers": 2, "hidden_size": 16, "ffn_hidden_size": 48, "vocab_size": 10}
# grouped-query attention: 4 query heads share 2 key/value heads
LLAMA = {
    "family": "llama",
    "num_layers": 4,
    "hidden_size": 32,
    "num_heads": 4,
    "num_kv_heads": 2,
    "ffn_hidden_size": 48,
    "seq_length": 8,
    "vocab_size": 64,
}
# Qwen3-shaped: 4 heads of 16 over a hidden size of 32 (not 32 / 4 = 8 wide), q/k norms
QWEN3 = LLAMA | {"head_dim": 16, "qk_norm": True}
MIRROR = {"SF": "RF", "RB": "SB"}


@pytest.mark.parametrize("stages", range(2, 9))
def test_schedule_pairs_every_transfer_and_bounds_what_is_in_flight(stages):
    for micro in range(stages, 4 * stages + 1):
        orders = [schedule(s, stages, micro) for s in range(stages)]
        for s, order in enumerate(orders):
            assert sum(op == ("F",) for op in order) == sum(op == ("B",) for op in order) == micro
            in_flight = peak = 0
            for op in order:
                in_flight += (op == ("F",)) - (op == ("B",))
                peak = max(peak, in_flight)
            assert peak == min(stages - s, micro)  # 1F1B: stage s holds at most p − s micro-batches
        for s in range(stages - 1):
            down = [kinds for side, *kinds in orders[s] if side == "next" for kinds in kinds]
            up = [kinds for side, *kinds in orders[s + 1] if side == "prev" for kinds in kinds]
            # the k-th transfer on a link is the same transfer seen from both of its ranks
            assert [sorted(MIRROR[k] for k in a) for a in down] == [sorted(b) for b in up]


@pytest.fixture(scope="module")
def ms():
    import mindspore

    from autotune.train.runtime import session

    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    session.numpy2_workaround(mindspore)
    return mindspore


@pytest.mark.parametrize(
    "cfg, layouts",
    [
        (TRANSFORMER, [(1, 2, 2), (2, 2, 1), (1, 4, 4)]),
        (MLP, [(1, 2, 2), (2, 1, 2)]),
        (LLAMA, [(1, 2, 2), (2, 2, 1), (1, 2, 4)]),
    ],
    ids=["transformer", "mlp", "llama"],
)
def test_every_rank_holds_its_slices_of_the_same_initial_weights(ms, cfg, layouts):
    from autotune.train import models
    from autotune.train.models import weights
    from autotune.train.parallel.groups import Placement

    whole = models.build_network(cfg)
    weights.initialize(whole, cfg, models.SINGLE, seed=3)
    full = {p.name: p.asnumpy() for p in whole.get_parameters()}
    for dp, tp, pp in layouts:
        plan, reasons = layout.builtin_layout(cfg, tp, pp)
        assert not reasons
        seen = set()
        for rank in range(dp * tp * pp):
            p = Placement.of(rank, dp, tp, pp)
            network = models.build_network(cfg, p)
            weights.initialize(network, cfg, p, seed=3)
            held = {q.name: q.asnumpy() for q in network.get_parameters()}
            assert set(held) == {n for n, lay in plan.items() if lay.stage == p.stage}
            for name, value in held.items():
                expected = full[name][plan[name].local_slice(p.tp_index, tp)]
                np.testing.assert_array_equal(
                    value, expected, err_msg=f"{dp, tp, pp} rank {rank} {name}"
                )
            seen |= set(held)
        assert seen == set(full)


def test_fused_qkv_is_head_major(ms):
    """The attention reads feature (head, [q, k, v], d) of the fused QKV output, so tp rank t's
    contiguous block of rows is whole heads with their own Q, K and V (checked against numpy)."""
    from autotune.train import models
    from autotune.train.models import weights

    cfg = dict(TRANSFORMER, num_layers=1)
    network = models.build_network(cfg)
    weights.initialize(network, cfg, models.SINGLE, seed=5)
    attn = network.blocks[0].attn
    b, s, h, heads = 2, cfg["seq_length"], cfg["hidden_size"], cfg["num_heads"]
    x = np.random.default_rng(0).standard_normal((b, s, h)).astype(np.float32)
    w, bias = attn.qkv.weight.asnumpy(), attn.qkv.bias.asnumpy()
    qkv = (x @ w.T + bias).reshape(b, s, heads, 3, h // heads).transpose(3, 0, 2, 1, 4)
    scores = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) / np.sqrt(h // heads)
    scores = scores + np.triu(np.full((s, s), MASK_VALUE), k=1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    ctx = (probs / probs.sum(-1, keepdims=True)) @ qkv[2]
    expected = (
        ctx.transpose(0, 2, 1, 3).reshape(b, s, h) @ attn.proj.weight.asnumpy().T
        + attn.proj.bias.asnumpy()
    )
    np.testing.assert_allclose(attn(ms.Tensor(x)).asnumpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", [LLAMA, QWEN3], ids=["llama", "qwen3"])
def test_llama_attention_is_grouped_query_with_rotary_embeddings(ms, cfg):
    """One llama attention against numpy: Hugging Face's LLaMA — rotate-half rotary embeddings
    (θ 10000) on q and k, query head j reading key/value head j // (heads / kv_heads); Qwen3's
    (Hugging Face's Qwen3Attention): heads head_dim wide, and an RMSNorm of one head_dim weight
    on every query and key head before the rotary embedding."""
    from autotune.train import models
    from autotune.train.models import weights
    from autotune.train.models.llama import RMS_EPS

    cfg = dict(cfg, num_layers=1)
    network = models.build_network(cfg)
    weights.initialize(network, cfg, models.SINGLE, seed=5)
    attn = network.model.layers[0].attention
    b, s, h, heads, kv = (
        2,
        cfg["seq_length"],
        cfg["hidden_size"],
        cfg["num_heads"],
        cfg["num_kv_heads"],
    )
    d = cfg.get("head_dim") or h // heads
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    if cfg.get("qk_norm"):  # weights other than the initial ones, so that they act
        for norm in (attn.q_layernorm, attn.k_layernorm):
            norm.weight.set_data(ms.Tensor(rng.uniform(0.5, 1.5, d).astype(np.float32)))

    def split(y, n, norm=None):
        y = y.reshape(b, s, n, d).transpose(0, 2, 1, 3)
        if norm is None or not cfg.get("qk_norm"):
            return y
        return y / np.sqrt((y * y).mean(-1, keepdims=True) + RMS_EPS) * norm.weight.asnumpy()

    angles = np.outer(np.arange(s), 10000.0 ** -(np.arange(0, d, 2) / d))
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))

    def rope(y):
        return y * cos + np.concatenate([-y[..., d // 2 :], y[..., : d // 2]], -1) * sin

    q_norm, k_norm = (getattr(attn, n, None) for n in ("q_layernorm", "k_layernorm"))
    q = rope(split(x @ attn.wq.weight.asnumpy().T, heads, q_norm))
    k = np.repeat(rope(split(x @ attn.wk.weight.asnumpy().T, kv, k_norm)), heads // kv, axis=1)
    v = np.repeat(split(x @ attn.wv.weight.asnumpy().T, kv), heads // kv, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + np.triu(np.full((s, s), -1e4), k=1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    ctx = (probs / probs.sum(-1, keepdims=True)) @ v
    expected = ctx.transpose(0, 2, 1, 3).reshape(b, s, heads * d) @ attn.wo.weight.asnumpy().T
    np.testing.assert_allclose(attn(ms.Tensor(x)).asnumpy(), expected, rtol=1e-4, atol=1e-5)


def _launch(out, knobs, steps=4, model=None, dtype="float32", base=TRANSFORMER, trial=None):
    workers = knobs["dp"] * knobs["tp"] * knobs["pp"]
    config = make_config(
        out,
        model={**base, "dtype": dtype, **(model or {})},
        knobs={"warmup_steps": 0, **knobs},
        steps=steps,
        batch=16,
        trial=trial,
    )
    cfg = json.loads(config.read_text())
    cfg["trial"]["measure_after"] = 1
    config.write_text(json.dumps(cfg))
    if workers == 1:
        cmd = [sys.executable, "-m", "autotune.train", config]
    else:
        cmd = [
            BIN / "msrun",
            f"--worker_num={workers}",
            f"--local_worker_num={workers}",
            f"--master_port={free_port()}",
            f"--log_dir={out / 'logs'}",
            "--join=True",
            "--cluster_time_out=120",
            PROGRAM_PATH,
            config,
        ]
    code, _, err = run(cmd, timeout=400)
    logs = "".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("worker_*.log"))[:2])
    assert code == 0, (err + logs)[-4000:]
    losses = [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]
    ranks = [json.loads((out / f"metrics.rank{r}.json").read_text()) for r in range(workers)]
    return losses, ranks


LAYOUTS = {
    "dp2": dict(dp=2, tp=1, pp=1, grad_accum=2),
    "tp2": dict(dp=1, tp=2, pp=1, grad_accum=2),
    "pp2": dict(dp=1, tp=1, pp=2, micro_batches=2),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(1, 1, 1) with 2 accumulated micro-batches: the same micro-batches every layout sees."""
    return _launch(tmp_path_factory.mktemp("ref") / "r", dict(dp=1, tp=1, pp=1, grad_accum=2))[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_layouts_train_to_the_same_losses(tmp_path, reference, name):
    losses, ranks = _launch(tmp_path / name, LAYOUTS[name])
    assert len(losses) == len(reference) == 4 and reference[-1] < reference[0]
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    if name == "dp2":  # replicas end bit-identical; tensor-parallel ranks hold different slices
        assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    else:
        assert ranks[0]["weights_sha256"] != ranks[1]["weights_sha256"]
    assert [(r["stage"], r["tp_index"]) for r in ranks] == (
        [(0, 0), (1, 0)]
        if name == "pp2"
        else [(0, 0), (0, 1)]
        if name == "tp2"
        else [(0, 0), (0, 0)]
    )


@pytest.fixture(scope="module")
def llama_reference(tmp_path_factory):
    return _launch(
        tmp_path_factory.mktemp("llama") / "r", dict(dp=1, tp=1, pp=1, grad_accum=2), base=LLAMA
    )[0]


# tp2·pp2 on four workers, and there with MindFormers' selective recompute (the SwiGLU's SiLU and
# product and the attention core, recomputed in the stages' backward graphs): the same losses
LLAMA_LAYOUTS = {
    **LAYOUTS,
    "tp2pp2": dict(dp=1, tp=2, pp=2, micro_batches=2),
    "tp2pp2-selective": dict(dp=1, tp=2, pp=2, micro_batches=2, recompute="selective"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA_LAYOUTS)
def test_llama_layouts_train_to_the_same_losses(tmp_path, llama_reference, name):
    """The llama family (grouped-query: tp2 splits its 2 key/value heads) under every layout."""
    knobs = LLAMA_LAYOUTS[name]
    losses, _ = _launch(tmp_path / name, knobs, base=LLAMA)
    assert len(losses) == 4 and llama_reference[-1] < llama_reference[0]
    np.testing.assert_allclose(losses, llama_reference, rtol=1e-4)


@pytest.fixture(scope="module")
def qwen3_reference(tmp_path_factory):
    return _launch(
        tmp_path_factory.mktemp("qwen3") / "r", dict(dp=1, tp=1, pp=1, grad_accum=2), base=QWEN3
    )[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_qwen3_layouts_train_to_the_same_losses(tmp_path, qwen3_reference, name):
    """The llama family with Qwen3's options (heads head_dim wide, q/k norms whole on every tp
    rank, their gradients summed as the layer's other norms') under dp, tp and pp."""
    losses, _ = _launch(tmp_path / name, LAYOUTS[name], base=QWEN3)
    assert len(losses) == 4 and qwen3_reference[-1] < qwen3_reference[0]
    np.testing.assert_allclose(losses, qwen3_reference, rtol=1e-4)


@pytest.mark.slow
def test_tensor_and_pipeline_together_on_four_workers(tmp_path, reference):
    losses, _ = _launch(tmp_path / "tp2pp2", dict(dp=1, tp=2, pp=2, micro_batches=2))
    np.testing.assert_allclose(losses, reference, rtol=1e-4)


OVERFLOWING = dict(steps=6, dtype="float16")  # from a loss scale of 2^20


@pytest.fixture(scope="module")
def overflow_reference(tmp_path_factory):
    """One process's losses and steps.jsonl records, from a loss scale of 2^20."""
    out = tmp_path_factory.mktemp("overflow") / "one"
    losses, _ = _launch(out, dict(dp=1, tp=1, pp=1, grad_accum=2, loss_scale=2**20), **OVERFLOWING)
    return losses, [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [
        dict(dp=1, tp=2, pp=1, grad_accum=2, recompute="full"),
        dict(dp=1, tp=1, pp=2, micro_batches=2, recompute="selective"),
        dict(dp=1, tp=1, pp=2, micro_batches=2, jit_level="pynative"),
    ],
    ids=["tp2-full-recompute", "pp2-selective-recompute", "pp2-pynative"],
)
def test_float16_overflows_are_agreed_and_knobs_act_under_every_layout(
    tmp_path, overflow_reference, knobs
):
    """float16 from a loss scale of 2^20: every rank skips the same steps (or the run would hang
    or diverge between ranks), with the same scale and losses as one process."""
    single, one = overflow_reference
    split, _ = _launch(tmp_path / "split", dict(loss_scale=2**20, **knobs), **OVERFLOWING)
    many = [
        json.loads(line) for line in (tmp_path / "split" / "steps.jsonl").read_text().splitlines()
    ]
    assert [s["overflow"] for s in many] == [s["overflow"] for s in one] and one[0]["overflow"]
    assert [s["loss_scale"] for s in many] == [s["loss_scale"] for s in one]
    np.testing.assert_allclose(split, single, rtol=2e-3)  # float16 sums in another order


UNDERFLOW = dict(
    steps=3, dtype="float16", trial={"underflow_probe": "always"}
)  # the probe and the bound


def _underflow(out) -> tuple:
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["underflow_share"], metrics["underflow_bound"]


@pytest.fixture(scope="module")
def underflow_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("u") / "one"
    _launch(out, dict(dp=1, tp=1, pp=1, grad_accum=2, loss_scale=1), **UNDERFLOW)
    return _underflow(out)


# micro-batches of 8 samples, as in the reference (dp2 with accumulation would halve them)
UNDERFLOW_LAYOUTS = {"dp2": dict(dp=2, tp=1, pp=1), "pp2": LAYOUTS["pp2"], "tp2": LAYOUTS["tp2"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", UNDERFLOW_LAYOUTS)
def test_underflow_share_is_counted_once_under_every_layout(tmp_path, underflow_reference, name):
    """dp replicas count their own micro-batches, pipeline stages run the probe through the
    1F1B schedule: the same float16 backward as one process, the same share — and the same
    bound, counted in the training step. Tensor parallelism sums partial products in float16 on
    each rank before its all-reduce, which rounds and flushes differently: the same order of
    magnitude, replicated parameters counted once."""
    _launch(tmp_path / name, dict(UNDERFLOW_LAYOUTS[name], loss_scale=1), **UNDERFLOW)
    share, bound = _underflow(tmp_path / name)
    assert min(underflow_reference) > 0
    for mine, reference in ((share, underflow_reference[0]), (bound, underflow_reference[1])):
        if name == "tp2":
            assert reference / 2 < mine < reference * 2
        else:
            assert mine == pytest.approx(reference, rel=1e-9)


# -- the parallel optimizer ------------------------------------------------------------------------
# Large enough that the optimizer's state matters against the process's own memory: 4 layers of
# h 1024, ffn 4096 (50 M float32 parameters: 200 MB; Adam's moments 400 MB).
ZERO_MODEL = {
    "family": "transformer",
    "num_layers": 4,
    "hidden_size": 1024,
    "num_heads": 4,
    "ffn_hidden_size": 4096,
    "seq_length": 8,
    "vocab_size": 64,
}


def _predicted_saving_mb(model: dict, knobs: dict) -> float:
    """What the cost model says the parallel optimizer saves per device, in MiB."""
    from autotune.costmodel import estimate
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import parse_spec

    spec = parse_spec(
        {
            "model": {**model, "dtype": "float32"},
            "train": {"global_batch_size": 16},
            "cluster": {"backend": "cpu", "devices": 2},
        },
        Path("z.yaml"),
    )
    base = dict(
        micro_batches=1,
        fusion_mb=64,
        loss_scale=1024,
        warmup_steps=0,
        jit_level="O1",
        recompute="none",
        **knobs,
    )
    off, on = (
        estimate(spec, Candidate(**base, parallel_optimizer=flag)).memory_gb_per_device
        for flag in (False, True)
    )
    return (off - on) * 1024


@pytest.mark.slow
def test_parallel_optimizer_trains_as_unsharded_in_less_memory(tmp_path):
    knobs = dict(dp=2, tp=1, pp=1, grad_accum=2)
    off, off_ranks = _launch(tmp_path / "off", knobs, base=ZERO_MODEL)
    on, on_ranks = _launch(tmp_path / "on", dict(knobs, parallel_optimizer=True), base=ZERO_MODEL)
    np.testing.assert_allclose(on, off, rtol=1e-5)
    # the gathered parameters are the unsharded run's, bit for bit, on both replicas
    assert {r["weights_sha256"] for r in on_ranks} == {off_ranks[0]["weights_sha256"]}
    predicted = _predicted_saving_mb(ZERO_MODEL, dict(dp=2, tp=1, pp=1, grad_accum=2))
    saved = [a["peak_memory_mb"] - b["peak_memory_mb"] for a, b in zip(off_ranks, on_ranks)]
    # The saving is a difference of two ≈1.9 GB peak RSS, ±10 MB run to run: measured 46.5–80 MB
    # per rank over 4 runs of 2 ranks against the 96.25 predicted. The ranks' mean (52–75 there)
    # against half the prediction; a single rank's min failed that bar once (46.5 MB).
    assert predicted > 90 and sum(saved) / len(saved) >= predicted / 2, (saved, predicted)


# h 128, ffn 512 and 160 positions: the qkv, fc_in and fc_out matrices (split by tp) and the
# position table (80 KB, replicated) are over the 64 KB threshold; everything else stays whole.
SHARDED_LAYOUT_MODEL = {
    "family": "transformer",
    "num_layers": 2,
    "hidden_size": 128,
    "num_heads": 4,
    "ffn_hidden_size": 512,
    "seq_length": 160,
    "vocab_size": 64,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [dict(dp=2, tp=2, pp=1, grad_accum=2), dict(dp=2, tp=1, pp=2, micro_batches=2)],
    ids=["dp2-tp2", "dp2-pp2"],
)
def test_parallel_optimizer_equals_unsharded_with_tensor_and_pipeline_parallelism(tmp_path, knobs):
    """tp-split matrices shard over their dp group, the replicated position table over all dp·tp
    ranks of its stage; under pipeline stages the update is the apply cell's."""
    off, _ = _launch(tmp_path / "off", knobs, steps=3, base=SHARDED_LAYOUT_MODEL)
    on, _ = _launch(
        tmp_path / "on", dict(knobs, parallel_optimizer=True), steps=3, base=SHARDED_LAYOUT_MODEL
    )
    assert len(set(off)) == 3  # the weights moved every step
    np.testing.assert_allclose(on, off, rtol=1e-5)


@pytest.mark.slow
def test_an_uneven_pipeline_trains_to_the_losses_of_one_process(tmp_path):
    """3 layers on 2 stages (the first stage one more: `autotune.families.layers.stage_layers`),
    as DeepSeek-V3's 61 layers are split on any pipeline: the same losses as one process."""
    model = LLAMA | {"num_layers": 3}
    one = dict(dp=1, tp=1, pp=1, grad_accum=2)
    reference = _launch(tmp_path / "one", one, base=model)[0]
    losses, ranks = _launch(tmp_path / "pp2", dict(dp=1, tp=1, pp=2, micro_batches=2), base=model)
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    assert [r["stage"] for r in ranks] == [0, 1]
