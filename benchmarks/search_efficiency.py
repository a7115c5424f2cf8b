"""How fast the samplers find a near-optimal candidate (run by hand; prints tables).

    PYTHONPATH=. python benchmarks/search_efficiency.py [MODEL_YAML] [--seeds N] [--cap N]
                                                        [--model-error SIGMA]

On the simulate backend a trial is ``autotune.costmodel.estimate`` (no MindSpore run), so the
exact optimum is known: every distinct candidate of ``SearchSpace.candidates()`` is estimated
and the best feasible ``samples_per_s`` is the reference. Then, for each sampler setting and
seed, an in-memory Optuna study runs the search loop's protocol — ``study.ask()``,
``SearchSpace.sample(trial)``, ``estimate()``:

- infeasible → told PRUNED (never run, but TPE learns from it) and free;
- a candidate already run → told its earlier value without running it again and free
  ("dedupe"; the "naive" protocol instead re-runs it and counts it);
- otherwise it "runs" and counts against the budget of 30 runs.

Per seed it reports the runs needed to get within 3% of the optimum, the best after 30 runs as
% of the optimum, and the asks that took (infeasible and duplicate asks included). "×4" settings
suggest 4 trials before telling any, as 4 concurrent Ray trials do.

``--model-error SIGMA`` makes the "measured" goodput differ from the estimate, as on a real
backend: each knob value gets a hidden lognormal factor of width SIGMA and each candidate 3%
more (one such world per seed). It adds two settings that use the cost model's ranking: running
its top 30 predictions, and TPE after enqueuing its top 5.

Default model: examples/llama7b_64dev_simulate.yaml (LLaMA-7B shape on 64 Ascend 910B, 5,760
candidates). Target: TPE ≥ 97% of the optimum within 30 runs (median of 5 seeds).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import warnings
from pathlib import Path

import optuna

from autotune.costmodel import estimate
from autotune.knobs import KNOB_NAMES
from autotune.samplers import make_sampler
from autotune.space import build_space
from autotune.spec import load_spec

WITHIN = 0.97
BUDGET = 30
CANDIDATE_NOISE = 0.03  # per-candidate scatter of the --model-error world (run-to-run noise)
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "examples" / "llama7b_64dev_simulate.yaml"
TPE = optuna.samplers.TPESampler

# name → (sampler factory, protocol, concurrent asks, cost-model top-k enqueued first).
# Optuna 5's TPE is multivariate over the parameters every trial has, with constant_liar=True;
# micro_batches / grad_accum exist only for some pp, so only group=True models them jointly.
SETTINGS = {
    "random": (lambda seed: optuna.samplers.RandomSampler(seed=seed), "dedupe", 1, 0),
    "tpe defaults, naive": (lambda seed: TPE(seed=seed), "naive", 1, 0),
    "tpe defaults": (lambda seed: TPE(seed=seed), "dedupe", 1, 0),
    "tpe startup 5": (lambda seed: TPE(seed=seed, n_startup_trials=5), "dedupe", 1, 0),
    # exactly what `autotune search` builds for a 30-trial TPE study
    "autotune tpe (shipped)": (lambda seed: make_sampler("tpe", seed, BUDGET), "dedupe", 1, 0),
    "tpe group": (lambda seed: TPE(seed=seed, multivariate=True, group=True), "dedupe", 1, 0),
    "tpe group, startup 5": (lambda seed: TPE(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=5), "dedupe", 1, 0),
    "tpe defaults ×4 liar": (lambda seed: TPE(seed=seed), "dedupe", 4, 0),
    "tpe defaults ×4 no liar": (lambda seed: TPE(seed=seed, constant_liar=False), "dedupe", 4, 0),
}
MODEL_GUIDED = {
    "cost-model top 30": (lambda seed: TPE(seed=seed), "dedupe", 1, BUDGET),
    "tpe + top 5 enqueued": (lambda seed: TPE(seed=seed), "dedupe", 1, 5),
}


class World:
    """Feasibility and predicted goodput from the cost model; "measured" goodput = prediction ×
    hidden error (none when sigma is 0)."""

    def __init__(self, estimates: dict, sigma: float, seed: int):
        rng = random.Random(seed)
        factor = {}
        self.measured = {}
        for candidate, est in estimates.items():
            if not est.feasible:
                continue
            error = rng.lognormvariate(0, CANDIDATE_NOISE) if sigma else 1.0
            for name in KNOB_NAMES:
                key = (name, getattr(candidate, name))
                if key not in factor:
                    factor[key] = rng.lognormvariate(0, sigma) if sigma else 1.0
                error *= factor[key]
            self.measured[candidate] = est.samples_per_s * error
        self.optimum = max(self.measured.values())
        self.ranked = sorted(self.measured, key=lambda c: -estimates[c].samples_per_s)


def run(world: World, space, sampler, protocol: str, concurrent: int, warm: int,
        cap: int) -> dict:
    """One study under the protocol of the module doc; stops after ``cap`` runs or 10×cap asks."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for candidate in world.ranked[:warm]:
        inactive = "grad_accum" if candidate.pp > 1 else "micro_batches"
        study.enqueue_trial({name: getattr(candidate, name) for name in space.searched()
                             if name != inactive})
    ran, runs, asks, best = {}, 0, 0, 0.0
    hit = at_budget = None
    while runs < cap and asks < 10 * cap:
        # Suggest for the whole batch before telling any, as concurrent workers would.
        batch = [(trial, space.sample(trial)[0]) for trial in
                 (study.ask() for _ in range(concurrent))]
        asks += concurrent
        for trial, candidate in batch:
            if candidate not in world.measured:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            if protocol == "dedupe" and candidate in ran:
                study.tell(trial, ran[candidate])
                continue
            ran[candidate] = world.measured[candidate]
            study.tell(trial, ran[candidate])
            runs += 1
            best = max(best, ran[candidate])
            if hit is None and best >= WITHIN * world.optimum:
                hit = (runs, asks)
            if runs == BUDGET:
                at_budget = (best / world.optimum, asks)
    return {"hit": hit, "at_budget": at_budget or (best / world.optimum, asks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cap", type=int, default=150, help="runs per study at most")
    parser.add_argument("--model-error", type=float, default=0.0, metavar="SIGMA")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    spec = load_spec(args.model)
    space = build_space(spec)
    estimates = {c: estimate(spec, c) for c in space.candidates()}
    exact = World(estimates, 0.0, 0)
    near = sum(v >= WITHIN * exact.optimum for v in exact.measured.values())
    print(f"{spec.study}: {len(estimates)} distinct candidates, {len(exact.measured)} feasible, "
          f"{near} within 3% of the exhaustive optimum {exact.optimum:.3f} samples/s:")
    print(f"  {exact.ranked[0]}")
    print(f"searched knobs: {', '.join(space.searched())}; model error σ = {args.model_error}"
          + (" (each seed's world is scored against its own optimum)" if args.model_error else "")
          + "\n")

    settings = dict(SETTINGS, **(MODEL_GUIDED if args.model_error else {}))
    head = (f"{'sampler':<26}{'seed':>5}{'runs to 3%':>12}{'(asks)':>8}{'best@30':>9}"
            f"{'(asks)':>8}")
    print(head)
    print("-" * len(head))
    results = {name: [] for name in settings}
    for seed in range(args.seeds):
        world = World(estimates, args.model_error, seed) if args.model_error else exact
        for name, (make, protocol, concurrent, warm) in settings.items():
            results[name].append(run(world, space, make(seed), protocol, concurrent, warm,
                                     args.cap))
    for name, rows in results.items():
        for seed, r in enumerate(rows):
            hit, hit_asks = r["hit"] or (f">{args.cap}", "-")
            print(f"{name:<26}{seed:>5}{hit:>12}{hit_asks:>8}{r['at_budget'][0]:>9.1%}"
                  f"{r['at_budget'][1]:>8}")
    print(f"\n{'sampler':<26}{'median runs to 3%':>19}{'median best@30':>16}"
          f"{'seeds ≥97% @30':>16}")
    for name, rows in results.items():
        hits = [r["hit"][0] if r["hit"] else math.inf for r in rows]
        at_budget = [r["at_budget"][0] for r in rows]
        median_hit = statistics.median(hits)
        shown = f">{args.cap}" if math.isinf(median_hit) else f"{median_hit:g}"
        print(f"{name:<26}{shown:>19}{statistics.median(at_budget):>16.1%}"
              f"{sum(b >= WITHIN for b in at_budget):>12}/{args.seeds}")


if __name__ == "__main__":
    main()
