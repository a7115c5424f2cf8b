"""The underflow bound (`autotune.train.step.probe`): the training step's own count of float16 zeros,
less the token rows no id selects, bounds the probe's share; the probe runs only above
SKIP_BELOW. In process: the rule, and the step's counts against the probe's float16 masks on the
same weights. Under msrun (slow): u ≤ z at every loss scale on dp2, tp2 and pp2."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune.execution.runner import free_port
from autotune.train.models import data
from tests.conftest import BIN, make_config, run  # noqa: E402

TRANSFORMER = {
    "family": "transformer",
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 64,
    "seq_length": 8,
    "vocab_size": 64,
}


@pytest.fixture(scope="module")
def ms():
    import mindspore

    from autotune.train.runtime import session

    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    session.numpy2_workaround(mindspore)
    return mindspore


def test_the_rule_runs_the_probe_only_above_the_threshold(ms):
    from autotune.train.step.probe import SKIP_BELOW, measure

    ran = []

    def probe():
        ran.append(True)
        return 30, 1000

    def summed(values):  # one rank
        return values

    under = int(SKIP_BELOW * 10_000)
    assert measure((under, 10_000), probe, summed) == {
        "underflow_share": SKIP_BELOW,
        "underflow_bound": SKIP_BELOW,
        "underflow_probed": False,
        "underflow_note": None,
    }
    assert not ran
    assert measure((under + 1, 10_000), probe, summed) == {
        "underflow_share": 0.03,
        "underflow_bound": (under + 1) / 10_000,
        "underflow_probed": True,
        "underflow_note": None,
    }
    assert measure((0, 10_000), probe, summed, always=True)["underflow_share"] == 0.03
    # no bound (the last step overflowed, or ran at another scale): the probe decides
    assert measure(None, probe, summed) == {
        "underflow_share": 0.03,
        "underflow_bound": 1.0,
        "underflow_probed": True,
        "underflow_note": None,
    }
    assert len(ran) == 3


def test_flash_attention_keeps_the_bound_and_the_probe_out_of_memory_leaves_the_share_unmeasured(
    ms,
):
    """A fused flash-attention candidate's float32 twin would hold the s² scores the candidate
    never holds: the probe does not run, the bound stands. A probe out of memory on any rank
    leaves the share unmeasured with the reason, on every rank; anything else it raises is still
    the trial's error."""
    from autotune.train.step.probe import measure

    ran, told = [], []

    def probe():
        ran.append(True)
        return 30, 1000

    def summed(values):
        return values

    fused = measure((50, 1000), probe, summed, fused_attention=True)
    assert fused == {
        "underflow_share": 0.05,
        "underflow_bound": 0.05,
        "underflow_probed": False,
        "underflow_note": "flash attention: the float32 probe cannot run the fused "
        "kernel, so the bound stands for the share",
    }
    assert not ran

    def exhausted():
        raise RuntimeError("Out of memory: device memory could not be allocated")

    def oom(exc):
        return "out of memory" in str(exc).lower()

    out = measure((50, 1000), exhausted, summed, out_of_memory=oom, before_probe=told.append)
    assert out == {
        "underflow_share": None,
        "underflow_bound": 0.05,
        "underflow_probed": False,
        "underflow_note": "out of memory in the underflow probe: RuntimeError: Out of "
        "memory: device memory could not be allocated",
    }
    assert told == [0.05]  # the training's metrics were written before it ran

    def other_rank_failed(values):  # a peer ran out of memory: its flag arrives in the sum
        return values[:2] + [1.0] if len(values) == 3 else values

    assert measure((50, 1000), probe, other_rank_failed)["underflow_note"] == (
        "out of memory in the underflow probe on another rank"
    )

    def broken():
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        measure((50, 1000), broken, summed, out_of_memory=oom)


