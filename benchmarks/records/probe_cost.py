# measured at 937995c
# A decision record (docs/mindspore-cpu.md, "The underflow probe and its bound"): what chose the
# code as it is; not kept in step with later code.
"""What measuring ``underflow_share`` costs a trial: the probe on every trial vs the bound's rule.

Runs the tiny GPT's trials — the baseline (dp2) and one per other layout (tp2, pp2), as a study
opens, at the baseline's loss scale — and the baseline at the low ``--low-scales`` (where float16
really flushes gradients), each under every variant, interleaved over ``--rounds`` so machine
noise hits them alike:

- ``always``: this tree with ``trial.underflow_probe: always`` — the old rule, the probe after
  every float16 trial (the bound is still computed, so its ``z`` stands beside the probe's ``u``);
- ``auto``: this tree's rule (`autotune.train.step.probe`): the probe only where the bound is above
  `SKIP_BELOW`;
- ``old`` (with ``--old-tree DIR``, a checkout of the program before the bound, e.g.
  ``git worktree add /tmp/autotune-old c6d5d27``): the old program itself, whose steps do not
  count zeros — so the table shows what counting costs the steps.

Each trial is the real program under ``msrun`` with pinned cores, as the runner launches it.
Prints, per trial and variant (medians over rounds): ``steps_s`` (rank 0's measured steps),
``probe_s`` (max over ranks: the underflow measurement's wall time), their ratio; and per round
``u``, ``z``, whether the probe ran and ``loss_last`` (the same in every variant: the bound does
not change the step's numerics).

Then, in this process (calls interleaved in shuffled order, so the machine's noise hits all
alike), what the bound's count costs a step: the model's training step (one dp2 shard, float16)
with and without `autotune.train.step.train_step.zero_counts`, ``--calls`` calls each, and the count alone
on the model's gradients, as one HyperMap of equal + cast + sum (what the step uses) and as a
list of equal + cast + sum calls (the first version) —
the median and the fastest call of each (on a busy machine the fastest shows the cost). And
under ``msrun`` (two workers, this file in worker mode) the sum of two numbers over the ranks,
as the trial program sums its peak memory (a one-op compiled cell per call,
a one-op compiled cell made per call, as the trial program once summed) and as the bound sums its counts (an eager AllReduce,
`autotune.train.parallel.groups.world_sum`), ``--calls``/10 calls each in turn.

    python benchmarks/records/probe_cost.py [MODEL_YAML] [--rounds 2] [--old-tree DIR] [--low-scales 1 0.0625 0.00390625]
                                    [--calls 200] [--no-trials]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from autotune.execution.runner import command, free_port  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.train import PROGRAM_PATH  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402


def launch(config: dict, folder: Path, workers: int, tree: Path) -> dict:
    """Run the trial program of ``tree`` for ``config``; returns what the table needs."""
    folder.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    argv = command(path, workers, folder / "logs", free_port(), bind_cores=True)
    argv = [
        str(tree / Path(PROGRAM_PATH).relative_to(ROOT)) if a == str(PROGRAM_PATH) else a
        for a in argv
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "GLOG_v": "3",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        logs = "".join(p.read_text()[-2000:] for p in (folder / "logs").glob("worker_*.log"))
        raise RuntimeError(f"{folder.name}: exit {done.returncode}\n{done.stderr[-2000:]}{logs}")
    metrics = json.loads((folder / "metrics.json").read_text())
    steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    ranks = [json.loads(p.read_text()) for p in folder.glob("metrics.rank*.json")]
    measured = steps[config["trial"]["measure_after"] :]
    return {
        "steps_s": sum(s["step_time_ms"] for s in measured) / 1000.0,
        "probe_s": max(r["probe_s"] for r in ranks),
        "u": metrics["underflow_share"],
        "z": metrics.get("underflow_bound"),
        "probed": metrics.get("underflow_probed", True),
        "loss_last": metrics["loss_last"],
    }


def count_costs(spec, calls: int) -> list[tuple[str, float]]:
    """``[(what, ms per call)]``: medians of interleaved calls (see the module doc)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops
    from mindspore.common.parameter import ParameterTuple

    from autotune.train import models
    from autotune.train.models import data, weights
    from autotune.train.parallel import tp_layers
    from autotune.train.runtime import session
    from autotune.train.step import train_step as step
    from autotune.train.step.engine import make_optimizer, optimizer_order

    ms.set_context(mode=ms.GRAPH_MODE)
    session.numpy2_workaround(ms)
    model = spec.model.as_config()
    network = models.build_network(model)
    weights.initialize(network, model, models.SINGLE, seed=0)
    step.set_compute_dtype(network, ms.float16)
    params = ParameterTuple(optimizer_order(network.trainable_params()))
    cells = {}
    for counted in (False, True):
        state = step.TrainState(params, 1, 2.0**16, 1000, count_zeros=counted)
        cell = step.TrainStep(
            step.NetWithLoss(network, tp_layers.TokenCrossEntropy()),
            make_optimizer(list(params), 0.0),
            state,
            scaling=True,
            parallel=step.Parallelism(),
            weights=params,
        )
        cell.set_train()
        cell.set_jit_config(ms.JitConfig(jit_level="O1"))  # as the tiny GPT's trials run
        cells[f"training step, zero counts {'on' if counted else 'off'}"] = cell

    class ZeroCounts(nn.Cell):
        def construct(self, grads):
            return step.zero_counts(grads)

    class EqualCastSum(nn.Cell):
        def construct(self, grads):
            return ops.stack([ops.cast(ops.equal(g, 0), ms.int32).sum() for g in grads])

    grads = tuple(
        ms.Tensor(np.random.default_rng(0).standard_normal(p.shape).astype(np.float32))
        for p in params
    )
    x, y = data.TokenChains(
        spec.train.global_batch_size // 2, model["seq_length"], model["vocab_size"]
    )(0)
    x, y = ms.Tensor(x), ms.Tensor(y)
    calls_of = {name: (lambda cell=cell: cell(x, y)[0].asnumpy()) for name, cell in cells.items()}
    calls_of.update(
        {
            f"count alone, {type(cell).__name__}": (lambda cell=cell: cell(grads).asnumpy())
            for cell in (ZeroCounts(), EqualCastSum())
        }
    )
    times = {name: [] for name in calls_of}
    for call in calls_of.values():
        call()  # compile
    order, shuffle = list(calls_of), random.Random(0).shuffle
    for _ in range(calls):
        shuffle(order)  # a fixed order measured the one after the other slower on a busy machine
        for name in order:
            started = time.perf_counter()
            calls_of[name]()
            times[name].append((time.perf_counter() - started) * 1000.0)
    return [(name, statistics.median(t), min(t)) for name, t in times.items()]


