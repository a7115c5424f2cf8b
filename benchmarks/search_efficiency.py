"""How fast random search, TPE and ``auto`` find a near-optimal candidate against truths that are
not the prior, scored by noise-free value (run by hand; prints tables).

    .venv/bin/python benchmarks/search_efficiency.py [--structures report|tune] [--seeds 20]
        [--families judged|all|mild|time|memory|engine|layout|NAME...] [--runs 15] [--jobs 2]
        [--samplers random tpe auto pre26 before auto:4 ...] [--pre26 CHECKOUT]
        [--before CHECKOUT] [--slots 1]
        [--real examples/quickstart_cpu.csv examples/quickstart.yaml]

The method — the families and the two splits of truth structures (``--structures``: constants
are chosen on ``tune``, reported on ``report``), the noise per measurement, which families are
judged and which cut as redundant, the scoring, the oracle and ``pre26`` — is docs/search.md,
"How well it searches"; the truths are built in `benchmarks/search_truths.py`, the tables
printed by `benchmarks/search_report.py`.

Each study is a real `autotune.study.run.run_study` on backend replay (in-memory Optuna storage,
the confirm phase off), in worker processes (``--jobs``) that import autotune from this checkout
— or, for sampler ``pre26`` (``auto`` before issue 26), from ``--pre26 CHECKOUT`` (``git worktree
add --detach CHECKOUT 1dd7f24``), and for sampler ``before`` (``auto`` of any other commit, e.g.
the one before a change), from ``--before CHECKOUT`` — while every table is built here. A run is a trial that ran
(`autotune.storage.counting.ran`: not rejected as infeasible, not a repeat answered from
storage); a study is resumed with more trials, going on with its first sampler, until it has
``--runs`` runs. ``NAME:K`` runs sampler NAME with K trial slots (``--slots K``: every
sampler): ``cluster.pool_devices`` = K × devices, K trials at once on the replay backend's
virtual clock.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import queue
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import search_report
import search_truths as truths

ROOT = Path(__file__).resolve().parent.parent
SPACES = {
    "llama7b-64": ROOT / "examples" / "llama7b_64dev_simulate.yaml",
    "gpt3-1024": ROOT / "examples" / "gpt3_1024dev_simulate.yaml",
}
FIXED = {"search.space.jit_level": "O1"}
SAMPLERS = ("random", "tpe", "auto")
ADMIT_BELOW = 0.85  # the model's top 5 reach at most this of the optimum: a structural miss
CPU = {"cluster.device": "cpu"}


# ---------------------------------------------------------------- the worker processes


_WRONG_CODE = ""  # set in a worker that imported autotune from elsewhere than it was told


def _start_worker(code: str | None) -> None:
    """Pool initializer: import autotune from ``code`` (a checkout), else from this one (an
    error here would only respawn the worker: :func:`one_study` raises it)."""
    global _WRONG_CODE
    if code:
        sys.path.insert(0, code)
    import autotune

    where = Path(autotune.__file__).resolve().parent.parent
    expected = Path(code).resolve() if code else ROOT
    if where != expected:
        _WRONG_CODE = f"a worker imported autotune from {where}, not {expected}"
    _keep_tables()


def _keep_tables() -> None:
    """Read each table once per worker, not once per resumed study: a study's runs do not
    change its table, and a LLaMA table (21,300 rows) takes ~2.4 s to read — more than the
    study. Wraps ``load_table`` where the study code looks it up (the last two kept)."""
    from autotune.execution import replay
    from autotune.study import run

    read = replay.load_table
    kept: dict = {}

    def load_table(spec, space, *args, **kwargs):
        path = Path(spec.cluster.replay)
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size, args, tuple(sorted(kwargs.items())))
        if key not in kept:
            while len(kept) >= 2:
                kept.pop(next(iter(kept)))
            kept[key] = read(spec, space, *args, **kwargs)
        return kept[key]

    replay.load_table = run.load_table = load_table


def _one_sampler() -> None:
    """Make the resumes of the next study go on with its first sampler, as one study asked for
    enough trials would: a resumed study makes its sampler anew from its seed, and a new
    RandomSampler proposes its first candidates again — repeats, answered from storage, until
    100 in a row end the session (`autotune.study.loop.MAX_REPEATS`) and the study spins."""
    from autotune.study import run

    make = getattr(run.make_sampler, "__wrapped__", run.make_sampler)
    made = []

    def make_sampler(name, seed, n_trials):
        if not made:
            made.append(make(name, seed, n_trials))
        return made[0]

    make_sampler.__wrapped__ = make
    run.make_sampler = make_sampler


def one_study(task: tuple) -> tuple:
    """Run one replay study; returns ``(task id, [(knobs, outcome, measured goodput)] of its
    runs in order, seconds)``."""
    ident, model, table, sampler, seed, runs, overrides = task
    if _WRONG_CODE:
        raise RuntimeError(_WRONG_CODE)
    started = time.perf_counter()
    import optuna
    from rich.console import Console

    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.storage.counting import counted, ran
    from autotune.storage.schema import knobs_of, outcome_of
    from autotune.study.progress import Progress
    from autotune.study.run import run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(
        model,
        {
            "cluster.backend": "replay",
            "cluster.replay": str(table),
            "search.sampler": sampler,
            "search.seed": seed,
            "search.objectives": ["goodput"],
            **overrides,
        },
    )
    space = build_space(spec)
    storage, trials, done = optuna.storages.InMemoryStorage(), runs, []
    quiet = Progress(Console(file=io.StringIO()))
    _one_sampler()
    while len(done) < runs and trials <= 20 * runs:
        study = run_study(
            spec,
            space,
            storage=storage,
            study_name="bench",
            n_trials=trials,
            resume=trials > runs,
            artifacts=Path(tempfile.gettempdir()),
            progress=quiet,
            confirm_top=0,
        )
        done = sorted(
            (t for t in study.get_trials(deepcopy=False) if ran(t)), key=lambda t: t.number
        )
        if sum(map(counted, study.get_trials(deepcopy=False))) < trials:
            break  # it ended before its N (out of candidates, or only repeats): nothing new
        trials += runs - len(done)
    found = [
        (knobs_of(t), outcome_of(t), t.values[0] if outcome_of(t) == "ok" else None)
        for t in done[:runs]
    ]
    return ident, found, time.perf_counter() - started


def oracle_runs(truth, first: dict, runs: int) -> list:
    """What the oracle runs (see the module doc), as a study's runs: (key, outcome, measured)."""
    order = ([truth.baseline] if truth.baseline_runs else []) + [
        k for k in truth.best_first() if k != truth.baseline
    ]
    return [(k, "ok" if truth.value[k] > 0 else "oom", first[k] or None) for k in order[:runs]]


