"""``overhead.py --scale``: the driver over a 10,000-trial study, and what reads it afterwards.

A study of 10,000 trials on a 20,715-candidate ``simulate`` space: the 64-device LLaMA-7B
example on H200s (141 GB, so 12,840 candidates fit), its space widened to micro-batches 4–64,
accumulation 1–16, pp up to 8 and 46 fusion thresholds (11–506 MB, :data:`SPACE`). A simulated
trial takes no time, so what the study takes is the driver's own time: per counted trial (a
run, `autotune.storage.counting`) over the runs 1–1,000 and over the last 1,000 it reached, and
how many trials it asked per run (repeats answered from storage and rejections included).

Then, on the study this tree made (the ``before`` tree reads the same file: the same data):
``autotune show``, ``autotune report`` and ``autotune.trials_frame`` (each in a fresh process;
the call's own seconds, and the process's), and Ctrl-C: the study resumed for 300 more runs and
sent SIGINT at its 20th progress line — the seconds until the process exited, its exit code, and
whether ``--resume`` then ran exactly the runs missing, each candidate once.

    python benchmarks/overhead.py --scale [--before REV] [--samplers auto,tpe] [--trials 10000]
                                  [--timeout 1500]

With ``--before REV`` the two trees' studies run side by side (two processes at once, so they
meet the same machine); a study that has not reached its trials after ``--timeout`` seconds is
stopped there (SIGINT) and reported as far as it got.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llama7b_64dev_simulate.yaml"
SPACE = {  # 20,715 candidates, 12,840 of them under the memory limit
    "cluster.device": "h200",
    "search.space.micro_batches": [4, 8, 16, 32, 64],
    "search.space.grad_accum": [1, 2, 4, 8, 16],
    "search.space.pp": [1, 2, 4, 8],
    "search.space.fusion_mb": {"low": 11, "high": 506, "step": 11},
}
WINDOW = 1000  # runs per window of the per-trial figure
MORE = 300  # runs the Ctrl-C resume asks for


def scale_worker(tree: str, sampler: str, n: str, storage: str, timeout: str) -> None:
    """One study with the ``autotune`` of ``tree``; prints its milestones as JSON."""
    sys.path.insert(0, tree)
    from rich.console import Console

    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.study.progress import Progress
    from autotune.study.run import run_study

    assert Path(sys.modules["autotune"].__file__).is_relative_to(tree)
    stamps = []  # (runs, seconds since start, driver seconds, trials asked) per 100 runs

    class Timed(Progress):
        runs = 0

        def trial_done(self, number, outcome, *args, **kwargs):
            super().trial_done(number, outcome, *args, **kwargs)
            if outcome != "infeasible" and kwargs.get("again_of") is None:
                self.runs += 1
                if self.runs % 100 == 0 or self.runs == 1:
                    stamps.append(
                        (
                            self.runs,
                            time.perf_counter() - started,
                            self.driver_seconds,
                            asked(),
                            time.process_time(),
                        )
                    )

    def asked() -> int:
        return getattr(progress, "driver_trials", 0)

    def stop(*_):
        raise KeyboardInterrupt

    spec = load_spec(EXAMPLE, {**SPACE, "search.sampler": sampler, "search.n_trials": int(n)})
    progress = Timed(Console(quiet=True))
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(int(timeout))
    started, stopped = time.perf_counter(), False
    try:
        run_study(
            spec,
            build_space(spec),
            storage=storage,
            study_name="scale",
            n_trials=int(n),
            resume=False,
            artifacts=Path(tempfile.mkdtemp()),
            progress=progress,
            confirm_top=0,
        )
    except KeyboardInterrupt:
        stopped = True
    signal.alarm(0)
    import optuna

    trials = optuna.load_study(study_name="scale", storage=storage).get_trials(deepcopy=False)
    print(
        json.dumps(
            {
                "stamps": stamps,
                "timed_out": stopped,
                "wall_s": time.perf_counter() - started,
                "trials": len(trials),
                "repeats": sum("repeat_of" in t.user_attrs for t in trials),
                "rejected": sum(
                    t.user_attrs.get("outcome") == "infeasible" and "repeat_of" not in t.user_attrs
                    for t in trials
                ),
                "untried": sum(t.user_attrs.get("proposed_by") == "untried" for t in trials),
            }
        )
    )


def _window(stamps: list, last: bool) -> tuple:
    """(first run, last run, driver ms per run, trials asked per run, process CPU ms per run)
    over the first :data:`WINDOW` runs, or the last ``WINDOW`` reached."""
    if len(stamps) < 2:
        return (0, 0, float("nan"), float("nan"), float("nan"))
    by_runs = {s[0]: s for s in stamps}
    top = max(by_runs)
    low, high = (max(1, top - WINDOW), top) if last else (1, min(WINDOW, top))
    low = min(by_runs, key=lambda r: abs(r - low))
    a, b = by_runs[low], by_runs[high]
    if b[0] == a[0]:
        return (a[0], b[0], float("nan"), float("nan"), float("nan"))
    runs = b[0] - a[0]
    return (
        a[0],
        b[0],
        (b[2] - a[2]) / runs * 1000,
        (b[3] - a[3]) / runs,
        (b[4] - a[4]) / runs * 1000,
    )


def _timed(tree: Path, code: str, env: dict) -> tuple[float, float]:
    """(the call's seconds as the code prints them, the process's seconds)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree
    )
    if done.returncode:
        sys.exit(f"{tree}: {code[:60]}… failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1]), time.perf_counter() - started


def _readers(tree: Path, storage: str, work: Path) -> dict:
    """show, report and trials_frame of study ``scale`` with the autotune of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = work / f"report-{time.time_ns()}"
    cli = (
        "import time, contextlib, io, sys\n"
        "from autotune.cli import main\n"
        "t = time.perf_counter()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = main({args!r})\n"
        "assert code == 0, code\n"
        "print(time.perf_counter() - t)\n"
    )
    return {
        "show": _timed(tree, cli.format(args=["show", "scale", "--storage", storage]), env),
        "report": _timed(
            tree,
            cli.format(args=["report", "scale", "--storage", storage, "--out", str(out)]),
            env,
        ),
        "trials_frame": _timed(
            tree,
            "import time, autotune\nt = time.perf_counter()\n"
            f"autotune.trials_frame('scale', {storage!r})\nprint(time.perf_counter() - t)\n",
            env,
        ),
    }


def _ctrl_c(tree: Path, sampler: str, storage: str, runs: int) -> dict:
    """Resume study ``scale`` for :data:`MORE` runs, SIGINT it at its 20th progress line: the
    seconds to exit and its code; then ``--resume`` to the end: whether exactly the missing
    runs ran, each candidate once."""
    import yaml

    env = {**os.environ, "PYTHONPATH": str(tree)}
    yaml_file = Path(tempfile.mkdtemp()) / "model.yaml"
    data = yaml.safe_load(EXAMPLE.read_text())  # the worker's spec, as a file
    for key, value in SPACE.items():
        where = data
        *path, last = key.split(".")
        for part in path:
            where = where.setdefault(part, {})
        where[last] = value
    data["study"], data["search"]["sampler"] = "scale", sampler
    yaml_file.write_text(yaml.safe_dump(data))
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        str(yaml_file),
        "--storage",
        storage,
        "--resume",
        "--no-confirm",
        "--trials",
        str(runs + MORE),
    ]
    search = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    lines = 0
    for line in search.stdout:
        lines += line.startswith("[")
        if lines == 20:
            break
    sent = time.perf_counter()
    search.send_signal(signal.SIGINT)
    try:
        search.communicate(timeout=60)
        exit_s = time.perf_counter() - sent
    except subprocess.TimeoutExpired:
        search.kill()
        search.communicate()
        exit_s = float("inf")
    finished = subprocess.run(command, capture_output=True, text=True, env=env)
    counted = subprocess.run(
        [
            sys.executable,
            "-c",
            "import collections, optuna\n"
            "from autotune.storage import counting, schema\n"
            f"ts = optuna.load_study(study_name='scale', storage={storage!r}).trials\n"
            "runs = collections.Counter(tuple(schema.knobs_of(t).items()) for t in ts "
            "if counting.ran(t))\n"
            "print(sum(map(counting.counted, ts)), max(runs.values()), "
            "sum(t.state.name in ('RUNNING', 'WAITING') for t in ts))\n",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    total, most, left = counted.stdout.split() if counted.returncode == 0 else ("?", "?", "?")
    return {
        "exit_s": exit_s,
        "code": search.returncode,
        "resumed": finished.returncode,
        "runs": total,
        "wanted": runs + MORE,
        "most_runs_of_one": most,
        "left_running": left,
    }


def scale_main(args, tree_of, work: Path) -> None:
    """Each sampler's study under each tree, side by side; prints the table."""
    # a process started in the background of a script inherits SIGINT ignored, and so would
    # the searches it sends Ctrl-C: they get Python's handler (SIG_DFL across their exec)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    trees = {"after": ROOT}
    if args.before:
        trees = {"before": tree_of(args.before, work), **trees}
    results: dict = {}
    for sampler in args.samplers.split(","):
        running = {}
        for label, tree in trees.items():
            storage = f"sqlite:///{work}/{label}-{sampler}.db"
            running[label] = (
                storage,
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "benchmarks" / "overhead.py"),
                        "--scale-worker",
                        str(tree),
                        sampler,
                        str(args.trials),
                        storage,
                        str(args.timeout),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        for label, (_, process) in running.items():
            out, err = process.communicate()
            if process.returncode:
                sys.exit(f"the {label} tree failed ({sampler}):\n{err[-3000:]}")
            results[(sampler, label)] = json.loads(out.strip().splitlines()[-1])
        after_db = running["after"][0]
        for label, tree in trees.items():  # every tree reads the same study: this tree's
            results[(sampler, label)]["readers"] = _readers(tree, after_db, work)
        for label, tree in trees.items():
            reached = results[(sampler, label)]["stamps"][-1][0]
            results[(sampler, label)]["ctrl_c"] = _ctrl_c(tree, sampler, running[label][0], reached)
        _print(sampler, trees, results)
    (work / "scale.json").write_text(json.dumps({f"{s}/{t}": r for (s, t), r in results.items()}))
    print(f"\nraw results: {work / 'scale.json'}")


def _print(sampler: str, trees: dict, results: dict) -> None:
    labels = list(trees)
    print(f"\n{sampler}: {', '.join(labels)} side by side (ms, s as labelled)")
    rows = []
    for label in labels:
        r = results[(sampler, label)]
        first, last = _window(r["stamps"], False), _window(r["stamps"], True)
        rows.append(
            {
                "runs reached": f"{r['stamps'][-1][0]}"
                + (" (timed out)" if r["timed_out"] else ""),
                "study wall s": f"{r['wall_s']:.0f}",
                "trials asked": f"{r['trials']}",
                "  of them repeats": f"{r['repeats']}",
                "  rejected": f"{r['rejected']}",
                "  untried": f"{r['untried']}",
                "driver ms/run, first runs": f"{first[2]:.1f} ({first[0]}-{first[1]})",
                "  CPU ms/run": f"{first[4]:.1f}",
                "  trials asked/run": f"{first[3]:.2f}",
                "driver ms/run, last runs": f"{last[2]:.1f} ({last[0]}-{last[1]})",
                "  CPU ms/run ": f"{last[4]:.1f}",
                "  trials asked/run ": f"{last[3]:.2f}",
                **{
                    f"{name} s (process s)": f"{call:.2f} ({whole:.1f})"
                    for name, (call, whole) in r["readers"].items()
                },
                "Ctrl-C: s to exit (code)": f"{r['ctrl_c']['exit_s']:.2f} ({r['ctrl_c']['code']})",
                "then --resume: runs / wanted": f"{r['ctrl_c']['runs']} / {r['ctrl_c']['wanted']}",
                "  most runs of one candidate": f"{r['ctrl_c']['most_runs_of_one']}",
                "  left running or waiting": f"{r['ctrl_c']['left_running']}",
            }
        )
    print(f"  {'':<36}" + "".join(f"{label:>26}" for label in labels))
    for key in rows[0]:
        print(f"  {key:<36}" + "".join(f"{row[key]:>26}" for row in rows))


def tpe_cost(sizes=(250, 500, 1000, 2000, 5000, 10000), asks: int = 20) -> None:
    """Optuna's TPE against the bounded one (`autotune.search.bounded_tpe`) on :data:`SPACE`: ms
    per ask of a study holding n finished trials (in memory: the sampler's own time, no
    storage), 60 % complete with a random value and 40 % pruned."""
    import random

    import optuna

    from autotune.search.bounded_tpe import BoundedTPESampler
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(EXAMPLE, SPACE)
    space = build_space(spec)
    distributions = space.distributions()
    candidates, rng = list(space.candidates()), random.Random(0)
    kw = {"seed": 0, "multivariate": True, "constant_liar": True, "n_startup_trials": 10}
    print(f"\nTPE, ms per ask of a study of n finished trials ({asks} asks, in memory)\n")
    print(f"{'n':>7} {'Optuna TPE':>11} {'bounded':>9}")
    for n in sizes:
        trials = []
        for c in rng.sample(candidates, n):
            params = space.params_of(c)
            ok = rng.random() < 0.6
            trials.append(
                optuna.trial.create_trial(
                    params=params,
                    distributions={k: distributions[k] for k in params},
                    value=rng.random() if ok else None,
                    state=optuna.trial.TrialState.COMPLETE
                    if ok
                    else optuna.trial.TrialState.PRUNED,
                )
            )
        row = []
        for sampler in (optuna.samplers.TPESampler(**kw), BoundedTPESampler(**kw)):
            study = optuna.create_study(direction="maximize", sampler=sampler)
            study.add_trials(trials)
            started = time.perf_counter()
            for _ in range(asks):
                trial = study.ask()
                space.sample(trial)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            row.append((time.perf_counter() - started) / asks * 1000)
        print(f"{n:>7} {row[0]:>11.1f} {row[1]:>9.1f}")