def _cell_sum(ms, values):
    """The sum over the ranks as a one-op compiled cell, made (and so compiled) per call."""
    import numpy as np
    from mindspore import nn, ops

    class AllSum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.AllReduce()

        def construct(self, x):
            return self.op(x)

    return AllSum()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()


def allreduce_worker(out: Path, calls: int) -> None:
    """One msrun rank: time both ways of summing over the ranks; rank 0 writes ``out``."""
    import mindspore as ms

    from autotune.train.parallel import groups as parallel
    from autotune.train.runtime import device, session

    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler only serves the cluster
        device.serve_cluster()
        return
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    session.numpy2_workaround(ms)
    ms.communication.init()
    ways = {
        "compiled one-op cell, new each call": lambda: _cell_sum(ms, [1.0, 2.0]),
        "eager AllReduce (parallel.world_sum)": lambda: parallel.world_sum([1.0, 2.0]),
    }
    times = {name: [] for name in ways}
    for _ in range(calls):
        for name, way in ways.items():
            started = time.perf_counter()
            assert list(way()) == [2.0, 4.0]
            times[name].append((time.perf_counter() - started) * 1000.0)
    if ms.communication.get_rank() == 0:
        out.write_text(
            json.dumps([(name, statistics.median(t), min(t)) for name, t in times.items()])
        )


