# measured at 63340ab
# A MindSpore fact check (docs/mindspore-cpu.md): re-run it after a MindSpore upgrade.
"""MindSpore on this CPU: the facts docs/mindspore-cpu.md records, measured (prints a table).

Run by hand; about 4 minutes on 2 cores:

    .venv/bin/python benchmarks/records/cpu_facts.py [--only NAME ...] [--steps 4] [--rounds 2]
                                             [--recompute-rows 4096]

Every single-process fact runs in fresh processes (``cpu_facts.py probe KIND JSON``, argument
lists, no shell), so each has its own execution mode, compile-cache setting and peak RSS (VmHWM
of ``/proc/self/status``; ``ms.runtime.max_memory_allocated()`` is 0 on CPU). The two-process
facts run in one ``msrun --worker_num=2 --local_worker_num=2 --bind_core=True`` launch of this
file in worker mode (positional arguments: msrun's parser would take ``--worker…`` for its own
flags) with IR dumps on (``MS_DEV_SAVE_GRAPHS=1``, ``MS_DEV_SAVE_GRAPHS_PATH``, and
``MS_DEV_DUMP_IR_PASSES=graph_build`` to keep only the kernel graph), in a temporary folder.

Timing on a shared 2-core machine is noisy, so ratios are taken where the noise cancels best:
fp16 and PyNative as the best of ``--rounds`` fresh processes of each (a process started in one
mode runs the other slower, so each starts in its own, as the trainer does), jit levels by
stepping the three graphs in turn in one process, and a MatMul by its fastest call.

The model, unless a row says otherwise, is the project's ``mlp`` family rebuilt here (so the
numbers do not move when the trainer changes): an input Dense h→h, residual blocks
``x + Dense(ffn→h)(GeLU(Dense(h→ffn)(LayerNorm(x))))``, a head Dense h→classes, float32 cross-
entropy, ``AdamWeightDecay``, one ``TrainOneStepCell`` graph; float16 is ``to_float(float16)``
with LayerNorm kept float32, as the trainer's ``set_compute_dtype``. A row is one sample.

Names for ``--only``: fp16, pynative, jit, recompute, rss, cache, bf16, numpy2, collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# SMALL is tiny-GPT-sized (host overhead dominates); MEDIUM is compute-bound.
SMALL = {"rows": 256, "layers": 2, "hidden": 64, "ffn": 256, "classes": 256}
MEDIUM = {"rows": 1024, "layers": 8, "hidden": 256, "ffn": 1024, "classes": 256}
SMALL_SIZE, SMALL_STEPS = 256 * 64, 100  # a model this small is timed over at least 100 steps
# The MLP the cost model's CPU profile was fitted to (tests/costmodel/test_costmodel.py): 64 × 256 rows.
RECOMPUTE_ORIGINAL_ROWS = 64 * 256
RSS_ROWS = (512, 2048, 8192)
CACHE_ROWS = 2048  # recompute none vs full differ by ~130 MB of RSS here
FUSION_MB = (1, 4, 16)  # comm_fusion "size" thresholds whose buckets are counted
FUSION_LAYERS, FUSION_IN, FUSION_OUT = 80, 128, 256  # 80 weights of 128 KB = 10 MB of grads
TINY_DP_LAYERS = 41  # Dense(16, 16) + bias: 82 small gradients
PAIR = "facts_pair"


# -- probes: one fact, one fresh process, one JSON line on stdout ----------------------------


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _mindspore(mode: str = "graph", workaround: bool = True):
    import mindspore as ms

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE if mode == "pynative" else ms.GRAPH_MODE)
    if workaround:
        from autotune.train.runtime.session import numpy2_workaround

        numpy2_workaround(ms)
    return ms


def _mlp(ms, layers, hidden, ffn, classes, recompute="none"):
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm((hidden,), epsilon=1e-5)
            self.fc_in, self.fc_out = nn.Dense(hidden, ffn), nn.Dense(ffn, hidden)
            self.gelu = ops.GeLU()

        def construct(self, x):
            return x + self.fc_out(self.gelu(self.fc_in(self.norm(x))))

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inp = nn.Dense(hidden, hidden)
            self.blocks = nn.SequentialCell([Block() for _ in range(layers)])
            self.head = nn.Dense(hidden, classes)

        def construct(self, x):
            return self.head(self.blocks(self.inp(x)))

    net = MLP()
    for block in net.blocks.cells():
        if recompute == "full":
            block.recompute()
        elif recompute == "selective":
            block.gelu.recompute()
    return net


def _train_step(ms, net, dtype: str, jit: str | None):
    from mindspore import nn, ops

    if dtype != "float32":
        net.to_float(getattr(ms, dtype))
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.LayerNorm):
                cell.to_float(ms.float32)

    class WithLoss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net = net
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

        def construct(self, x, y):
            return self.loss(ops.cast(self.net(x), ms.float32), y)

    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    step = nn.TrainOneStepCell(WithLoss(), optimizer)
    if jit:
        step.set_jit_config(ms.JitConfig(jit_level=jit))
    return step


def _data(ms, p: dict):
    import numpy as np

    rng = np.random.default_rng(0)
    return (
        ms.Tensor(rng.standard_normal((p["rows"], p["hidden"]), np.float32)),
        ms.Tensor(rng.integers(0, p["classes"], p["rows"]).astype(np.int32)),
    )


def _step_for(ms, p: dict, knobs: dict):
    ms.set_seed(0)  # every variant starts from the same weights
    net = _mlp(ms, p["layers"], p["hidden"], p["ffn"], p["classes"], knobs.get("recompute", "none"))
    return _train_step(ms, net, knobs.get("dtype", "float32"), knobs.get("jit"))


def probe_train(p: dict) -> dict:
    """Median step time, first (compiling) step time and peak RSS of the MLP training step, in a
    process started in ``mode`` (as the trainer starts its own)."""
    started = time.perf_counter()
    ms = _mindspore(p.get("mode", "graph"))
    rss_runtime = _peak_rss_mb()
    step = _step_for(ms, p, p)
    x, y = _data(ms, p)
    times, losses = [], []
    steps = p["steps"]
    for _ in range(steps + 1):  # the first call compiles
        t0 = time.perf_counter()
        losses.append(float(step(x, y).asnumpy()))
        times.append(time.perf_counter() - t0)
    return {
        "step_s": statistics.median(times[1:]) if steps else float("nan"),
        "first_step_s": times[0],
        "first_done_s": time.perf_counter() - started - sum(times[1:]),
        "peak_rss_mb": _peak_rss_mb(),
        "rss_runtime_mb": rss_runtime,
        "loss": losses[-1],
    }


def probe_alternate(p: dict) -> dict:
    """Several variants of the training step (``variants``: name → knobs) compiled in one
    GRAPH_MODE process, then stepped in turn, ``steps`` rounds: a neighbour's load hits every
    variant of a round alike. Each variant's step times and final loss."""
    ms = _mindspore()
    x, y = _data(ms, p)
    steps = {name: _step_for(ms, p, knobs) for name, knobs in p["variants"].items()}
    out = {
        name: {"times": [], "loss": float(step(x, y).asnumpy())}  # compiles
        for name, step in steps.items()
    }
    for _ in range(p["steps"]):
        for name, step in steps.items():
            t0 = time.perf_counter()
            out[name]["loss"] = float(step(x, y).asnumpy())
            out[name]["times"].append(time.perf_counter() - t0)
    return out


