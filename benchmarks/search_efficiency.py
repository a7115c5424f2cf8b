"""How fast random search, TPE and ``auto`` find a near-optimal candidate against truths that are
not the prior (run by hand; prints tables).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 10] [--first-seed 0] [--runs 15]
        [--families all|mild|single|pairs|NAME...] [--samplers random tpe auto] [--jobs 2]

Measuring a sampler on the simulate backend measures it against the cost model itself, and a
search guided by the cost model would look perfect there. So each truth here is a replay table
(`autotune.execution.replay`) per benchmark seed, made from the cost model and then made wrong,
in one of three ways (the families, fixed here so that no one tunes them to a sampler):

- ``mild``: every constant of the device profile that prices time — the achievable fraction of
  peak, the intra- and inter-node link bandwidths, the collective and per-hop latencies — and
  the recompute and bubble parts, each multiplied by a factor drawn from U[0.8, 1.25];
- ``MECHANISM×F``: one mechanism's part of the estimate multiplied by F in {0.6, 1.6}: ``tp``
  (the tp_comm part), ``pipeline`` (the bubble and the stage-to-stage transfers: bubble and
  pp_comm), ``dp`` (the dp_comm part: the gradient all-reduce and the parallel optimizer's
  gathers), ``recompute`` (the recompute part), ``optimizer`` (the optimizer update) or
  ``memory`` (the peak: a candidate whose true peak exceeds device memory × the cost model's
  safety margin is an ``oom`` row; one the model screens out but that truly fits is a row the
  study can only reach by running a candidate predicted out of memory);
- ``A×0.6+B×1.6``: two mechanisms at once, every ordered pair.

and in every family each candidate's step time times lognormal noise (σ = 0.1), a disagreement of
the size the model shows against published runs (`benchmarks/costmodel_validation.py`). Memory
gets no noise. A structurally wrong family is **admitted** when the cost model's own top 5
(feasible by its estimate) reach at most 0.85 of the optimum of the noise-free truth — when
trusting the prior would lose; the others are reported but not judged.

``--real TABLE.csv MODEL.yaml`` adds a table measured on this machine (no noise added: it is a
measurement) as one more family of the space MODEL.yaml describes, replayed with the CPU's device
profile (``cluster.device: cpu``: the prior a study of MODEL.yaml on this machine has). Its
candidates have several rows (runs), each run of a candidate takes the next, and a run is scored
by its candidate's mean over its rows against the best candidate's mean: a lucky row is not the
optimum, and finding the best candidate on an unlucky row still counts as finding it.

Each study is a real `autotune.study.run.run_study` on backend replay (in-memory Optuna
storage): the baseline first, then the sampler; infeasible proposals are recorded without a
run and cost nothing here, so "runs" counts executed trials (a study is resumed with more trials
until it has run ``--runs``). Per family, sampler and seed: the best goodput found after 5, 10
and 15 runs over the table's optimum; the table shows medians over the seeds.

Spaces: examples/llama7b_64dev_simulate.yaml (LLaMA-7B shape, 64 Ascend 910B) and
examples/gpt3_1024dev_simulate.yaml (GPT-3 175B shape, 1,024 A100), both as replay studies; the
jit level is fixed at O1 (its factors on accelerators are the cost model's guesses, so no truth
for it could be made).
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import multiprocessing
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPACES = {
    "llama7b-64": ROOT / "examples" / "llama7b_64dev_simulate.yaml",
    "gpt3-1024": ROOT / "examples" / "gpt3_1024dev_simulate.yaml",
}
SAMPLERS = ("random", "tpe", "auto")
CHECKPOINTS = (5, 10, 15)
PERTURBED = (
    "achievable",
    "intra_node_gbps",
    "inter_node_gbps",
    "collective_latency_us",
    "hop_latency_us",
)
NOISE_SIGMA = 0.1
# mechanism → the parts of the estimated step it prices; "pipeline" only on pipelined candidates
MECHANISMS = {
    "tp": ("tp_comm",),
    "pipeline": ("compute", "recompute", "bubble", "pp_comm"),
    "dp": ("dp_comm",),
    "recompute": ("recompute",),
    "optimizer": ("optimizer",),
    "memory": (),
}
FACTORS = (0.6, 1.6)
ADMIT_BELOW = 0.85  # the model's top 5 reach at most this of the optimum: a structural miss
TOP = 5


def families() -> list[str]:
    """Every family's name: mild, the single mechanisms, the ordered pairs."""
    single = [f"{m}×{f:g}" for m in MECHANISMS for f in FACTORS]
    pairs = [f"{a}×0.6+{b}×1.6" for a, b in itertools.permutations(MECHANISMS, 2)]
    return ["mild", *single, *pairs]