# ---------------------------------------------------------------- the families run


def contenders(args) -> list[tuple]:
    """``[(label, sampler, code, slots)]`` of ``--samplers`` (``pre26``, ``before``: auto from
    ``--pre26``, ``--before``; ``NAME:K``: K slots)."""
    out = []
    for label in args.samplers:
        name, _, slots = label.partition(":")
        code = None
        if name in ("pre26", "before"):
            checkout = getattr(args, name)
            if not checkout:
                raise SystemExit(f"sampler {name} needs --{name} CHECKOUT (a git worktree)")
            name, code = "auto", str(Path(checkout).resolve())
        out.append((label, name, code, int(slots or args.slots)))
    return out


def select_families(setting, structures, wanted: list[str]) -> list[tuple]:
    """``[(family, kind, model reach, screen reach, judged, cut)]`` of the families ``wanted``
    on ``setting`` (``cut``: why ``--families judged`` leaves it out, else ""; the rules in the
    module doc)."""
    every = structures.families()
    names = every
    if wanted not in (["judged"], ["all"]):
        kinds = ("mild", "time", "memory", "engine", "layout")
        names = []
        for w in wanted:
            names += [f for f in every if truths.kind_of(f) == w] if w in kinds else [w]
        unknown = sorted(set(names) - set(every))
        if unknown:
            raise SystemExit(f"unknown families {unknown}; known: {', '.join(every)}")
    out = []
    seen: dict = {}
    for family in every:
        kind = truths.kind_of(family)
        truth = truths.truth_of(setting, family, structures.first_seed, structures)
        reach = truths.model_reach(truth, setting)
        admitted = reach <= ADMIT_BELOW
        top = tuple(truth.best_first()[: truths.TOP])
        signature = (top, admitted, truth.engine)
        # a structural family whose top 5 are its prior's own poses mild's problem
        own = (truths.prior_top(setting, truth.engine), False, truth.engine)
        seen.setdefault(own, "the prior's own top 5, as mild")
        cut = ""
        # a lottery draws its truth per seed: the first seed's top 5 say nothing of the rest
        if kind in ("time", "memory") or kind == "layout" and "lottery" not in family:
            cut = "not admitted" if kind == "memory" and not admitted else seen.get(signature, "")
            seen.setdefault(signature, f"the same top 5 and admission as {family}")
        if family in names:
            judged = kind != "engine" and not (kind == "memory" and not admitted)
            out.append((family, kind, reach, truths.screen_reach(truth, setting), judged, cut))
    return out


class Runner:
    """Runs studies on at most ``jobs`` processes at once, whichever checkout each imports (one
    pool per checkout); :meth:`run` takes groups of tasks, each group prepared (its tables
    written) only when the tasks before it are nearly all dispatched."""

    def __init__(self, codes: set, jobs: int):
        context = multiprocessing.get_context("spawn")
        self.jobs, self.ended = jobs, queue.Queue()
        self.pools = {
            code: context.Pool(jobs, initializer=_start_worker, initargs=(code,)) for code in codes
        }

    def run(self, groups, done) -> None:
        """``groups``: an iterator of task lists ``[(code, task)]``; ``done(task id, found,
        seconds)`` is called as each study ends (in this thread)."""
        pending, inflight, groups = deque(), 0, iter(groups)
        more = True
        while more or pending or inflight:
            while more and len(pending) < 2 * self.jobs:
                group = next(groups, None)
                more = group is not None
                pending.extend(group or ())
            while pending and inflight < self.jobs:
                code, task = pending.popleft()
                self.pools[code].apply_async(
                    one_study, (task,), callback=self.ended.put, error_callback=self.ended.put
                )
                inflight += 1
            ended = self.ended.get()
            inflight -= 1
            if isinstance(ended, BaseException):
                raise ended
            done(*ended)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.terminate()