def allreduce_costs(calls: int) -> list[tuple[str, float]]:
    """``[(what, ms per call)]`` from two msrun workers (see the module doc)."""
    work = Path(tempfile.mkdtemp(prefix="autotune-probe-ar-"))
    try:
        argv = command(work / "x", 2, work / "logs", free_port(), bind_cores=True)
        argv = argv[:-2] + [
            str(Path(__file__).resolve()),
            "worker",
            str(work / "out.json"),
            str(calls),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GLOG_v": "3",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        subprocess.run(argv, cwd=work, env=env, capture_output=True, timeout=600, check=True)
        return [tuple(row) for row in json.loads((work / "out.json").read_text())]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    if sys.argv[1:2] == ["worker"]:  # under msrun: worker OUT CALLS
        allreduce_worker(Path(sys.argv[2]), int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_yaml", nargs="?", default=str(ROOT / "examples" / "tiny_gpt.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--old-tree", type=Path, help="a checkout of the program before the bound")
    parser.add_argument("--low-scales", type=float, nargs="*", default=[1.0, 2.0**-4, 2.0**-8])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--no-trials", action="store_true", help="only the in-process count costs")
    args = parser.parse_args()
    spec = load_spec(args.model_yaml)
    space = build_space(spec)
    base = space.baseline()
    trials = {
        f"dp{c.dp} tp{c.tp} pp{c.pp} @{c.loss_scale:g}": c
        for c in [base, *space.layout_openers(spec)]
    }
    trials.update(
        {
            f"dp{base.dp} tp{base.tp} pp{base.pp} @{s:g}": base.replace(loss_scale=s)
            for s in args.low_scales
        }
    )
    variants = {"always": (ROOT, "always"), "auto": (ROOT, "auto")}
    if args.old_tree:
        variants["old"] = (args.old_tree.resolve(), "always")
    if not args.no_trials:
        trial_table(spec, args, trials, variants)
    table = Table(
        title="what the bound costs: summing over two msrun ranks, then the zero count in one "
        f"process ({args.calls} rounds of the calls in shuffled order)"
    )
    table.add_column("what")
    table.add_column("ms per call, median", justify="right")
    table.add_column("fastest", justify="right")
    for name, median, fastest in allreduce_costs(max(3, args.calls // 10)) + count_costs(
        spec, args.calls
    ):
        table.add_row(name, f"{median:.2f}", f"{fastest:.2f}")
    Console(width=160).print(table)
    return 0


def trial_table(spec, args, trials: dict, variants: dict) -> None:
    """Run every trial under every variant, ``args.rounds`` interleaved rounds; print the table."""
    work = Path(tempfile.mkdtemp(prefix="autotune-probe-"))
    runs = {(t, v): [] for t in trials for v in variants}
    try:
        for round_ in range(args.rounds):
            for t, candidate in trials.items():
                for v, (tree, mode) in variants.items():
                    folder = work / f"{round_}-{len(runs)}-{v}-{t.replace(' ', '_')}"
                    config = trial_config(
                        spec,
                        candidate,
                        study="probe",
                        number=0,
                        out_dir=folder,
                        steps=spec.trial.steps,
                        measure_after=spec.trial.measure_after,
                    )
                    config["trial"]["underflow_probe"] = mode
                    r = launch(config, folder, candidate.devices, tree)
                    runs[t, v].append(r)
                    print(
                        f"round {round_ + 1} {t} {v}: steps {r['steps_s']:.2f} s, probe {r['probe_s']:.2f} s, "
                        f"u {r['u']:.3g}, z {r['z'] if r['z'] is None else format(r['z'], '.3g')}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    table = Table(
        title=f"{Path(args.model_yaml).name}: {spec.trial.steps} steps ({spec.trial.measure_after} "
        f"unmeasured), {args.rounds} interleaved rounds, medians"
    )
    for column in (
        "trial",
        "variant",
        "steps_s",
        "probe_s",
        "probe / steps",
        "u",
        "z (bound)",
        "probe ran",
        "loss_last",
    ):
        table.add_column(column, justify="left" if column in ("trial", "variant") else "right")
    for (t, v), rs in runs.items():
        steps, probe = (statistics.median(r[k] for r in rs) for k in ("steps_s", "probe_s"))
        zs = [r["z"] for r in rs if r["z"] is not None]
        table.add_row(
            t,
            v,
            f"{steps:.2f}",
            f"{probe:.2f}",
            f"{probe / steps:.0%}",
            " ".join(f"{r['u']:.3g}" for r in rs),
            " ".join(f"{z:.3g}" for z in zs) or "—",
            " ".join("yes" if r["probed"] else "no" for r in rs),
            " ".join(f"{r['loss_last']:.6f}" for r in rs),
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