def probe_matmul(p: dict) -> dict:
    """Seconds of one n×n by n×n MatMul per dtype: the cells are called in turn ``rounds`` times,
    the fastest call of each kept (a neighbour's load only ever adds time)."""
    import numpy as np
    from mindspore import nn, ops

    ms = _mindspore()

    class MatMul(nn.Cell):
        def __init__(self):
            super().__init__()
            self.matmul = ops.MatMul()

        def construct(self, a, b):
            return self.matmul(a, b)

    n = p["n"]
    data = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    cells = {dtype: (MatMul(), ms.Tensor(data.astype(dtype))) for dtype in p["dtypes"]}
    best = {dtype: float("inf") for dtype in cells}
    for i in range(p["rounds"] + 1):  # the first round compiles
        for dtype, (cell, x) in cells.items():
            t0 = time.perf_counter()
            cell(x, x).asnumpy()
            if i:
                best[dtype] = min(best[dtype], time.perf_counter() - t0)
    return best


def probe_bf16(p: dict) -> dict:
    """Whether MatMul and Gather compile and run in each dtype (bfloat16 made by a cast inside the
    graph: numpy has no bfloat16)."""
    import numpy as np
    from mindspore import nn, ops

    ms = _mindspore()

    class Op(nn.Cell):
        def __init__(self, name, dtype):
            super().__init__()
            self.name, self.dtype = name, dtype
            self.matmul, self.gather = ops.MatMul(), ops.Gather()

        def construct(self, a, b, idx):
            a, b = ops.cast(a, self.dtype), ops.cast(b, self.dtype)
            # the primitives nn.Dense and nn.Embedding use
            out = self.matmul(a, b) if self.name == "MatMul" else self.gather(a, idx, 0)
            return ops.cast(out, ms.float32)

    a = ms.Tensor(np.ones((4, 4), np.float32))
    idx = ms.Tensor(np.array([0, 2], np.int32))
    result = {}
    for name in ("MatMul", "Gather"):
        for dtype in ("float32", "float16", "bfloat16"):
            try:
                Op(name, getattr(ms, dtype))(a, a, idx).asnumpy()
                result[f"{name} {dtype}"] = "runs"
            except Exception as exc:  # noqa: BLE001 - the message is the measurement
                result[f"{name} {dtype}"] = _first_line(exc, ("Unsupported", "fail!", "support"))
    return result


