"""What the stop rule of `trial.precision` costs in accuracy and saves in steps (docs/search.md,
"How long a trial measures").

1. Accuracy (no MindSpore): trials of independent normal step times of a given CV are run
   through the rule (`autotune.train.metrics.step_time_ci`, checked at every step from
   ``min_steps`` on, as `autotune.train.program` checks it); printed, for each CV, how many stop
   early and, of those, how often the mean they stopped on is more than ``precision`` off the
   true mean (the interval's nominal miss rate is 5 %; stopping at the first narrow interval
   makes it somewhat optimistic).
2. Savings (with trial folders): the rule applied to recorded ``steps.jsonl`` files of trials
   that ran all their steps — where each would have stopped at each precision.

    python benchmarks/stop_rule.py [--precision 0.02] [--min-steps 10] [--measured 25]
                                   [STUDY_TRIAL_FOLDER ...]   # e.g. trials/<study>
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.train.metrics import backoff_steps, step_time_ci  # noqa: E402


def stops_at(times: list, overflows: list, measure_after: int, precision: float,
             min_steps: int) -> int | None:
    """The step count after which the rule stops a trial of these steps, None if it does not."""
    for n in range(1, len(times)):  # the last step ends the trial anyway
        start = max(measure_after, backoff_steps(overflows[:n]))
        if n - start >= min_steps:
            ci = step_time_ci(times[measure_after:n])
            if ci is not None and ci <= precision:
                return n
    return None


def accuracy(precision: float, min_steps: int, measured: int, trials: int) -> None:
    rng = random.Random(0)
    print(f"independent normal steps, {measured} measured, min_steps {min_steps}, precision "
          f"{precision:.0%}:")
    for cv in (0.02, 0.03, 0.04, 0.05, 0.06):
        early = missed = 0
        for _ in range(trials):
            times = [rng.gauss(1.0, cv) for _ in range(measured)]
            n = stops_at(times, [False] * measured, 0, precision, min_steps)
            if n is not None:
                early += 1
                missed += abs(statistics.fmean(times[:n]) - 1.0) > precision
        share = f"{missed / early:.1%} of them off by more than ±{precision:.0%}" if early else "-"
        print(f"  step-time CV {cv:.0%}: {early / trials:.0%} stop early; {share}")


def savings(folders: list, min_steps: int) -> None:
    runs = []
    for folder in folders:
        for steps in sorted(Path(folder).glob("*/steps.jsonl")):
            metrics_path, config_path = steps.parent / "metrics.json", steps.parent / "config.json"
            if not metrics_path.exists() or not config_path.exists():
                continue  # pruned, failed
            trial = json.loads(config_path.read_text())["trial"]
            metrics = json.loads(metrics_path.read_text())
            if metrics["applied_steps"] < trial["steps"]:
                continue  # stopped early already: what it would have run is not on record
            records = [json.loads(line) for line in steps.read_text().splitlines()]
            runs.append(([r["step_time_ms"] for r in records], [r["overflow"] for r in records],
                         trial["measure_after"]))
    print(f"{len(runs)} recorded trials that ran all their steps:")
    for precision in (0.02, 0.03, 0.05, 0.10):
        ran = [stops_at(t, o, m, precision, min_steps) or len(t) for t, o, m in runs]
        full = sum(len(t) for t, _, _ in runs)
        early = sum(n < len(t) for n, (t, _, _) in zip(ran, runs))
        print(f"  precision {precision:.0%}: {early} stop early, {sum(ran)} of {full} steps "
              f"({1 - sum(ran) / full:.0%} fewer), median {statistics.median(ran):g} a trial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="a study's trial folders (trials/<study>)")
    parser.add_argument("--precision", type=float, default=0.02)
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--measured", type=int, default=25)
    parser.add_argument("--trials", type=int, default=4000)
    args = parser.parse_args()
    accuracy(args.precision, args.min_steps, args.measured, args.trials)
    if args.folders:
        savings(args.folders, args.min_steps)


if __name__ == "__main__":
    main()