# seconds of real MindSpore compiling and training: the slow tier keeps `make test` in its
# 5 minutes
@pytest.mark.slow
def test_the_step_counts_the_zeros_of_its_float16_gradients(ms):
    """Two accumulated micro-batches at a scale that flushes many gradients: the step's counts
    are the float16 zeros the probe's own mask pass finds on the same weights (learning rate 0),
    summed over the micro-batches and drained between steps; the token rows no id selects are
    among them, and the bound subtracts exactly those."""
    from mindspore.common.parameter import ParameterTuple

    from autotune.train import models
    from autotune.train.models import weights
    from autotune.train.parallel import tp_layers
    from autotune.train.step import train_step as step
    from autotune.train.step.engine import make_optimizer, optimizer_order
    from autotune.train.step.probe import UnderflowBound, ZeroMasks

    model = {**TRANSFORMER, "num_layers": 1}  # one block: the fast tier pays three compiles
    network = models.build_network(model)
    weights.initialize(network, model, models.SINGLE, seed=0)
    step.set_compute_dtype(network, ms.float16)
    params = ParameterTuple(optimizer_order(network.trainable_params()))
    loss_fn, scale = tp_layers.TokenCrossEntropy(), 2.0**-6
    accumulate, apply = step.build_steps(
        network,
        loss_fn,
        make_optimizer(list(params), 0.0),
        accum_steps=2,
        scaling=True,
        loss_scale=scale,
        weights=params,
    )
    masks = ZeroMasks(network, loss_fn, params, first=True, last=True, dtype=ms.float16)
    masks.set_train()
    bound = UnderflowBound(network, params, {p.name for p in params}, micro=2)
    table = [i for i, p in enumerate(params) if p.name == "embed.tok.embedding_table"][0]
    for batch in range(2):
        x, y = data.TokenChains(16, 8, 64, seed=1)(batch)
        halves = [
            (ms.Tensor(x[j * 8 : (j + 1) * 8]), ms.Tensor(y[j * 8 : (j + 1) * 8])) for j in range(2)
        ]
        zero = [
            [m.asnumpy() for m in masks(a, b, ms.Tensor(scale, ms.float32))[1]] for a, b in halves
        ]
        for half in halves:
            accumulate(*half)
        loss, overflow, _, counts = apply()
        assert not overflow.asnumpy()
        expected = [sum(int(zero[j][i].sum()) for j in range(2)) for i in range(len(params))]
        assert counts.asnumpy().tolist() == expected
        assert sum(expected) > 1000  # a scale that flushes: the counts are not all zero
        structural = 0
        for j in range(2):
            absent = sorted(set(range(64)) - set(x[j * 8 : (j + 1) * 8].ravel().tolist()))
            assert absent and zero[j][table][absent].all()  # rows no id selects are zero
            structural += len(absent) * 32
        assert bound(counts.asnumpy(), x) == (sum(expected) - structural, bound.elements)
        assert bound.elements == 2 * sum(int(np.prod(p.shape)) for p in params)


def test_the_token_tables_are_found_in_every_built_in_family(ms):
    """The bound subtracts the rows of what `token_tables` finds: the transformer's and llama's
    vocabulary tables (whole model names), nothing in the mlp (its inputs are features)."""
    from autotune.train import models
    from autotune.train.step.probe import token_tables

    llama = {
        "family": "llama",
        "num_layers": 1,
        "hidden_size": 32,
        "num_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 48,
        "seq_length": 8,
        "vocab_size": 64,
    }
    mlp = {
        "family": "mlp",
        "num_layers": 1,
        "hidden_size": 16,
        "ffn_hidden_size": 48,
        "vocab_size": 10,
    }
    found = {
        cfg["family"]: [
            (table.name, tuple(table.shape), start)
            for table, start in token_tables(models.build_network(cfg))
        ]
        for cfg in (TRANSFORMER, llama, mlp)
    }
    assert found == {
        "transformer": [("embed.tok.embedding_table", (64, 32), 0)],
        "llama": [("model.tok_embeddings.embedding_weight", (64, 32), 0)],
        "mlp": [],
    }


# -- the bound against the probe under every layout ------------------------------------------------
# tests/train/underflow_scales.py: the probe after a step sees the very weights the step's bound counted
SCALES = [2.0**-12, 2.0**-8, 2.0**-4, 1.0, 2.0**4, 2.0**10]
LAYOUTS = {
    "dp2": dict(dp=2, tp=1, pp=1),
    "tp2": dict(dp=1, tp=2, pp=1, grad_accum=2),
    "pp2": dict(dp=1, tp=1, pp=2, micro_batches=2),
}
MODEL = {**TRANSFORMER, "num_layers": 4}


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_the_bound_bounds_the_probe_at_every_scale_and_layout(tmp_path, name):
    from autotune.train.step.probe import SKIP_BELOW

    knobs = LAYOUTS[name]
    workers = knobs["dp"] * knobs["tp"] * knobs["pp"]
    config = make_config(tmp_path, model=MODEL, knobs={"warmup_steps": 0, **knobs}, batch=16)
    program = Path(__file__).with_name("underflow_scales.py")
    cmd = [sys.executable, program, config, json.dumps(SCALES)]
    if workers > 1:
        cmd = [
            BIN / "msrun",
            f"--worker_num={workers}",
            f"--local_worker_num={workers}",
            f"--master_port={free_port()}",
            f"--log_dir={tmp_path / 'logs'}",
            "--join=True",
            "--cluster_time_out=120",
            program,
            config,
            json.dumps(SCALES),
        ]
    code, _, err = run(cmd, timeout=400)
    logs = "".join(p.read_text()[-1500:] for p in sorted((tmp_path / "logs").glob("worker_*.log")))
    assert code == 0, (err + logs)[-4000:]
    rows = json.loads((tmp_path / "scales.json").read_text())
    assert [r["scale"] for r in rows] == SCALES and not any(r["overflow"] for r in rows)
    for r in rows:
        assert r["u"] <= r["z"], r
    # the low scales flush real gradients, and the bound is close to the share there ...
    assert rows[0]["u"] > 0.05 and rows[1]["u"] > SKIP_BELOW
    assert all(r["z"] - r["u"] <= 0.1 * r["u"] for r in rows[:2])
    # ... and at a healthy scale the token rows no id selects are not counted: the probe is skipped
    assert rows[-1]["z"] <= SKIP_BELOW