def probe_numpy2(p: dict) -> dict:
    """The first eager op of a process under numpy 2, without the trainer's workaround."""
    import numpy as np

    ms = _mindspore("pynative", workaround=False)
    outcome = {"numpy": np.__version__, "mindspore": ms.__version__}
    for attempt in ("first", "second"):
        try:
            ms.Tensor(np.zeros(1, np.float32)).reshape((1,))
            outcome[f"{attempt} eager op"] = "runs"
        except SystemError as exc:
            outcome[f"{attempt} eager op"] = f"SystemError, from {exc.__cause__!r}"
    return outcome


def probe_kernels(p: dict) -> dict:
    """Compile and run one training step with IR dumps on (the caller sets MS_DEV_SAVE_GRAPHS and
    MS_DEV_SAVE_GRAPHS_PATH); how many nodes of each operator the graph_build IR files hold."""
    probe_train({**p, "steps": 0})
    ops: dict[str, int] = {}
    for f in Path(os.environ["MS_DEV_SAVE_GRAPHS_PATH"]).rglob("graph_build_*.ir"):
        for m in IR_NODE.finditer(f.read_text(errors="replace")):
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return ops


PROBES = {
    "train": probe_train,
    "alternate": probe_alternate,
    "matmul": probe_matmul,
    "kernels": probe_kernels,
    "bf16": probe_bf16,
    "numpy2": probe_numpy2,
}


def _first_line(exc: BaseException, keys=()) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for key in keys:  # the first key found wins: callers list the most telling first
        for line in lines:
            if key.lower() in line.lower():
                return f"{type(exc).__name__}: {line[:160]}"
    return f"{type(exc).__name__}: {(lines or [''])[0][:160]}"


