"""What autotune adds to a trial's time: bare MindSpore run vs runner vs full search dispatch.

Runs the same candidates (the tiny GPT model, fusion_mb 1/16/256, other knobs at their
baseline) three ways, side by side in one process so machine noise hits all alike:

- bare:       the trial program launched by hand (``msrun`` with 2 workers), as a user would;
- runner:     ``autotune.execution.runner.run_trial`` (config.json, supervision, outcome classification);
- dispatched: ``autotune search`` through an embedded Ray and SQLite storage (ask, feasibility,
              submit, Ray task, tell), timed per trial from submit to result, plus the one-time
              Ray start-up and shut-down.

    python benchmarks/overhead.py [--rounds 2] [--steps 30]

``--driver`` measures the driver instead — its own time per trial, split into its parts (ask,
prior, feasibility, submit, tell/record, sync), and the SQL it issues — on two studies without
MindSpore: the tiny GPT replayed (backend ``replay``, a table of every feasible tiny GPT
candidate, :func:`replay_table`: the same proposer, prior, recorder and storage as the real
study) and the 64-device LLaMA-7B ``simulate`` example. ``--before REV`` runs the same studies
with the ``autotune`` package of git revision REV too, each study in a fresh process, the two
interleaved round by round, so the ratio is read side by side on a noisy machine:

    python benchmarks/overhead.py --driver --before REV [--rounds 3] [--samplers auto,tpe]

``--scale`` runs a 10,000-trial study on a 20,715-candidate ``simulate`` space and times the
driver per run at its start and its end, then ``show``, ``report``, ``trials_frame`` and Ctrl-C
on it (`benchmarks/overhead_scale.py`):

    python benchmarks/overhead.py --scale [--before REV] [--samplers auto,tpe] [--trials 10000]

``--tpe-cost`` times Optuna's TPE and the bounded one per ask against the study's length.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import overhead_scale  # noqa: E402

FUSION = [1, 16, 256]


def _config(spec, candidate, folder: Path) -> dict:
    from autotune.train.config import trial_config

    return trial_config(
        spec,
        candidate,
        study="overhead",
        number=0,
        out_dir=folder,
        steps=spec.trial.steps,
        measure_after=spec.trial.measure_after,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="default: 2, --driver 3")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--driver", action="store_true", help="the driver's time per trial")
    parser.add_argument("--before", help="--driver: also the autotune of this git revision")
    parser.add_argument("--samplers", default="auto", help="--driver: comma-separated")
    parser.add_argument("--storage", help="--driver: an RDB URL (default: a SQLite file each)")
    parser.add_argument("--driver-worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--scale", action="store_true", help="a 10,000-trial study's driver")
    parser.add_argument("--trials", type=int, default=10_000, help="--scale: trials per study")
    parser.add_argument("--timeout", type=int, default=1500, help="--scale: seconds per study")
    parser.add_argument("--scale-worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--tpe-cost", action="store_true", help="TPE's ms per ask against n")
    args = parser.parse_args()
    if args.tpe_cost:
        return overhead_scale.tpe_cost()
    if args.driver_worker:
        return driver_worker(*args.driver_worker)
    if args.scale_worker:
        return overhead_scale.scale_worker(*args.scale_worker)
    if args.scale:
        args.samplers = args.samplers if args.samplers != "auto" else "auto,tpe"
        work = Path(tempfile.mkdtemp(prefix="autotune-scale-"))
        return overhead_scale.scale_main(args, _tree_of, work)
    if args.driver:
        args.rounds = args.rounds or 3
        return driver_main(args)
    trial_main(args.rounds or 2, args.steps)


def trial_main(rounds: int, steps: int) -> None:
    """Bare msrun vs runner vs Ray dispatch of the same candidates (see the module doc)."""
    from autotune.execution.runner import command, environment, free_port, run_trial
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.storage.schema import knobs_of
    from autotune.study.progress import Progress
    from autotune.study.run import run_study

    fixed = {
        "fusion_mb": FUSION,
        "grad_accum": 1,
        "loss_scale": 1024,
        "warmup_steps": 100,
        "jit_level": "O1",
        "recompute": "none",
    }
    spec = load_spec(
        ROOT / "examples" / "tiny_gpt.yaml",
        {"trial.steps": steps, "search.sampler": "grid", "search.objectives": ["goodput"]},
    )
    space = build_space(spec, fixed)
    candidates = list(space.candidates())
    work = Path(tempfile.mkdtemp(prefix="autotune-overhead-"))
    bare, runner, dispatched, startup = {}, {}, {}, []
    for round_ in range(rounds):
        for c in candidates:
            folder = work / f"bare{round_}-{c.fusion_mb}"
            folder.mkdir()
            config = _config(spec, c, folder)
            (folder / "config.json").write_text(json.dumps(config))
            t = time.monotonic()
            subprocess.run(
                command(
                    folder / "config.json", c.devices, folder / "logs", free_port(), bind_cores=True
                ),
                env=environment(),
                cwd=folder,
                check=True,
                capture_output=True,
            )
            bare.setdefault(c.fusion_mb, []).append(time.monotonic() - t)

            folder = work / f"runner{round_}-{c.fusion_mb}"
            result = run_trial(_config(spec, c, folder), folder, 600, None, c.devices)
            assert result.outcome == "ok", result.detail
            runner.setdefault(c.fusion_mb, []).append(result.run_s)

        t = time.monotonic()
        study = run_study(
            spec,
            space,
            storage=f"sqlite:///{work}/s{round_}.db",
            study_name="overhead",
            n_trials=len(candidates),
            resume=False,
            artifacts=work / f"search{round_}",
            progress=Progress(Console(quiet=True)),
        )
        total = time.monotonic() - t
        trials = [t for t in study.trials if "wall_s" in t.user_attrs]
        for t in trials:
            dispatched.setdefault(knobs_of(t)["fusion_mb"], []).append(
                (t.user_attrs["wall_s"], t.user_attrs["driver_s"])
            )
        startup.append(total - sum(t.user_attrs["wall_s"] for t in trials))

    print(f"\n{steps} steps per trial, dp = 2 on CPU, median of {rounds} rounds (seconds)\n")
    print(
        f"{'fusion_mb':>9} | {'bare':>6} | {'runner':>6} | {'dispatched':>10} | "
        f"{'driver':>6} | {'overhead vs bare':>16}"
    )
    print("-" * 70)
    shares = []
    for mb in FUSION:
        b, r = statistics.median(bare[mb]), statistics.median(runner[mb])
        d = statistics.median(w for w, _ in dispatched[mb])
        drv = statistics.median(x for _, x in dispatched[mb])
        shares.append((d + drv - b) / b)
        print(f"{mb:>9} | {b:6.2f} | {r:6.2f} | {d:10.2f} | {drv:6.3f} | {shares[-1]:+15.1%}")
    print(
        f"\nper-trial overhead of driver + Ray + launch: median {statistics.median(shares):+.1%} "
        f"of a bare run"
    )
    print(
        f"one-time Ray start-up + shut-down + study setup per search: "
        f"{statistics.median(startup):.1f} s"
    )
    shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# --driver: the driver's own time per trial, no MindSpore

# The LLaMA example's space widened until the prior holds its limit (PRIOR_LIMIT: every fusion
# threshold from 1 to 512 MB, more micro-batch and accumulation counts, pp 8), replayed from
# a table of every layout × recompute × parallel optimizer (:func:`wide_table`, any fusion).
WIDE = {
    "cluster.backend": "replay",
    "search.space.fusion_mb": {"low": 1, "high": 512},
    "search.space.micro_batches": [4, 8, 16, 32, 64],
    "search.space.grad_accum": [1, 2, 4, 8, 16],
    "search.space.pp": [1, 2, 4, 8],
    "search.space.jit_level": "O1",
}
DRIVER_STUDIES = {  # name → (model.yaml, overrides); replayed ones read a table
    "tiny-gpt": ("tiny_gpt.yaml", {"cluster.backend": "replay", "cluster.device": "cpu"}),
    "llama7b-64": ("llama7b_64dev_simulate.yaml", {}),
    "llama7b-64-wide": ("llama7b_64dev_simulate.yaml", WIDE),
}
# part → the functions whose own time (callees that are parts themselves excluded) it is
PARTS = {
    "ask": (
        "autotune.search.proposer:Proposer.propose",
        "autotune.search.proposer:Proposer._ask",
        "autotune.search.proposer:Proposer._from_prior",
        "autotune.search.proposer:Proposer._queued",
    ),
    "prior": ("autotune.search.prior:Prior.next",),
    "feasibility": ("autotune.search.proposer:Proposer.verdict",),
    "submit": ("autotune.study.loop:Loop._submit",),
    "tell/record": ("autotune.study.loop:Loop._finished", "autotune.study.loop:Loop._settle"),
    "sync": ("autotune.study.loop:Loop._sync", "autotune.storage.counting:wanted"),
}
LOOPS = ("autotune.study.loop:Loop.run", "autotune.study.loop:Loop.run_confirm")
ROWS = (*PARTS, "other", "total", "cpu")


def replay_table(path: Path) -> Path:
    """The tiny GPT's candidates as a replay table: every feasible one, two runs each (so the
    study ends with its confirm phase, as the real one does), goodput the cost model's CPU
    estimate × a seeded ±30 %, a final loss that prefers a mid loss scale and warmup."""
    import csv
    import math
    import random

    from autotune import costmodel
    from autotune.spec.knobs import KNOB_NAMES
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(ROOT / "examples" / "tiny_gpt.yaml", {"cluster.device": "cpu"})
    rng = random.Random(0)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb", "loss_last", "run_s"]
        )
        for c in build_space(spec).candidates():
            e = costmodel.estimate(spec, c)
            if not e.feasible:
                continue
            loss = 3 + abs(math.log2(c.loss_scale) - 14) / 20 + abs(c.warmup_steps - 200) / 1000
            for _ in range(2):
                goodput = e.samples_per_s * rng.uniform(0.7, 1.3)
                writer.writerow(
                    [
                        *(getattr(c, k) for k in KNOB_NAMES),
                        goodput,
                        1000 * spec.train.global_batch_size / goodput,
                        e.memory_gb_per_device * 1024,
                        loss + rng.uniform(0, 0.1),
                        30,
                    ]
                )
    return path


def wide_table(path: Path) -> Path:
    """The widened LLaMA space (:data:`WIDE`) as a replay table without a fusion column (a
    row stands for every threshold): the cost model's step time with tp's all-reduces 1.6×
    and the pipeline 0.6× what it estimates, memory 1.1×, seeded ±10 % per row."""
    import csv
    import random
    from dataclasses import replace

    from autotune import costmodel
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    # the space as the simulate example prices it (the replay study reads the table made here)
    spec = load_spec(
        ROOT / "examples" / "llama7b_64dev_simulate.yaml",
        {k: v for k, v in WIDE.items() if k != "cluster.backend"},
    )
    space = build_space(spec)
    space = replace(space, domains={**space.domains, "fusion_mb": (64,)})
    rng, keys = (
        random.Random(0),
        ("dp", "tp", "pp", "micro_batches", "grad_accum", "recompute", "parallel_optimizer"),
    )
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, "goodput", "step_time_ms", "peak_memory_mb"])
        for c in space.candidates():
            e = costmodel.estimate(spec, c)
            if not e.breakdown:
                continue
            parts = e.breakdown["time_s"]
            seconds = (
                e.step_time_s
                + 0.6 * parts["tp_comm"]
                - (
                    0.4 * (parts["compute"] + parts["recompute"] + parts["bubble"])
                    if c.pp > 1
                    else 0.0
                )
            ) * rng.uniform(0.9, 1.1)
            writer.writerow(
                [
                    *(getattr(c, k) for k in keys),
                    spec.train.global_batch_size / seconds,
                    seconds * 1000,
                    e.memory_gb_per_device * 1.1 * 1024,
                ]
            )
    return path


def _resolve(target: str):
    """(owner, attribute name) of ``module:Class.function`` or ``module:function``."""
    import importlib

    module, _, dotted = target.partition(":")
    owner = importlib.import_module(module)
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _instrument(parts: dict, loops: list, stack: list) -> None:
    """Wrap every function of :data:`PARTS` (own time into ``parts``) and :data:`LOOPS`
    ((wall, CPU) seconds into ``loops``); functions a tree does not have are skipped."""
    import functools

    def wrap(target, add):
        try:
            owner, name = _resolve(target)
            original = getattr(owner, name)
        except (ImportError, AttributeError):
            return

        @functools.wraps(original)
        def timed(*args, **kwargs):
            stack.append(0.0)
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                inner = stack.pop()
                if stack:
                    stack[-1] += elapsed
                add(elapsed, elapsed - inner, time.process_time() - cpu)

        setattr(owner, name, timed)

    for part, targets in PARTS.items():
        for target in targets:
            wrap(
                target,
                lambda total, own, cpu, part=part: parts.__setitem__(part, parts[part] + own),
            )
    for target in LOOPS:
        wrap(target, lambda total, own, cpu: loops.append((total, cpu)))


def driver_worker(tree: str, which: str, sampler: str, table: str, storage: str) -> None:
    """One study with the ``autotune`` of ``tree``; prints its per-trial parts as JSON."""
    sys.path.insert(0, tree)
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.study.progress import Progress
    from autotune.study.run import run_study

    assert Path(sys.modules["autotune"].__file__).is_relative_to(tree)
    counts, wrote = {"commits": 0, "statements": 0}, set()

    def statement(connection, cursor, sql, *rest):
        counts["statements"] += 1
        if sql.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            wrote.add(id(connection))

    def commit(connection):  # a transaction that wrote (a read's commit costs nothing)
        if id(connection) in wrote:
            wrote.discard(id(connection))
            counts["commits"] += 1

    event.listen(Engine, "before_cursor_execute", statement)
    event.listen(Engine, "commit", commit)
    parts, loops, asked = dict.fromkeys(PARTS, 0.0), [], []
    _instrument(parts, loops, [])
    owner, name = _resolve("autotune.search.proposer:Proposer._ask")
    counted_ask = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: asked.append(1) or counted_ask(*a, **k))
    path, overrides = DRIVER_STUDIES[which]
    overrides = {**overrides, "search.sampler": sampler}
    if "replay" in overrides.values():
        overrides["cluster.replay"] = table
    spec = load_spec(ROOT / "examples" / path, overrides)
    progress = Progress(Console(quiet=True))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as artifacts:
        run_study(
            spec,
            build_space(spec),
            storage=storage,
            study_name=f"{which}-{time.time_ns()}",
            n_trials=spec.search.n_trials,
            resume=False,
            artifacts=Path(artifacts),
            progress=progress,
        )
    wall = time.perf_counter() - started
    n = len(asked)
    out = {part: seconds / n * 1000 for part, seconds in parts.items()}
    out["total"] = sum(wall for wall, _ in loops) / n * 1000
    out["cpu"] = sum(cpu for _, cpu in loops) / n * 1000
    out["other"] = out["total"] - sum(out[p] for p in PARTS)
    printed = (
        progress.driver_ms_per_trial()
        if hasattr(progress, "driver_ms_per_trial")
        else progress.driver_seconds / max(1, progress._done_here) * 1000
    )  # older trees
    out.update(
        trials=n,
        setup_s=wall - sum(w for w, _ in loops),
        printed=printed,
        commits=counts["commits"] / n,
        statements=counts["statements"] / n,
    )
    print(json.dumps(out))


def _tree_of(rev: str, work: Path) -> Path:
    """The ``autotune`` package (and the default space it reads) of git revision ``rev``,
    unpacked under ``work``."""
    tree = work / f"tree-{rev}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "autotune", "search_spaces"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def driver_main(args) -> None:
    """Both studies under each tree, interleaved round by round; prints the table."""
    work = Path(tempfile.mkdtemp(prefix="autotune-driver-"))
    tables = {
        "tiny-gpt": replay_table(work / "tiny-gpt.csv"),
        "llama7b-64-wide": wide_table(work / "llama7b-wide.csv"),
    }
    trees = {"after": ROOT}
    if args.before:
        trees = {"before": _tree_of(args.before, work), **trees}
    runs: dict = {}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for which in DRIVER_STUDIES:
            for sampler in args.samplers.split(","):
                for label, tree in order:
                    storage = args.storage or f"sqlite:///{work}/{label}-{round_}-{which}.db"
                    done = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--driver-worker",
                            str(tree),
                            which,
                            sampler,
                            str(tables.get(which, "")),
                            storage,
                        ],
                        capture_output=True,
                        text=True,
                    )
                    if done.returncode:
                        sys.exit(f"the {label} tree failed on {which}:\n{done.stderr[-3000:]}")
                    runs.setdefault((which, sampler, label), []).append(
                        json.loads(done.stdout.strip().splitlines()[-1])
                    )
    labels = list(trees)
    print(
        f"\ndriver time per trial (ms), median of {args.rounds} rounds run interleaved"
        + (f"; before = {args.before}, after = this tree" if args.before else "")
        + "\n"
    )
    header = f"{'study':<26} {'part':<13}" + "".join(f"{label:>9}" for label in labels)
    print(header + ("  after/before" if args.before else ""))
    print("-" * (len(header) + (14 if args.before else 0)))
    for which in DRIVER_STUDIES:
        for sampler in args.samplers.split(","):
            kind = "replay" if "replay" in DRIVER_STUDIES[which][1].values() else "simulate"
            title = f"{which} ({kind}, {sampler})"
            rows = [(r, "{:9.1f}") for r in ROWS] + [
                ("printed", "{:9.1f}"),
                ("commits", "{:9.1f}"),
                ("statements", "{:9.1f}"),
                ("trials", "{:9.0f}"),
                ("setup_s", "{:9.2f}"),
            ]
            for row, fmt in rows:
                values = [
                    statistics.median(r[row] for r in runs[(which, sampler, label)])
                    for label in labels
                ]
                line = f"{title:<26} {row:<13}" + "".join(fmt.format(v) for v in values)
                if args.before and values[0]:
                    line += f"  {values[1] / values[0]:12.2f}"
                print(line)
                title = ""
            print()
    print(
        "parts: ask = propose + Optuna's ask + sampling + its storage writes; prior = the\n"
        "cost model's ranking; feasibility = constraints + estimate; tell/record = storing the\n"
        "result; sync = the loop's read of the study before each ask; other = the rest of the\n"
        "loop (executor waits); total = the loop's wall time; cpu = its CPU time (less hit by a\n"
        "busy machine, blind to waiting for the disk); printed = the study's own 'driver\n"
        "overhead' line; commits (transactions that wrote) and statements: SQL per trial;\n"
        "setup_s: one-time (prior, study creation)."
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