def _commit(code: str) -> str:
    """The commit a checkout is at (for the output)."""
    out = subprocess.run(
        ["git", "-C", code, "log", "-1", "--format=%h %s"], capture_output=True, text=True
    )
    return out.stdout.strip()[:80] or "not a git checkout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structures", choices=list(truths.STRUCTURES), default="report")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, help="default: the structures' first")
    parser.add_argument("--runs", type=int, default=max(search_report.CHECKPOINTS))
    parser.add_argument("--spaces", nargs="*", default=list(SPACES), choices=list(SPACES))
    parser.add_argument("--families", nargs="+", default=["judged"])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--pre26", metavar="CHECKOUT", help="the checkout sampler pre26 runs")
    parser.add_argument("--before", metavar="CHECKOUT", help="the checkout sampler before runs")
    parser.add_argument("--slots", type=int, default=1, help="trial slots of every sampler")
    parser.add_argument(
        "--real",
        nargs=2,
        action="append",
        default=[],
        metavar=("TABLE", "MODEL"),
        help="a measured table and its model.yaml",
    )
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not 1 <= args.runs <= truths.ROWS:
        raise SystemExit(f"--runs must be 1..{truths.ROWS} (the rows a table has per candidate)")
    structures = truths.STRUCTURES[args.structures]
    first = structures.first_seed if args.first_seed is None else args.first_seed
    seeds = range(first, first + args.seeds)
    started = time.perf_counter()
    who = contenders(args)
    print(f"structures {structures.name}, seeds {seeds.start}–{seeds.stop - 1}, {args.runs} runs")
    for label, _, code, _ in who:
        if code:
            print(f"{label}: auto of {code} ({_commit(code)})")
    board = search_report.Board([label for label, *_ in who], args.runs)
    runner = Runner({code for _, _, code, _ in who}, args.jobs)
    try:
        with tempfile.TemporaryDirectory() as work:
            runner.run(_groups(args, structures, seeds, who, board, Path(work)), board.add)
    finally:
        runner.close()
    board.report(seeds)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


def _groups(args, structures, seeds, who, board, work: Path):
    """Each family's tasks, one seed at a time: its table written, the oracle scored, the
    studies to run (``(code, task)``)."""
    for name in args.spaces:
        setting = truths.Setting(name, SPACES[name], FIXED)
        devices = setting.spec.cluster.devices
        for family, kind, reach, screen, judged, cut in select_families(
            setting, structures, args.families
        ):
            if cut and _by_kind(args.families):
                board.skip(name, family, kind, reach, cut)
                continue
            board.family(name, family, kind, reach, screen, judged)
            for seed in seeds:
                truth = truths.truth_of(setting, family, seed, structures)
                table = work / f"{name}-{len(board.families)}-{seed}.csv"
                first = truths.write_table(truth, table, family, seed)
                yield _tasks(args, who, board, (name, family), seed, truth, first, table, devices)
    for table, model in args.real:
        table, model = Path(table).resolve(), Path(model).resolve()
        truth, first = truths.real_truth(table, model, CPU)
        key = (model.stem, f"real:{table.name}")
        board.family(*key, "real", float("nan"), float("nan"), False)
        devices = _devices(model)
        for seed in seeds:
            yield _tasks(args, who, board, key, seed, truth, first, table, devices, model, False)


def _by_kind(wanted: list[str]) -> bool:
    """Whether ``--families`` chose by kind (``judged``, ``mild``, ``time``, …: redundant and
    unadmitted families left out), not by name or ``all``."""
    return all(w in ("judged", "mild", "time", "memory", "engine", "layout") for w in wanted)


def _devices(model: Path) -> int:
    """The ``cluster.devices`` of a model.yaml (on the CPU)."""
    from autotune.spec.model_yaml import load_spec

    return load_spec(model, CPU).cluster.devices


def _tasks(args, who, board, key, seed, truth, first, table, devices, model=None, temporary=True):
    """The studies of one table and seed, as ``(code, task)``; the oracle scored, and the
    table and truth handed to ``board`` (which deletes a temporary table once its studies
    ended)."""
    model = model or SPACES[key[0]]
    overrides = FIXED if model in SPACES.values() else CPU
    board.table(
        key, seed, truth, oracle_runs(truth, first, args.runs), table if temporary else None
    )
    out = []
    for label, sampler, code, slots in who:
        pool = {"cluster.pool_devices": devices * slots} if slots > 1 else {}
        task = (model, table, sampler, seed, args.runs, {**overrides, **pool})
        out.append((code, ((key, seed, label), *task)))
    board.expect(key, seed, len(out))
    return out


if __name__ == "__main__":
    main()