def run_probe(kind: str, params: dict | None = None, env: dict | None = None) -> dict:
    """``kind`` in a fresh process; its JSON answer (or the error it died with)."""
    from autotune.execution.runner import environment

    argv = [sys.executable, str(Path(__file__).resolve()), "probe", kind, json.dumps(params or {})]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env={**environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
    return json.loads(lines[-1])


# -- two processes under msrun ----------------------------------------------------------------

ALLREDUCE_NODE = re.compile(r"= AllReduce\(([^)]*)\)")
IR_NODE = re.compile(r"^\s+%\d+\([^)]*\) = ([A-Za-z_][\w.]*)\(", re.MULTILINE)


def _allreduce_inputs(folder: Path, before: set) -> list[int]:
    """Tensors reduced by each AllReduce node of the newest ``graph_build_*.ir`` written to
    ``folder`` since ``before`` (the kernel graph as the backend runs it, after fusion)."""
    new = [f for f in folder.glob("graph_build_*.ir") if f not in before]
    if not new:
        return []
    text = max(new, key=lambda f: f.stat().st_mtime).read_text(errors="replace")
    return [len(m.group(1).split(",")) for m in ALLREDUCE_NODE.finditer(text)]


def worker(out: Path, ir_dir: Path) -> None:
    """One msrun rank: the collective facts, then comm-fusion buckets; rank 0 writes ``out``."""
    import mindspore as ms
    import numpy as np
    from mindspore import communication, context, nn, ops

    from autotune.train.runtime.session import numpy2_workaround

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    numpy2_workaround(ms)
    communication.init()
    rank = communication.get_rank()
    communication.create_group(PAIR, [0, 1])
    facts = {}

    class One(nn.Cell):
        def __init__(self, op):
            super().__init__()
            self.op = op

        def construct(self, x):
            return self.op(x)

    def attempt(name, make, x):
        try:
            got = One(make())(x).asnumpy()
            facts[name] = f"runs, shape {list(got.shape)}"
        except Exception as exc:  # noqa: BLE001 - the message is the measurement
            facts[name] = _first_line(exc, ("support", "Unsupported", "Invalid"))

    sent = np.arange(1, 7, dtype=np.float32)
    mine = ms.Tensor(sent if rank == 0 else np.zeros_like(sent))
    got = One(ops.AllReduce(group=PAIR))(mine).asnumpy()
    facts["AllReduce on a 2-rank group, rank 1 contributes zeros"] = (
        "rank 1 receives rank 0's tensor"
        if np.array_equal(got, sent)
        else f"rank {rank} got {got.tolist()}"
    )
    x = ms.Tensor(np.ones((2, 3), np.float32))
    attempt("AllGather on the world group", lambda: ops.AllGather(), x)
    attempt("AllGather on a created 2-rank group", lambda: ops.AllGather(group=PAIR), x)
    attempt(
        "ReduceScatter on the world group",
        lambda: ops.ReduceScatter(),
        ms.Tensor(np.ones((4, 3), np.float32)),
    )
    world = communication.GlobalComm.WORLD_COMM_GROUP
    attempt(
        "Send on the world group", lambda: ops.Send(sr_tag=0, dest_rank=1 - rank, group=world), x
    )

    def dp_step(net, rows, features):
        step = nn.TrainOneStepCell(
            nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 1e-3, 0.9)
        )
        rng = np.random.default_rng(rank)
        data = (
            ms.Tensor(rng.standard_normal((rows, features), np.float32)),
            ms.Tensor(rng.standard_normal((rows, features), np.float32)),
        )
        return step, data

    ir_rank = ir_dir / f"rank_{rank}"

    def fused(mb: int, net, rows, features, steps):
        context.reset_auto_parallel_context()
        context.set_auto_parallel_context(
            parallel_mode=context.ParallelMode.DATA_PARALLEL,
            gradients_mean=True,
            comm_fusion={"allreduce": {"mode": "size", "config": mb}},
        )
        before = set(ir_rank.glob("graph_build_*.ir"))
        step, data = dp_step(net, rows, features)
        step(*data).asnumpy()
        buckets = _allreduce_inputs(ir_rank, before)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(*data).asnumpy()
            times.append(time.perf_counter() - t0)
        return buckets, statistics.median(times) if times else float("nan")

    def chain(layers, a, b, bias):
        return nn.SequentialCell(
            [
                nn.Dense(a if i % 2 == 0 else b, b if i % 2 == 0 else a, has_bias=bias)
                for i in range(layers)
            ]
        )

    fusion = []
    for mb in FUSION_MB:
        buckets, _ = fused(mb, chain(FUSION_LAYERS, FUSION_IN, FUSION_OUT, False), 8, FUSION_IN, 0)
        fusion.append({"threshold_mb": mb, "buckets": buckets})
    tiny = []
    for mb in (0, 32):
        buckets, step_s = fused(mb, chain(TINY_DP_LAYERS, 16, 16, True), 8, 16, 30)
        tiny.append({"threshold_mb": mb, "allreduce": len(buckets), "step_ms": step_s * 1e3})

    context.reset_auto_parallel_context()
    try:
        context.set_auto_parallel_context(
            parallel_mode=context.ParallelMode.SEMI_AUTO_PARALLEL, device_num=2
        )
        net = nn.Dense(4, 4)
        net.matmul.shard(((2, 1), (1, 1)))
        One(net)(ms.Tensor(np.ones((4, 4), np.float32))).asnumpy()
        facts["SEMI_AUTO_PARALLEL"] = "runs"
    except Exception as exc:  # noqa: BLE001 - the message is the measurement
        facts["SEMI_AUTO_PARALLEL"] = _first_line(exc, ("backend", "support"))
    if rank == 0:
        out.write_text(json.dumps({"facts": facts, "fusion": fusion, "tiny_dp": tiny}))