def factors_of(family: str) -> dict:
    """``{mechanism: factor}`` of a structural family's name."""
    out = {}
    for term in family.split("+"):
        name, factor = term.split("×")
        out[name] = float(factor)
    return out


def estimates_of(spec, space) -> list[tuple]:
    """``[(candidate, estimate)]`` of every candidate that breaks no constraint, priced as a
    replay study of ``spec`` prices them (its engine: what runs a trial)."""
    from autotune.costmodel import estimate

    spec = replace(spec, cluster=replace(spec.cluster, backend="replay"))
    found = ((c, estimate(spec, c)) for c in space.candidates())
    return [(c, e) for c, e in found if e.breakdown]


def truth_rows(
    spec, space, family: str, seed: int, noise: bool = True, estimates=None
) -> list[tuple]:
    """``[(candidate, goodput or None when oom, step ms, peak MB)]`` of ``family``'s truth for
    ``seed`` (``noise`` False: the same truth without its noise). ``estimates``: the cost
    model's, when already computed (:func:`estimates_of`)."""
    from autotune.costmodel import SAFETY_MARGIN, resolve_profile

    rng = np.random.default_rng(seed)
    profile = resolve_profile(spec.cluster)
    factors, scaled = {}, {}
    if family == "mild":
        device = {
            "base": profile.name,
            **{k: getattr(profile, k) * rng.uniform(0.8, 1.25) for k in PERTURBED},
        }
        world = replace(spec, cluster=replace(spec.cluster, device=device))
        scaled = dict(zip(("recompute", "bubble"), rng.uniform(0.8, 1.25, size=2)))
        estimates = estimates_of(world, space)
    else:
        factors = factors_of(family)
        estimates = estimates or estimates_of(spec, space)
    limit = spec.cluster.max_device_memory_gb or profile.memory_gb * SAFETY_MARGIN
    rows = []
    for candidate, est in estimates:
        parts = est.breakdown["time_s"]
        scale = dict(scaled)
        for mechanism, factor in factors.items():
            if mechanism != "pipeline" or candidate.pp > 1:
                for part in MECHANISMS[mechanism]:
                    scale[part] = scale.get(part, 1.0) * factor
        seconds = sum(v * scale.get(k, 1.0) for k, v in parts.items())
        draw = rng.lognormal(0.0, NOISE_SIGMA)  # drawn either way: the same truth, noise or not
        seconds *= draw if noise else 1.0
        memory = est.memory_gb_per_device * factors.get("memory", 1.0)
        fits = memory <= limit * (1 + 1e-9)
        rows.append(
            (
                candidate,
                spec.train.global_batch_size / seconds if fits else None,
                seconds * 1000,
                memory * 1024,
            )
        )
    return rows


def model_top_reach(rows, estimates) -> float:
    """The truth's best among the cost model's own top :data:`TOP` (feasible by its estimate)
    over the truth's optimum."""
    truth = {c: g for c, g, *_ in rows}
    ranked = [
        c
        for c, e in sorted(
            ((c, e) for c, e in estimates if e.feasible), key=lambda ce: -ce[1].samples_per_s
        )
    ][:TOP]
    optimum = max(g for g in truth.values() if g)
    return max((truth[c] or 0.0) for c in ranked) / optimum


