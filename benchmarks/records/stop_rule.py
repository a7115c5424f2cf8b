# measured at ad2275d
# A decision record (docs/search.md, "How long a trial measures"): what chose the code as it is;
# not kept in step with later code.
"""What the stop rule of `trial.precision` measures and how long it takes, beside the rule before
it (docs/search.md, "How long a trial measures").

The rule (`autotune.train.metrics.StepLog`, run as `autotune.train.program` runs it): a pilot of
``min_steps`` measured steps plans the steps still to measure, and the estimate weighs the pilot
and those fresh steps by weights fixed before they are seen. The rule before it stopped at the
first step whose interval was narrow enough and averaged the same steps (kept here, as
``first_narrow``, to compare).

1. Simulated trials (no MindSpore): step times drawn independently from a normal of a given CV,
   or N(100, 3) ms with 6 % spikes at 300 ms; per rule, the mean over trials of the measured mean
   step time against the distribution's mean (throughput's truth is samples / that mean), how
   many trials stop early, the measured steps a trial ran.
2. Recorded trials (``steps.jsonl`` of trials that ran all their steps): each series replayed in
   its order through both rules, against the mean of all its measured steps.

    python benchmarks/records/stop_rule.py [--precision 0.02] [--min-steps 10] [--measured 25]
                                   [--trials 4000] [STUDY_TRIAL_FOLDER ...]   # e.g. trials/<study>
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.train.intervals import step_time_ci  # noqa: E402
from autotune.train.metrics import StepLog, backoff_steps  # noqa: E402

TIMING = {"started_at": 0.0, "init_s": 0.0, "first_step_s": 0.0, "probe_s": 0.0}


def first_narrow(times, overflows, measure_after, precision, min_steps) -> tuple[float, int]:
    """The rule before: (mean of the measured steps up to the first step at which the interval
    was within precision after min_steps settled steps, steps run)."""
    for n in range(1, len(times)):  # the last step ends the trial anyway
        start = max(measure_after, backoff_steps(overflows[:n]))
        if n - start >= min_steps:
            ci = step_time_ci(times[measure_after:n])
            if ci is not None and ci <= precision:
                return statistics.fmean(times[measure_after:n]), n
    return statistics.fmean(times[measure_after:]), len(times)


def pilot_and_block(times, overflows, measure_after, precision, min_steps) -> tuple[float, int]:
    """The rule (the program's loop on one rank, counting steps): (its estimate, steps run)."""
    log, i = StepLog(None, measure_after, 1, 10000, pilot_steps=min_steps), 0
    stop_at = None
    while i < len(times) and (stop_at is None or i < stop_at):
        log.add(i, times[i] / 1000.0, 1.0, overflows[i], 1024.0)
        i += 1
        if log.pilot_ended() and i < len(times):
            block = log.plan(precision, len(times) - i)
            stop_at = i + block if block < len(times) - i else None
    return 1000.0 / log.summary(TIMING, 0.0, 1024.0)["throughput"], i


RULES = {"first narrow (before)": first_narrow, "pilot + block (now)": pilot_and_block}


def _normal(rng, cv):
    return rng.gauss(100.0, 100.0 * cv)


def simulated(precision: float, min_steps: int, measured: int, trials: int) -> None:
    draws = {
        f"normal CV {cv:.0%}": (functools.partial(_normal, cv=cv), 100.0)
        for cv in (0.02, 0.03, 0.04, 0.06)
    }
    draws["N(100, 3) + 6 % at 300"] = (
        lambda rng: 300.0 if rng.random() < 0.06 else rng.gauss(100.0, 3.0),
        112.0,
    )
    steps = measured + 5
    print(
        f"simulated trials: {trials} per row, {steps} steps of which 5 excluded, min_steps "
        f"{min_steps}, precision {precision:.0%}"
    )
    print(
        f"{'steps':<24} {'rule':<22} {'mean step vs truth':>18} {'stop early':>10} "
        f"{'measured steps':>14}"
    )
    for name, (draw, truth) in draws.items():
        for rule_name, rule in RULES.items():
            rng = random.Random(28)
            means, ran = [], []
            for _ in range(trials):
                times = [draw(rng) for _ in range(steps)]
                mean, n = rule(times, [False] * steps, 5, precision, min_steps)
                means.append(mean)
                ran.append(n - 5)
            early = sum(n < measured for n in ran) / trials
            print(
                f"{name:<24} {rule_name:<22} {statistics.fmean(means) / truth - 1:>+17.2%} "
                f"{early:>10.0%} {statistics.fmean(ran):>14.1f}"
            )


def recorded(folders: list, precision: float, min_steps: int) -> None:
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
            runs.append(
                (
                    [r["step_time_ms"] for r in records],
                    [r["overflow"] for r in records],
                    trial["measure_after"],
                )
            )
    print(
        f"\n{len(runs)} recorded trials that ran all their steps, replayed in order "
        f"(min_steps {min_steps}, precision {precision:.0%}): each rule's mean step time against "
        "the mean of all the trial's measured steps"
    )
    for rule_name, rule in RULES.items():
        errors, ran, full = [], 0, 0
        for times, overflows, measure_after in runs:
            mean, n = rule(times, overflows, measure_after, precision, min_steps)
            errors.append(mean / statistics.fmean(times[measure_after:]) - 1)
            ran, full = ran + n, full + len(times)
        if errors:
            print(
                f"  {rule_name:<22} mean {statistics.fmean(errors):+.2%}, from "
                f"{min(errors):+.2%} to {max(errors):+.2%}; {ran} of {full} steps run"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="a study's trial folders (trials/<study>)")
    parser.add_argument("--precision", type=float, default=0.02)
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--measured", type=int, default=25)
    parser.add_argument("--trials", type=int, default=4000)
    args = parser.parse_args()
    simulated(args.precision, args.min_steps, args.measured, args.trials)
    if args.folders:
        recorded(args.folders, args.precision, args.min_steps)


if __name__ == "__main__":
    main()