def _ir_env(folder: Path) -> dict:
    """IR dumps into ``folder``, only the graph_build pass (the kernel graph the backend runs):
    without MS_DEV_DUMP_IR_PASSES every pass is dumped, ~2 GB for the fusion graphs."""
    return {
        "MS_DEV_SAVE_GRAPHS": "1",
        "MS_DEV_SAVE_GRAPHS_PATH": str(folder),
        "MS_DEV_DUMP_IR_PASSES": "graph_build",
    }


def measure_collectives() -> dict:
    from autotune.execution.runner import environment, free_port

    work = Path(tempfile.mkdtemp(prefix="autotune-cpu-facts-"))
    out, ir_dir = work / "facts.json", work / "ir"
    msrun = Path(sys.executable).with_name("msrun")
    argv = [
        str(msrun),
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--log_dir={work / 'logs'}",
        "--join=True",
        "--cluster_time_out=120",
        "--bind_core=True",
        str(Path(__file__).resolve()),
        "worker",
        str(out),
        str(ir_dir),
    ]
    env = {**environment(), **_ir_env(ir_dir)}
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode or not out.exists():
        return {"error": f"msrun exit {done.returncode}; worker logs in {work / 'logs'}"}
    result = json.loads(out.read_text())
    shutil.rmtree(work)  # IR dumps are large; kept only when msrun failed, for its logs
    return result


# -- the facts --------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = []  # (fact, measured, note)


def row(fact: str, measured: str, note: str = "") -> None:
    ROWS.append((fact, measured, note))
    print(f"  {fact}: {measured}" + (f"  ({note})" if note else ""), flush=True)


def _train(shape: dict, steps: int, **knobs) -> dict:
    steps = max(steps, SMALL_STEPS) if shape["rows"] * shape["hidden"] <= SMALL_SIZE else steps
    return run_probe("train", {**shape, "steps": steps, **knobs})


def _ok(*results) -> bool:
    for r in results:
        if "error" in r:
            row("error", r["error"][-300:])
            return False
    return True


def _alternate(label: str, shape: dict, steps: int, base: str, variants: dict[str, dict]) -> None:
    """``variants`` stepped in turn in one process (``probe_alternate``); a row per variant other
    than ``base``: the median over rounds of its step time ÷ the base's in the same round."""
    steps = max(steps, SMALL_STEPS) if shape["rows"] * shape["hidden"] <= SMALL_SIZE else steps
    r = run_probe("alternate", {**shape, "steps": steps, "variants": variants})
    if not _ok(r):
        return
    b = r[base]
    for name in variants:
        if name == base:
            continue
        v = r[name]
        ratio = statistics.median(t / u for t, u in zip(v["times"], b["times"]))
        row(
            f"{name} / {base} step time, {label} {_shape(shape)}",
            f"{ratio:.2f}×",
            f"{statistics.median(v['times']) * 1e3:.1f} vs "
            f"{statistics.median(b['times']) * 1e3:.1f} ms; final loss "
            + ("equal" if v["loss"] == b["loss"] else "different"),
        )