# -- a table the bound must not take for a token table ---------------------------------------------
def _entry_network(ms, kind: str):
    """A one-rank entry-style network built from autotune's own `VocabParallelEmbedding`, as a
    user's model may be: ``tied`` — the LM head is the token table (logits = h · tableᵀ), so every
    row gets a gradient through the head; ``positions`` — a second table looked up by positions,
    whose rows every position selects (ids 8 and up select none of them)."""
    from mindspore import nn, ops

    from autotune.train.parallel import tp_layers

    class Tiny(nn.Cell):
        def __init__(self):
            super().__init__()
            self.tok = tp_layers.VocabParallelEmbedding(64, 32)
            if kind == "positions":  # a second table of 8 rows, looked up by the positions 0-7
                self.pos = tp_layers.VocabParallelEmbedding(8, 32)
                self.head = tp_layers.ColumnParallelDense(32, 64)
                self.positions = ms.Tensor(np.arange(8, dtype=np.int32)[None, :])
            self.mix = tp_layers.ColumnParallelDense(32, 32)

        def construct(self, ids):
            h = self.tok(ids)
            if kind == "positions":
                return self.head(ops.tanh(self.mix(h + self.pos(self.positions))))
            h = ops.tanh(self.mix(h))
            return ops.matmul(h, ops.cast(self.tok.embedding_table, h.dtype).T)  # tied

    network = Tiny()
    rng = np.random.default_rng(0)
    for p in network.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0, 0.1, p.shape).astype(np.float32)))
    return network, Tiny


SCALE = 2.0**10  # a healthy scale: taken for structural, the rows' gradients made z < 0


@pytest.mark.parametrize("kind", ["tied", "positions"])
def test_a_table_tied_to_the_head_or_looked_up_by_positions_is_no_token_table(ms, kind):
    """u ≤ z needs the bound to subtract only rows that are zero in float32 too: those of a
    table read only by looking up the input ids. A VocabParallelEmbedding tied to the head, or
    looked up by positions, has non-zero rows no id selects; taken for a token table it made z
    negative (the probe skipped where it should run)."""
    from mindspore.common.parameter import ParameterTuple

    from autotune.train import models
    from autotune.train.parallel import tp_layers
    from autotune.train.step import train_step as step
    from autotune.train.step.engine import make_optimizer, optimizer_order
    from autotune.train.step.probe import UnderflowBound, UnderflowProbe

    network, build = _entry_network(ms, kind)
    step.set_compute_dtype(network, ms.float16)
    params = ParameterTuple(optimizer_order(network.trainable_params()))
    owned = {p.name for p in params}
    loss_fn = tp_layers.TokenCrossEntropy()
    _, apply = step.build_steps(
        network,
        loss_fn,
        make_optimizer(list(params), 0.0),
        accum_steps=1,
        scaling=True,
        loss_scale=SCALE,
        weights=params,
    )
    x, y = data.TokenChains(8, 8, 64, seed=3)(0)
    x = 8 + x % 24  # ids 8-31: rows 0-7 and 32-63 of a table of 64 are selected by no id
    *_, counts = apply(ms.Tensor(x), ms.Tensor(y))
    zeros, elements = UnderflowBound(network, params, owned, micro=1)(counts.asnumpy(), x)
    twin = build()
    probe = UnderflowProbe(
        network, twin, loss_fn, models.SINGLE, micro=1, owned=owned, boundary=None
    )
    kept, probed = probe(x, y, SCALE)
    assert probed == elements
    assert 0 <= kept <= zeros, (kept, zeros)  # u ≤ z


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_the_probes_float32_twin_recomputes_as_the_candidate_does(ms, mode):
    """The probe runs after training under the same memory cap: its float32 twin recomputes what
    the candidate recomputes, or a candidate that trained within its memory could end out of
    memory in the probe."""
    from autotune.spec.knobs import SCALE_WINDOW
    from autotune.train import models
    from autotune.train.step.engine import build_engine

    cfg = {
        "model": {**TRANSFORMER, "dtype": "float16"},
        "seed": 0,
        "train": {"global_batch_size": 8, "learning_rate": 0.01, "total_steps": 100},
        "trial": {"steps": 4, "measure_after": 1},
        "knobs": {
            "dp": 1,
            "tp": 1,
            "pp": 1,
            "micro_batches": 1,
            "fusion_mb": 64,
            "grad_accum": 1,
            "loss_scale": 1024,
            "warmup_steps": 0,
            "jit_level": "O1",
            "recompute": mode,
        },
    }
    probe = build_engine(cfg, models.SINGLE, SCALE_WINDOW).make_probe()

    def recomputed(cell):
        return sorted(name for name, c in cell.cells_and_names() if c._has_config_recompute)

    assert recomputed(probe.half) and recomputed(probe.full) == recomputed(probe.half)
