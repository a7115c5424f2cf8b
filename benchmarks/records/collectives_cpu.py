# measured at 11f1e9d
# A MindSpore fact check (docs/costmodel.md, "CPU communication terms"): re-run it after a
# MindSpore upgrade.
"""All-reduce latency and bandwidth between two MindSpore CPU workers, fitted to the cost model's
α–β model (run by hand; prints a table).

    .venv/bin/python benchmarks/records/collectives_cpu.py [--repeat 8] [--budget-s 3]

Launches ``msrun --worker_num=2 --local_worker_num=2 --bind_core=True`` (workers pinned to cores,
as the CPU backend runs trials) on this file in worker mode. Each worker, in GRAPH_MODE on CPU
after ``communication.init()``, creates a 2-rank group with ``create_group`` (the way the trainer
creates its tp/dp/pipeline groups) and times ``ops.AllReduce`` on that group inside compiled
``nn.Cell`` s, for float32 messages of 4 B to 64 MB: warm-up calls, then the median of many calls
(as many pairs as fit in ``--budget-s`` per size, at least 5).

What is timed per size: a cell running ``R`` chained all-reduces (each reduces the previous
result, so none can overlap or fuse) and a cell running one, called alternately. The median of
their difference over ``R − 1`` is the cost of one all-reduce *inside a graph*, as the trainer's
all-reduces are; the fixed cost of calling a graph (launch, argument copy, synchronisation)
cancels out. The one-op cell's median time is printed too.

The fit: ``autotune.costmodel.step_time.allreduce_time`` prices n = 2 as
``α + 2·(n−1)/n · S / B_eff = α + S / B_eff``, with α = collective_latency_us + 2·hop_latency_us
and B_eff = intra_node_gbps × link_efficiency. A least-squares fit of relative error (every size
weighs the same) gives α and B_eff, over all sizes and over the 16 KB – 4 MB range the trainer's
messages fall in (hidden states, pipeline sends, gradient buckets); the per-size residuals show
where the straight line fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SIZES = [4 * 4**k for k in range(13)]  # 4 B … 64 MiB, ×4 apart
TRAINER_RANGE = (16 * 2**10, 4 * 2**20)  # the message sizes the trainer sends
GROUP = "bench_pair"
MIN_PAIRS, MAX_PAIRS, WARMUP = 5, 300, 3  # timed pairs per size; untimed pairs first


def worker(out: Path, repeat: int, budget_s: float) -> None:
    """One msrun worker: time the all-reduces, rank 0 writes ``out`` (JSON rows)."""
    import mindspore as ms
    import numpy as np
    from mindspore import communication, nn, ops

    from autotune.train.runtime.session import numpy2_workaround

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    numpy2_workaround(ms)
    communication.init()
    rank = communication.get_rank()
    communication.create_group(GROUP, [0, 1])

    class Chain(nn.Cell):
        """``count`` all-reduces, each of the previous one's result."""

        def __init__(self, count):
            super().__init__()
            self.ops = [ops.AllReduce(group=GROUP) for _ in range(count)]

        def construct(self, x):
            for op in self.ops:
                x = op(x)
            return x

    def timed(cell, x) -> float:
        start = time.perf_counter()
        cell(x)
        ms.runtime.synchronize()
        return time.perf_counter() - start

    def measure_size(nbytes: int) -> dict:
        x = ms.Tensor(np.ones(nbytes // 4, np.float32))
        for _ in range(WARMUP):
            timed(one, x), timed(chain, x)
        first = timed(one, x) + timed(chain, x)
        # Both ranks must make the same number of calls: rank 0's count, summed with rank 1's
        # zero through the one-op cell (the CPU backend's AllReduce only sums).
        pairs = int(min(MAX_PAIRS, max(MIN_PAIRS, budget_s / max(first, 1e-6))))
        pairs = int(one(ms.Tensor(np.array([pairs if rank == 0 else 0], np.float32))).asnumpy()[0])
        # The two cells alternate, so a busy neighbour slows both alike; the median of the
        # per-pair differences then drops the pairs it hit.
        ones, chains = [], []
        for _ in range(pairs):
            ones.append(timed(one, x))
            chains.append(timed(chain, x))
        per_op = statistics.median(c - o for c, o in zip(chains, ones)) / (repeat - 1)
        return {
            "bytes": nbytes,
            "one_call_s": statistics.median(ones),
            "chain_call_s": statistics.median(chains),
            "per_op_s": per_op,
            "pairs": pairs,
        }

    one, chain = Chain(1), Chain(repeat)
    rows = [measure_size(nbytes) for nbytes in SIZES]
    if rank == 0:
        out.write_text(json.dumps(rows))


def fit(rows: list[dict]) -> tuple[float, float]:
    """(α seconds, B_eff bytes/s) minimising Σ ((α + S/B − t) / t)² (closed form)."""
    # Weighted least squares of t = α + β·S with weights 1/t².
    w = [1 / r["per_op_s"] ** 2 for r in rows]
    s = [r["bytes"] for r in rows]
    t = [r["per_op_s"] for r in rows]
    sw = sum(w)
    sx = sum(wi * xi for wi, xi in zip(w, s))
    sy = sum(wi * yi for wi, yi in zip(w, t))
    sxx = sum(wi * xi * xi for wi, xi in zip(w, s))
    sxy = sum(wi * xi * yi for wi, xi, yi in zip(w, s, t))
    beta = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    alpha = (sy - beta * sx) / sw
    return alpha, 1 / beta


def measure(repeat: int, budget_s: float) -> list[dict]:
    from autotune.execution.runner import environment, free_port

    work = Path(tempfile.mkdtemp(prefix="autotune-collectives-"))
    out = work / "rows.json"
    msrun = Path(sys.executable).with_name("msrun")
    argv = [
        str(msrun),
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--log_dir={work / 'logs'}",
        "--join=True",
        "--bind_core=True",
        str(Path(__file__).resolve()),
        # positional: msrun's own parser would take --worker… for an abbreviation of its flags
        "worker",
        str(out),
        str(repeat),
        str(budget_s),
    ]
    done = subprocess.run(argv, cwd=work, env=environment(), capture_output=True, text=True)
    if done.returncode or not out.exists():
        sys.exit(
            f"msrun failed (exit {done.returncode}); worker logs in {work / 'logs'}\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    rows = json.loads(out.read_text())
    shutil.rmtree(work)  # kept only when msrun failed, for its logs
    return rows


def report(rows: list[dict]) -> None:
    from autotune.costmodel.profiles import CPU_BASE

    fits = {
        "all sizes": fit(rows),
        "16 KB-4 MB": fit([r for r in rows if TRAINER_RANGE[0] <= r["bytes"] <= TRAINER_RANGE[1]]),
    }
    print(
        f"{'bytes':>10}{'1-op graph ms':>15}{'per op ms':>11}{'GB/s':>8}"
        + "".join(f"{'fit ' + name:>20}" for name in fits)
        + f"{'pairs':>7}"
    )
    for r in rows:
        line = (
            f"{r['bytes']:>10}{r['one_call_s'] * 1e3:>15.4f}{r['per_op_s'] * 1e3:>11.4f}"
            f"{r['bytes'] / r['per_op_s'] / 1e9:>8.2f}"
        )
        for alpha, bandwidth in fits.values():
            predicted = alpha + r["bytes"] / bandwidth
            line += f"{predicted / r['per_op_s'] - 1:>+20.1%}"
        print(line + f"{r['pairs']:>7}")
    for name, (alpha, bandwidth) in fits.items():
        print(
            f"fit over {name}: α = {alpha * 1e6:.1f} µs, B_eff = {bandwidth / 1e9:.2f} GB/s "
            f"(intra_node_gbps at link_efficiency {CPU_BASE.link_efficiency}: "
            f"{bandwidth / 1e9 / CPU_BASE.link_efficiency:.2f})"
        )


def main() -> None:
    if sys.argv[1:2] == ["worker"]:  # under msrun: worker OUT REPEAT BUDGET_S
        worker(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=8, help="all-reduces in the chained cell")
    parser.add_argument("--budget-s", type=float, default=3.0, help="timing seconds per size")
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error("--repeat must be ≥ 2")
    report(measure(args.repeat, args.budget_s))


if __name__ == "__main__":
    main()