def _rounds(
    label: str, shape: dict, steps: int, rounds: int, base: str, variants: dict[str, dict]
) -> None:
    """Each variant in fresh processes started as the trainer starts them, the variants one after
    another for ``rounds`` rounds; a row per variant other than ``base``: the ratio of the best
    round of each (a neighbour's load only ever adds time), and each round's ratio."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, knobs in variants.items():
            r = _train(shape, steps, **knobs)
            if not _ok(r):
                return
            times[name].append(r["step_s"])
    for name in variants:
        if name == base:
            continue
        best, best_base = min(times[name]), min(times[base])
        per_round = [t / u for t, u in zip(times[name], times[base])]
        row(
            f"{name} / {base} step time, {label} {_shape(shape)}",
            f"{best / best_base:.2f}×",
            f"best of {rounds}: {best * 1e3:.1f} vs {best_base * 1e3:.1f} ms; per round "
            + ", ".join(f"{x:.2f}×" for x in per_round),
        )


def fact_fp16(steps: int, rounds: int) -> None:
    n = 1024
    r = run_probe("matmul", {"n": n, "dtypes": ["float32", "float16"], "rounds": 20})
    if _ok(r):
        flop = 2 * n**3
        for dtype, seconds in r.items():
            row(
                f"MatMul {n}×{n}×{n} {dtype}, GRAPH_MODE, best of 20",
                f"{flop / seconds / 1e9:.0f} GFLOP/s",
                f"{seconds * 1e3:.1f} ms",
            )
        row(f"MatMul {n}³ fp16 / fp32 time", f"{r['float16'] / r['float32']:.2f}×")
    for label, shape in (("small", SMALL), ("medium", MEDIUM)):
        _rounds(
            label,
            shape,
            steps,
            rounds,
            "fp32",
            {"fp32": {"dtype": "float32"}, "fp16": {"dtype": "float16"}},
        )


def fact_pynative(steps: int, rounds: int) -> None:
    # Fresh processes: a process started in one mode runs the other one slower.
    for label, shape in (("small", SMALL), ("medium", MEDIUM)):
        _rounds(
            label,
            shape,
            steps,
            rounds,
            "GRAPH_MODE",
            {"GRAPH_MODE": {"mode": "graph"}, "PyNative": {"mode": "pynative"}},
        )


def fact_jit(steps: int) -> None:
    kernels = {}
    for jit in ("O0", "O1", "O2"):
        ir = Path(tempfile.mkdtemp(prefix="autotune-cpu-facts-ir-"))
        try:
            kernels[jit] = run_probe("kernels", {**SMALL, "jit": jit}, _ir_env(ir))
        finally:
            shutil.rmtree(ir, ignore_errors=True)
    if _ok(*kernels.values()):
        o1 = kernels["O1"]
        for jit in ("O0", "O2"):
            same = kernels[jit] == o1
            row(
                f"{jit} vs O1 kernel graph (graph_build IR, small {_shape(SMALL)})",
                "same operators and counts" if same else "different",
                f"{sum(o1.values())} nodes"
                if same
                else f"{jit}: {_histogram_diff(kernels[jit], o1)}",
            )
    # Same kernels, so the time is only confirmed on the small model (stepped in turn in one
    # process; a process holding several large graphs slows them unevenly).
    _alternate("small", SMALL, steps, "O1", {jit: {"jit": jit} for jit in ("O1", "O0", "O2")})


def _histogram_diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(
        f"{k} {a.get(k, 0)} vs {b.get(k, 0)}" for k in keys if a.get(k, 0) != b.get(k, 0)
    )


def _estimate(shape: dict, recompute: str) -> tuple[float, float]:
    """The cost model's (MB, s) for the MLP at ``shape`` on the CPU profile, one process."""
    from autotune.costmodel import estimate
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import parse_spec

    spec = parse_spec(
        {
            "model": {
                "family": "mlp",
                "num_layers": shape["layers"],
                "hidden_size": shape["hidden"],
                "num_heads": 1,
                "ffn_hidden_size": shape["ffn"],
                "seq_length": 1,
                "vocab_size": shape["classes"],
                "dtype": "float32",
            },
            "train": {"global_batch_size": shape["rows"]},
            "cluster": {
                "backend": "cpu",
                "devices": 1,
                "devices_per_node": 1,
                "device_memory_gb": 1000,
            },
        },
        ROOT / "cpu_facts.yaml",
    )
    est = estimate(spec, Candidate(1, 1, 1, 1, 64, 1, 2**16, 0, "O1", recompute))
    return est.memory_gb_per_device * 1024, est.step_time_s


