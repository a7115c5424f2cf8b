"""How fast random search, TPE and ``auto`` find a near-optimal candidate against a truth that is
not the prior (run by hand; prints tables).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 10] [--first-seed 0] [--runs 30]

Measuring a sampler on the simulate backend measures it against the cost model itself, and a
search guided by the cost model would look perfect there. So the truth here is a replay table
(`autotune.execution.replay`) per benchmark seed, made from the cost model with each of its constants
multiplied by a factor drawn from U[0.8, 1.25] — the achievable fraction of peak, the intra- and
inter-node link bandwidths, the collective and per-hop latencies, the recompute part and the
pipeline bubble — and every candidate's step time by lognormal noise (σ = 0.1), a disagreement
of the size the model shows against published runs (`benchmarks/costmodel_validation.py`).
The memory model is not perturbed, so the tables hold exactly the candidates the OOM screen
lets through. The jit level is fixed at O1: its factors are the cost model's guesses
(`autotune/costmodel/profiles.py`), so no truth for it could be made.

Each study is a real `autotune.study.run.run_study` on backend replay (in-memory Optuna
storage): the baseline first, then the sampler; infeasible proposals are recorded without a
run and cost nothing here, so "trials" below counts runs (a study is resumed with more trials
until it has run ``--runs``). Per space, sampler and seed: the best goodput found after 5, 10,
15, 20 and 30 runs over the table's optimum, and the runs it took to reach 0.97 of it (31 when
it never did within 30); the table shows medians over the seeds.

Spaces: examples/llama7b_64dev_simulate.yaml (LLaMA-7B shape, 64 Ascend 910B) and
examples/gpt3_1024dev_simulate.yaml (GPT-3 175B shape, 1,024 A100), both as replay studies.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
from rich.console import Console

from autotune.storage.counting import counted
from autotune.storage.schema import outcome_of
from autotune.costmodel import estimate, resolve_profile
from autotune.spec.knobs import KNOB_NAMES
from autotune.study.progress import Progress
from autotune.study.run import run_study
from autotune.spec.space import build_space
from autotune.spec.model_yaml import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPACES = {"llama7b-64": ROOT / "examples" / "llama7b_64dev_simulate.yaml",
          "gpt3-1024": ROOT / "examples" / "gpt3_1024dev_simulate.yaml"}
SAMPLERS = ("random", "tpe", "auto")
CHECKPOINTS = (5, 10, 15, 20, 30)
WITHIN = 0.97
PERTURBED = ("achievable", "intra_node_gbps", "inter_node_gbps", "collective_latency_us",
             "hop_latency_us")
NOISE_SIGMA = 0.1


def truth_table(spec, space, seed: int, path: Path) -> float:
    """Write the perturbed truth of ``space`` to ``path`` (see the module doc); returns its
    optimum goodput."""
    rng = np.random.default_rng(seed)
    profile = resolve_profile(spec.cluster)
    device = {"base": profile.name, **{k: getattr(profile, k) * rng.uniform(0.8, 1.25)
                                       for k in PERTURBED}}
    recompute, bubble = rng.uniform(0.8, 1.25, size=2)
    world = replace(spec, cluster=replace(spec.cluster, device=device))
    best = 0.0
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb"])
        for candidate in space.candidates():
            est = estimate(world, candidate)
            if not est.feasible:
                continue
            parts = est.breakdown["time_s"]
            seconds = (sum(parts.values()) + (recompute - 1) * parts["recompute"]
                       + (bubble - 1) * parts["bubble"]) * rng.lognormal(0.0, NOISE_SIGMA)
            goodput = spec.train.global_batch_size / seconds
            best = max(best, goodput)
            out.writerow([*(getattr(candidate, k) for k in KNOB_NAMES), goodput,
                          seconds * 1000, est.memory_gb_per_device * 1024])
    return best


def runs_of(study) -> list[float]:
    """Goodput of each run of ``study`` in order (0 for a run that was not ok)."""
    ran = [t for t in study.get_trials(deepcopy=False)
           if counted(t) and outcome_of(t) != "infeasible"]
    return [t.values[0] if t.values else 0.0 for t in sorted(ran, key=lambda t: t.number)]


def one_study(model: Path, table: Path, sampler: str, seed: int, runs: int) -> list[float]:
    """The goodput of the first ``runs`` runs of a replay study of ``model`` on ``table``."""
    spec = load_spec(model, {"cluster.backend": "replay", "cluster.replay": str(table),
                             "search.sampler": sampler, "search.seed": seed,
                             "search.space.jit_level": "O1"})
    space = build_space(spec)
    storage, trials, ran = optuna.storages.InMemoryStorage(), runs, []
    quiet = Progress(Console(file=io.StringIO()))
    while len(ran) < runs and trials <= 20 * runs:
        study = run_study(spec, space, storage=storage, study_name="bench", n_trials=trials,
                          resume=trials > runs, artifacts=Path(tempfile.gettempdir()),
                          progress=quiet)
        ran = runs_of(study)
        trials += runs - len(ran)
    return ran[:runs]


def score(ran: list[float], optimum: float) -> dict:
    """Best/optimum at each checkpoint and the runs to reach WITHIN (len + 1 when never)."""
    best = np.maximum.accumulate(np.array(ran) / optimum)
    at = {k: float(best[min(k, len(best)) - 1]) for k in CHECKPOINTS}
    hits = np.nonzero(best >= WITHIN)[0]
    return {**at, "to": int(hits[0]) + 1 if len(hits) else max(CHECKPOINTS) + 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--spaces", nargs="+", default=list(SPACES), choices=list(SPACES))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name in args.spaces:
            spec = load_spec(SPACES[name], {"search.space.jit_level": "O1"})
            space = build_space(spec)
            print(f"{name}: {sum(1 for _ in space.candidates())} candidates, "
                  f"searching {', '.join(space.searched())}", flush=True)
            for seed in seeds:
                table = Path(work) / f"{name}-{seed}.csv"
                optimum = truth_table(spec, space, seed, table)
                for sampler in SAMPLERS:
                    ran = one_study(SPACES[name], table, sampler, seed, args.runs)
                    results.setdefault((name, sampler), []).append(score(ran, optimum))
    print(f"\nmedian over {args.seeds} seeds (from {args.first_seed}) of best found / optimum "
          f"after N runs; runs to reach {WITHIN} ({max(CHECKPOINTS) + 1}: not within "
          f"{max(CHECKPOINTS)})\n")
    head = f"{'space':<12}{'sampler':<8}" + "".join(f"{f'@{k}':>7}" for k in CHECKPOINTS) + \
        f"{'to 0.97':>9}"
    print(head)
    print("-" * len(head))
    for (name, sampler), rows in results.items():
        cells = "".join(f"{statistics.median(r[k] for r in rows):>7.3f}" for k in CHECKPOINTS)
        print(f"{name:<12}{sampler:<8}{cells}{statistics.median(r['to'] for r in rows):>9g}")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