def write_table(rows, path: Path) -> float:
    """Write ``rows`` as a replay table; returns the optimum goodput."""
    from autotune.spec.knobs import KNOB_NAMES

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb", "outcome"])
        for c, goodput, ms, mb in rows:
            out.writerow(
                [
                    *(getattr(c, k) for k in KNOB_NAMES),
                    goodput or "",
                    ms,
                    mb,
                    "ok" if goodput else "oom",
                ]
            )
    return max(g for _, g, *_ in rows if g)


def oracle(rows, clean, optimum: float) -> dict:
    """What a sampler that knew the truth without its noise would score: its candidates run
    best first (every mechanism known, no candidate's own deviation)."""
    noisy = {c: g or 0.0 for c, g, *_ in rows}
    ranked = [c for c, g, *_ in sorted((r for r in clean if r[1]), key=lambda r: -r[1])]
    return score([noisy[c] for c in ranked[: max(CHECKPOINTS)]], optimum)


def runs_of(study, means: dict | None = None) -> list[float]:
    """Goodput of each run of ``study`` in order (0 for a run that was not ok); with ``means``
    (a real table's: :func:`candidate_means`), its candidate's mean instead."""
    from autotune.storage.counting import counted
    from autotune.storage.schema import knobs_of, outcome_of

    ran = sorted(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if counted(t) and outcome_of(t) != "infeasible"
        ),
        key=lambda t: t.number,
    )
    if means is None:
        return [t.values[0] if t.values else 0.0 for t in ran]
    columns, mean_of = means
    return [
        mean_of.get(tuple(knobs_of(t)[name] for name in columns), 0.0) if t.values else 0.0
        for t in ran
    ]


def candidate_means(table) -> tuple:
    """``(knob columns, {their values: mean goodput over the candidate's rows})`` of a loaded
    replay table (`autotune.execution.replay.ReplayTable`), for its candidates whose every row
    is ok."""
    return table.knobs, {
        key: statistics.mean(r.metrics["goodput"] for r in found)
        for key, found in table.rows.items()
        if all(r.outcome == "ok" for r in found)
    }


def one_study(
    model: Path,
    table: Path,
    sampler: str,
    seed: int,
    runs: int,
    overrides: dict,
    means: dict | None = None,
) -> list[float]:
    """The goodput of the first ``runs`` runs of a replay study of ``model`` on ``table``."""
    import optuna
    from rich.console import Console

    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
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
    storage, trials, ran = optuna.storages.InMemoryStorage(), runs, []
    quiet = Progress(Console(file=io.StringIO()))
    while len(ran) < runs and trials <= 20 * runs:
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
        ran = runs_of(study, means)
        trials += runs - len(ran)
    return ran[:runs]


def score(ran: list[float], optimum: float) -> dict:
    """Best/optimum at each checkpoint."""
    best = np.maximum.accumulate(np.array(ran or [0.0]) / optimum)
    return {k: float(best[min(k, len(best)) - 1]) for k in CHECKPOINTS}


def _task(args) -> tuple:
    key, model, table, optimum, sampler, seed, runs, overrides, *means = args
    return (
        key,
        sampler,
        score(one_study(model, table, sampler, seed, runs, overrides, *means), optimum),
    )