def fact_recompute(steps: int, rows: int) -> None:
    """Each mode in a fresh process (peak RSS and step time); the cost model's estimate beside."""
    shape = {**MEDIUM, "rows": rows}
    runs = {mode: _train(shape, steps, recompute=mode) for mode in ("none", "selective", "full")}
    if not _ok(*runs.values()):
        return
    none = runs["none"]
    for mode, r in runs.items():
        mb, s = _estimate(shape, mode)
        vs_none = (
            ""
            if mode == "none"
            else f"{r['peak_rss_mb'] / none['peak_rss_mb'] - 1:+.0%} memory, "
            f"{r['step_s'] / none['step_s'] - 1:+.0%} time vs none; "
        )
        row(
            f"recompute {mode}, 8 residual MLP blocks d 256 ffn 1024, {rows} rows fp32",
            f"{r['peak_rss_mb']:,.0f} MB, {r['step_s']:.2f} s/step",
            vs_none + f"cost model {mb:,.0f} MB, {s:.2f} s",
        )


def fact_rss(steps: int) -> None:
    runs = {rows: _train({**MEDIUM, "rows": rows}, steps) for rows in RSS_ROWS}
    if not _ok(*runs.values()):
        return
    xs, ys = list(runs), [r["peak_rss_mb"] for r in runs.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    for rows_, r in runs.items():
        row(
            f"peak RSS, MLP 8×256 fp32 training step, {rows_} rows",
            f"{r['peak_rss_mb']:,.0f} MB",
            f"after import + context: {r['rss_runtime_mb']:,.0f} MB",
        )
    row(
        "peak RSS extrapolated to 0 rows (least squares over the rows above)",
        f"{(my - slope * mx) / 1024:.2f} GB",
        f"+{slope * 1024:.0f} MB per 1024 rows",
    )
    tiny = _train(SMALL, steps)
    if _ok(tiny):
        row(
            f"peak RSS, small model {_shape(SMALL)}",
            f"{tiny['peak_rss_mb']:,.0f} MB",
            f"after import + context: {tiny['rss_runtime_mb']:,.0f} MB; first step done "
            f"{tiny['first_done_s']:.1f} s after start, compile step {tiny['first_step_s']:.1f} s",
        )


def fact_cache(steps: int, rows: int) -> None:
    """MS_COMPILER_CACHE_ENABLE across a knob change: the same program compiles recompute=full
    into a fresh cache, then runs recompute=none from it. The peak RSS tells which graph ran:
    full recompute keeps less, so a "none" run at full's RSS executed the cached full graph."""
    shape = {**MEDIUM, "rows": rows}
    cache = Path(tempfile.mkdtemp(prefix="autotune-cpu-facts-cache-"))
    env = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache)}
    try:
        filled = run_probe("train", {**shape, "steps": steps, "recompute": "full"}, env)
        cached = run_probe("train", {**shape, "steps": steps, "recompute": "none"}, env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    fresh = {mode: _train(shape, steps, recompute=mode) for mode in ("none", "full")}
    if _ok(filled, cached, *fresh.values()):
        row(
            f"compile cache: recompute=full compiled into it, then recompute=none run from it "
            f"({rows} rows)",
            f"none ran at {cached['peak_rss_mb']:,.0f} MB",
            f"without the cache none {fresh['none']['peak_rss_mb']:,.0f} MB, full "
            f"{fresh['full']['peak_rss_mb']:,.0f} MB (full filling the cache "
            f"{filled['peak_rss_mb']:,.0f} MB); compile step {cached['first_step_s']:.1f} s from "
            f"the cache vs {fresh['none']['first_step_s']:.1f} s",
        )


def fact_bf16() -> None:
    r = run_probe("bf16")
    for key, value in r.items():
        row(f"{key} in a CPU graph" if key != "error" else "bf16 probe", value)


def fact_numpy2() -> None:
    r = run_probe("numpy2")
    for key, value in r.items():
        row(f"numpy-2 probe: {key}", value)


def fact_collectives() -> None:
    r = measure_collectives()
    if not _ok(r):
        return
    for key, value in r["facts"].items():
        row(key, value)
    tensor_mb = FUSION_IN * FUSION_OUT * 4 / 2**20
    for f in r["fusion"]:
        buckets = f["buckets"]
        if not buckets:
            row(f"comm_fusion size {f['threshold_mb']} MB", "no graph_build IR found")
            continue
        full = max(buckets) * tensor_mb
        row(
            f"comm_fusion size {f['threshold_mb']} MB, {FUSION_LAYERS} gradients of "
            f"{tensor_mb * 1024:.0f} KB: AllReduce nodes in graph_build IR",
            f"{len(buckets)}, full bucket {full:.3f} MB = "
            f"{full / f['threshold_mb']:.2f} × threshold",
            f"tensors per bucket {_runs(buckets)}",
        )
    for t in r["tiny_dp"]:
        row(
            f"tiny DP model ({2 * TINY_DP_LAYERS} grads), comm_fusion size {t['threshold_mb']} MB",
            f"{t['step_ms']:.1f} ms/step",
            f"{t['allreduce']} AllReduce nodes",
        )


def _runs(values: list[int]) -> str:
    """[3, 3, 3, 2] → "3×3, 2"."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}×{j - i}" if j - i > 1 else f"{values[i]}")
        i = j
    return ", ".join(out)


def _shape(shape: dict) -> str:
    return f"({shape['layers']}×{shape['hidden']}, {shape['rows']} rows)"


def main() -> None:
    if sys.argv[1:2] == ["probe"]:  # probe KIND JSON
        print(json.dumps(PROBES[sys.argv[2]](json.loads(sys.argv[3]))), flush=True)
        return
    if sys.argv[1:2] == ["worker"]:  # under msrun: worker OUT IR_DIR
        worker(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    names = (
        "fp16",
        "pynative",
        "jit",
        "recompute",
        "rss",
        "cache",
        "bf16",
        "numpy2",
        "collectives",
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=names, default=list(names))
    parser.add_argument(
        "--steps",
        type=int,
        default=4,
        help=f"timed steps per run, their median (small models: {SMALL_STEPS})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="fresh-process rounds of the fp16 and PyNative comparisons",
    )
    parser.add_argument(
        "--recompute-rows",
        type=int,
        default=4096,
        help=f"rows of the recompute runs ({RECOMPUTE_ORIGINAL_ROWS}: "
        "the size the cost model's CPU profile was fitted to, ~10 s a step)",
    )
    args = parser.parse_args()
    started = time.time()
    print(f"{date.today()}, load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    for name in args.only:
        print(f"[{name}]", flush=True)
        steps = {"rss": 2, "cache": 2, "recompute": min(args.steps, 3)}.get(name, args.steps)
        {
            "fp16": lambda: fact_fp16(args.steps, args.rounds),
            "pynative": lambda: fact_pynative(args.steps, args.rounds),
            "jit": lambda: fact_jit(args.steps),
            # called below, in this iteration: `steps` is this fact's
            "recompute": lambda: fact_recompute(steps, args.recompute_rows),  # noqa: B023
            "rss": lambda: fact_rss(steps),  # noqa: B023
            "cache": lambda: fact_cache(steps, CACHE_ROWS),  # noqa: B023
            "bf16": fact_bf16,
            "numpy2": fact_numpy2,
            "collectives": fact_collectives,
        }[name]()
    width = max(len(f) for f, _, _ in ROWS) if ROWS else 10
    print(f"\n{'fact':<{width}}  measured")
    for fact, measured, note in ROWS:
        print(f"{fact:<{width}}  {measured}" + (f"  [{note}]" if note else ""))
    print(f"\n{time.time() - started:.0f} s, load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
