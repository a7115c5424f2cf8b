# measured at caa3d05
# A MindSpore fact check (docs/mindspore-cpu.md, "Compile cache"): re-run it after a MindSpore
# upgrade.
"""How MindSpore 2.10's compile cache finds a graph: by the order a process compiles, not by
the graph (docs/mindspore-cpu.md, "Compile cache").

Three small graphs (the gradient of a two-layer Dense net: GeLU d=64, ReLU d=32, GeLU d=48),
each step in a fresh process with MS_COMPILER_CACHE_ENABLE=1:

1. fill a cache compiling A, B, C in that order;
2. run A, B, C from it: every graph loads, the sums match their own uncached values;
3. run B, A, C from it: B gets A's file — a wrong graph (its sum is not B's);
4. a cache whose slot 1 holds no file: A loads, then loading stops for the process (C compiles);
5. a cache whose slot 1 holds a file that is no graph: A loads, B compiles (a miss), C loads.

Prints one row per run: which graphs MindSpore loaded, and each graph's sum against its
uncached sum.

    python benchmarks/records/compile_cache_slots.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOADED = "Use the compilation cache"
GRAPHS = {"A": (64, "gelu"), "B": (32, "relu"), "C": (48, "gelu")}

CHILD = r"""
import json, sys
import numpy as np
import mindspore as ms
from mindspore import nn, ops
ms.set_context(mode=ms.GRAPH_MODE)
try:
    ms.Tensor(np.zeros(1, np.float32)).reshape((1,))
except SystemError:
    pass  # numpy 2: the first eager op (docs/mindspore-cpu.md, "numpy 2")
ms.set_seed(0)
grad = ops.GradOperation(get_by_list=True)

class Net(nn.Cell):
    def __init__(self, d, act):
        super().__init__()
        self.a, self.b = nn.Dense(d, d), nn.Dense(d, d)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()
    def construct(self, x):
        return self.b(self.act(self.a(x))).sum()

class Grad(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net, self.weights = net, ms.ParameterTuple(net.trainable_params())
    def construct(self, x):
        return grad(self.net, self.weights)(x)

sums = {}
for name, (d, act) in json.loads(sys.argv[1]):
    out = Grad(Net(d, act))(ms.Tensor(np.ones((4, d), np.float32)))
    sums[name] = float(sum(float(g.sum().asnumpy()) for g in out))
print(json.dumps(sums), flush=True)
"""


def run(script: Path, order: str, cache: Path | None) -> tuple[dict, int]:
    """The graphs of ``order`` in one fresh process: (sums, how many loaded from ``cache``)."""
    env = {**os.environ, "GLOG_v": "2", "PYTHONPATH": str(ROOT)}
    env.pop("MS_COMPILER_CACHE_ENABLE", None)
    if cache is not None:
        env.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=f"{cache}/")
    graphs = [[name, GRAPHS[name]] for name in order]
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(graphs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.count(LOADED)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="autotune-cache-slots-"))
    script = work / "graphs.py"  # MindSpore parses source from files only
    script.write_text(CHILD)
    try:
        truth, _ = run(script, "ABC", None)
        filled = work / "filled"
        run(script, "ABC", filled)
        slots = filled / "rank_0" / "graph_cache"
        rows = []
        for what, order, prepare in (
            ("the same order", "ABC", None),
            ("B and A swapped", "BAC", None),
            ("slot 1 without a file", "ABC", lambda d: (d / "compile_cache_1.mindir").unlink()),
            (
                "slot 1 holding no graph",
                "ABC",
                lambda d: (d / "compile_cache_1.mindir").write_bytes(b"junk"),
            ),
        ):
            cache = work / what.replace(" ", "-")
            shutil.copytree(filled, cache)
            for f in (cache / "rank_0" / "graph_cache").iterdir():
                f.chmod(0o644)  # MindSpore leaves them read-only
            if prepare:
                prepare(cache / "rank_0" / "graph_cache")
            sums, loaded = run(script, order, cache)
            right = "".join(
                n for n in order if abs(sums[n] - truth[n]) <= 1e-4 * abs(truth[n]) + 1e-6
            )
            rows.append((what, order, loaded, right))
        print(f"\nslots filled by one process: {sorted(p.name for p in slots.iterdir())}\n")
        print(f"{'cache':<26} | order | graphs loaded | graphs with their own sums")
        print("-" * 75)
        for what, order, loaded, right in rows:
            print(f"{what:<26} | {order:>5} | {loaded:>13} | {right or '-'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
