# measured at 0696062
# A MindSpore fact check (docs/costmodel.md, docs/parallel.md): re-run it after a MindSpore upgrade.
"""What a tensor-parallel all-reduce costs inside a compute graph on this CPU, against the chained
all-reduces `benchmarks/records/collectives_cpu.py` fits the cost model to.

Launches two pinned msrun workers on this file in worker mode. Each builds, in GRAPH_MODE, a
Cell of 13 dependent (rows × 128) @ (128 × 128) matmuls — the tiny GPT model's shapes — once
plain and once with an all-reduce over a 2-rank group after every matmul (as a tensor-parallel
layer has), and times both (median of 40 calls after warm-up); the difference over 13 is one
all-reduce in a graph, per dtype.

    .venv/bin/python benchmarks/records/allreduce_in_graph.py [--rows 1024]
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

MATMULS = 13  # the tiny GPT transformer's tensor-parallel all-reduces per micro-batch


def worker(out: Path, rows: int) -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops
    from mindspore.communication import create_group, get_rank, init

    from autotune.train.runtime.session import numpy2_workaround

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    numpy2_workaround(ms)  # before init(), as the trial program does: after it, the worker exits 1
    init()
    create_group("pair", [0, 1])

    class Chain(nn.Cell):
        def __init__(self, reduce: bool):
            super().__init__()
            rng = np.random.default_rng(0)
            self.weights = ms.ParameterTuple(
                [
                    ms.Parameter(
                        ms.Tensor(0.05 * rng.standard_normal((128, 128)).astype(np.float32)),
                        name=f"w{i}",
                    )
                    for i in range(MATMULS)
                ]
            )
            self.all_reduce = ops.AllReduce(group="pair") if reduce else None

        def construct(self, x):
            for w in self.weights:
                x = ops.matmul(x, ops.cast(w, x.dtype))
                if self.all_reduce is not None:
                    x = self.all_reduce(x) * 0.5
            return x

    results = {}
    for name, dtype in (("float32", ms.float32), ("float16", ms.float16)):
        x = ms.Tensor(np.ones((rows, 128), np.float32)).astype(dtype)
        times = {}
        for reduce in (False, True):
            chain = Chain(reduce)
            for _ in range(5):
                chain(x).asnumpy()
            samples = []
            for _ in range(40):
                t0 = time.perf_counter()
                chain(x).asnumpy()
                samples.append(time.perf_counter() - t0)
            times[reduce] = statistics.median(samples) * 1000
        results[name] = {
            "plain_ms": times[False],
            "reduced_ms": times[True],
            "per_allreduce_ms": (times[True] - times[False]) / MATMULS,
            "message_kb": rows * 128 * (4 if name == "float32" else 2) / 1024,
        }
    if get_rank() == 0:
        out.write_text(json.dumps(results))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=1024, help="rows of the activation (batch × seq)"
    )
    args = parser.parse_args()
    from autotune.costmodel import resolve_profile
    from autotune.costmodel.step_time import allreduce_time
    from autotune.execution.runner import environment, free_port

    work = Path(tempfile.mkdtemp(prefix="autotune-arig-"))
    try:
        msrun = Path(sys.executable).with_name("msrun")
        cmd = [
            str(msrun),
            "--worker_num=2",
            "--local_worker_num=2",
            f"--master_port={free_port()}",
            f"--log_dir={work / 'logs'}",
            "--join=True",
            "--bind_core=True",
            str(Path(__file__).resolve()),
            "worker",
            str(work / "out.json"),
            str(args.rows),
        ]
        with open(work / "msrun.log", "w") as log:
            done = subprocess.run(
                cmd, env=environment(), stdout=log, stderr=subprocess.STDOUT, timeout=600, cwd=work
            )
        if done.returncode or not (work / "out.json").exists():
            print(
                f"msrun failed ({done.returncode}); logs kept in {work / 'logs'}", file=sys.stderr
            )
            return 1
        results = json.loads((work / "out.json").read_text())
    finally:
        if (work / "out.json").exists():
            shutil.rmtree(work, ignore_errors=True)
    from types import SimpleNamespace

    profile = resolve_profile(
        SimpleNamespace(backend="cpu", device_memory_gb=None, devices_per_node=2, device=None)
    )
    print(f"{MATMULS} dependent ({args.rows} × 128) matmuls, 2 pinned workers")
    print(
        f"{'dtype':<9}{'message':>10}{'plain ms':>10}{'+all-reduces ms':>17}{'per all-reduce':>16}{'priced':>9}"
    )
    for name, r in results.items():
        priced = allreduce_time(r["message_kb"] * 1024, 2, profile.intra_node_gbps, profile) * 1000
        print(
            f"{name:<9}{r['message_kb']:>8.0f}KB{r['plain_ms']:>10.2f}{r['reduced_ms']:>17.2f}"
            f"{r['per_allreduce_ms']:>14.2f}ms{priced:>7.2f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