def _select(wanted: list[str]) -> list[str]:
    every = families()
    if wanted == ["all"]:
        return every
    out = []
    for w in wanted:
        out += {
            "mild": ["mild"],
            "single": [f for f in every if "×" in f and "+" not in f],
            "pairs": [f for f in every if "+" in f],
        }.get(w, [w])
    unknown = set(out) - set(every)
    if unknown:
        raise SystemExit(f"unknown families {sorted(unknown)}; known: {', '.join(every)}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--spaces", nargs="*", default=list(SPACES), choices=list(SPACES))
    parser.add_argument("--families", nargs="+", default=["all"])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
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
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()
    tasks, info, results = [], {}, {}
    fixed = {"search.space.jit_level": "O1"}
    with tempfile.TemporaryDirectory() as work:
        for name in args.spaces:
            spec = load_spec(SPACES[name], fixed)
            space = build_space(spec)
            estimates = estimates_of(spec, space)
            for family in _select(args.families):
                clean = truth_rows(spec, space, family, 0, noise=False, estimates=estimates)
                reach = model_top_reach(clean, estimates)
                admitted = family == "mild" or reach <= ADMIT_BELOW
                info[(name, family)] = (reach, admitted)
                for seed in seeds:
                    table = Path(work) / f"{name}-{family}-{seed}.csv"
                    rows = truth_rows(spec, space, family, seed, estimates=estimates)
                    optimum = write_table(rows, table)
                    results.setdefault(((name, family), "oracle"), []).append(
                        oracle(
                            rows,
                            truth_rows(spec, space, family, seed, noise=False, estimates=estimates),
                            optimum,
                        )
                    )
                    tasks += [
                        ((name, family), SPACES[name], table, optimum, s, seed, args.runs, fixed)
                        for s in args.samplers
                    ]
        for table, model in args.real:
            on_cpu = {"cluster.device": "cpu"}
            spec = load_spec(
                Path(model),
                {
                    "cluster.backend": "replay",
                    **on_cpu,
                    "cluster.replay": str(Path(table).resolve()),
                },
            )
            from autotune.execution.replay import load_table

            means = candidate_means(load_table(spec, build_space(spec)))
            optimum = max(means[1].values())
            key = (Path(model).stem, f"real:{Path(table).name}")
            info[key] = (float("nan"), True)
            tasks += [
                (
                    key,
                    Path(model).resolve(),
                    Path(table).resolve(),
                    optimum,
                    s,
                    seed,
                    args.runs,
                    on_cpu,
                    means,
                )
                for seed in seeds
                for s in args.samplers
            ]
        print(f"{len(tasks)} studies on {args.jobs} processes", flush=True)
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for key, sampler, scored in pool.imap_unordered(_task, tasks, chunksize=4):
                results.setdefault((key, sampler), []).append(scored)
    report(results, info, args)
    print(f"\n{time.perf_counter() - started:.0f} s")


def report(results: dict, info: dict, args) -> None:
    """The per-family table and the summary the acceptance reads."""
    print(
        f"\nmedian over {args.seeds} seeds (from {args.first_seed}) of best found / optimum "
        f"after N runs; 'top5': the cost model's own top {TOP} over the noise-free optimum\n"
    )
    samplers = [*args.samplers, "oracle"]
    cols = "".join(f"{f'{s}@{k}':>11}" for s in samplers for k in CHECKPOINTS)
    head = f"{'space':<12}{'family':<28}{'top5':>6}{'adm':>4}{cols}"
    print(head)
    print("-" * len(head))
    medians = {}
    for (space, family), (reach, admitted) in info.items():
        cells = ""
        for s in samplers:
            rows = results.get(((space, family), s), [])
            for k in CHECKPOINTS:
                value = statistics.median(r[k] for r in rows) if rows else float("nan")
                medians[(space, family, s, k)] = value
                cells += f"{value:>11.3f}"
        print(f"{space:<12}{family:<28}{reach:>6.2f}{'yes' if admitted else 'no':>4}{cells}")
    structural = [
        (sp, f)
        for (sp, f), (_, adm) in info.items()
        if adm and f != "mild" and not f.startswith("real:")
    ]
    print(
        f"\nadmitted structural families: {len(structural)} of "
        f"{sum(1 for _, f in info if f != 'mild' and not f.startswith('real:'))}"
    )
    if structural and "auto" in args.samplers:
        at10 = [medians[(sp, f, "auto", 10)] for sp, f in structural]
        print(
            f"auto @10 ≥ 0.97: {sum(v >= 0.97 for v in at10)} of {len(at10)}; "
            f"≥ 0.90: {sum(v >= 0.90 for v in at10)}; worst {min(at10):.3f}"
        )
        for s in args.samplers:
            per = [medians[(sp, f, s, 10)] for sp, f in structural]
            print(f"  {s:<7} median family @10: {statistics.median(per):.3f}")
        misses = sorted((medians[(sp, f, "auto", 10)], sp, f) for sp, f in structural)[:8]
        print("  lowest auto@10: " + ", ".join(f"{sp}/{f} {v:.3f}" for v, sp, f in misses))


if __name__ == "__main__":
    main()
