# measured at 36197c2
# A decision record (docs/parallel.md, "A backward recomputes its forward"): what chose the code as
# it is; not kept in step with later code.
"""Can a pipeline stage keep its residuals between its forward and its backward call on this CPU?
(Run by hand; prints a table. docs/parallel.md, "A backward recomputes its forward".)

    .venv/bin/python benchmarks/records/stage_residuals.py [--rounds 3]

autotune's trainer (autotune/train/parallel/pipeline.py) runs a non-last stage's forward twice: MindSpore
compiles a backward together with its forward, so the stage runs a forward-only graph to send its
output on, and later forward + backward fed the gradient. Three ways of running one micro-batch
of a 4-block stage (h 256, 1024 tokens, float32), each in a process of its own (the execution
mode is per process), interleaved round by round:

  graph     GRAPH_MODE, as the trainer: a forward-only graph, then forward + backward fed dy,
            the weight gradients added into accumulators inside that graph;
  vjp       PYNATIVE_MODE, the stage's construct compiled (``ms.jit``), ``mindspore.vjp``: the
            forward now, ``vjp_fn(dy)`` later, the gradients added by a compiled function;
  graphvjp  GRAPH_MODE, ``mindspore.vjp`` called from Python, outside any graph.

Per way: the median forward and backward call times over the measured calls (the first two
warm up), the rise of VmHWM while 4 micro-batches' forwards are held at once (residuals kept
between the calls), whether the accumulated gradients equal the trainer's, and whether held
forwards can be back-propagated oldest first — the order 1F1B needs — rather than newest first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

H, TOKENS, LAYERS, CALLS, IN_FLIGHT = 256, 1024, 4, 9, 4
MODES = ("graph", "vjp", "graphvjp")


def worker(mode: str, out: Path) -> dict:
    """One way of running the stage (see the module doc); the gradients go to ``out``."""
    import mindspore as ms
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc_in, self.fc_out, self.act = nn.Dense(H, 4 * H), nn.Dense(4 * H, H), nn.GELU()

        def construct(self, x):
            return x + self.fc_out(self.act(self.fc_in(x)))

    class Stage(nn.Cell):
        def __init__(self):
            super().__init__()
            self.blocks = nn.SequentialCell([Block() for _ in range(LAYERS)])

        def construct(self, x):
            return self.blocks(x)

    ms.set_context(mode=ms.PYNATIVE_MODE if mode == "vjp" else ms.GRAPH_MODE)
    ms.set_seed(0)
    stage = Stage()
    weights = ms.ParameterTuple(stage.trainable_params())
    accum = weights.clone(prefix="accum", init="zeros")
    rng = np.random.default_rng(0)

    def batch():
        return ms.Tensor(rng.standard_normal((TOKENS, H)).astype(np.float32))

    dy = batch()
    add = ops.HyperMap()
    if mode == "graph":

        class Backward(nn.Cell):
            def __init__(self):
                super().__init__()
                self.net, self.weights, self.accum = stage, weights, accum
                self.grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)

            def construct(self, x, dy):
                grads = self.grad(self.net, self.weights)(x, dy)
                return ops.depend(grads[0][0], add(ops.assign_add, self.accum, grads[1]))

        backward = Backward()

        def forward(x):
            return stage(x), None

        def back(x, held, dy):
            return backward(x, dy)
    else:
        if mode == "vjp":
            stage.construct = ms.jit(stage.construct)

        @ms.jit
        def accumulate(grads):
            return add(ops.assign_add, accum, grads)

        def forward(x):
            return ms.vjp(stage, x, weights=weights)

        def back(x, held, dy):
            dx, grads = held(dy)
            accumulate(grads)
            return dx[0] if isinstance(dx, tuple) else dx

    x = batch()
    fwd, bwd = [], []
    for _ in range(CALLS):
        start = time.perf_counter()
        y, held = forward(x)
        y.asnumpy()
        fwd.append(time.perf_counter() - start)
        start = time.perf_counter()
        back(x, held, dy).asnumpy()
        bwd.append(time.perf_counter() - start)
    Path("/proc/self/clear_refs").write_text("5")
    base = _hwm_mb()
    xs = [batch() for _ in range(IN_FLIGHT)]
    kept = [forward(x) for x in xs]
    for y, _ in kept:
        y.asnumpy()
    hold = _hwm_mb() - base
    for x, (_, held) in reversed(list(zip(xs, kept))):  # newest first: always found
        back(x, held, dy).asnumpy()
    np.save(out, np.concatenate([a.asnumpy().ravel() for a in accum]))
    xs = [batch() for _ in range(2)]
    kept = [forward(x) for x in xs]
    try:
        for x, (_, held) in zip(xs, kept):  # oldest first, as 1F1B runs them
            back(x, held, dy).asnumpy()
        fifo = "yes"
    except RuntimeError as exc:
        fifo = "no: " + str(exc).split("\n")[0].removeprefix("Failure info [")[:60]
    return {
        "forward_ms": 1000 * float(np.median(fwd[2:])),
        "backward_ms": 1000 * float(np.median(bwd[2:])),
        "hold_mb": hold,
        "fifo": fifo,
    }


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=MODES)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.out))))
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for r in range(args.rounds):
            for mode in MODES:
                out = Path(tmp) / f"{mode}.npy"
                done = subprocess.run(
                    [sys.executable, __file__, "--worker", mode, "--out", str(out)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row.update(round=r + 1, mode=mode, grads=np.load(out))
                rows.append(row)
        print(
            f"one micro-batch of a {LAYERS}-block stage, h {H}, {TOKENS} tokens, float32; "
            f"{args.rounds} rounds"
        )
        print(
            f"{'round':>5} {'way':<9}{'forward ms':>11}{'backward ms':>12}{'per micro-batch':>16}"
            f"{'vs graph':>9}{'held MB':>8}  {'grads = graph':<14}oldest first (1F1B)"
        )
        for row in rows:
            graph = next(g for g in rows if g["round"] == row["round"] and g["mode"] == "graph")
            total = row["forward_ms"] + row["backward_ms"]
            ratio = total / (graph["forward_ms"] + graph["backward_ms"])
            same = float(np.abs(row["grads"] - graph["grads"]).max())
            print(
                f"{row['round']:>5} {row['mode']:<9}{row['forward_ms']:>11.1f}{row['backward_ms']:>12.1f}"
                f"{total:>16.1f}{ratio:>8.2f}×{row['hold_mb']:>8.1f}  "
                f"{'max diff ' + format(same, '.1g'):<14}{row['fifo']}"
            )


if __name__ == "__main__":
    main()
