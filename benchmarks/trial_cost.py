"""What a trial costs beside what it measures: the tiny GPT's dp2, tp2 and pp2 trials (and dp2
at another fusion threshold) with each lever off and on, side by side.

Levers (each a column group of the table, the rounds interleaved so machine noise hits all):

- fresh:        every trial in processes of its own (msrun, cluster join, compile, teardown);
- warm:         the trials one after another in workers that stay up (autotune.execution.warm;
                one pool for the whole run, as a study keeps it: its first trial pays the start);
- warm+cache:   the same with the graph-keyed compile cache (autotune.train.runtime.compile_cache); the
                first round fills it, later rounds load it (what a confirm re-run sees); the
                dp2 trial at fusion 1 loads the dp2 trial's graphs in every round (no graph
                holds the fusion threshold: what a search candidate that differs in it sees).

Every trial is the tiny GPT's (examples/tiny_gpt.yaml: 30 steps, 5 excluded from timing),
its time split as the study stores it (autotune.jobs.TIME_PARTS). Prints one row per trial run
and, per lever, the median trial's fixed time (run − measured steps) ÷ its measured steps and
the total seconds. ``--stop-rule`` gives every trial the stop rule of a study without
final_loss (the tiny GPT has it, so its trials run every step): ``trial.precision`` and
``min_steps`` at their defaults.

    python benchmarks/trial_cost.py [--rounds 2] [--levers fresh warm warm+cache] [--stop-rule]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune import costmodel  # noqa: E402
from autotune.execution.runner import run_trial  # noqa: E402
from autotune.execution.warm import WarmPool  # noqa: E402
from autotune.jobs import TIME_PARTS  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402

LEVERS = ("fresh", "warm", "warm+cache")
SHORT = {
    "launch_s": "launch",
    "init_s": "init",
    "first_step_s": "first",
    "excluded_steps_s": "excl",
    "steps_s": "steps",
    "probe_s": "probe",
    "teardown_s": "down",
}


def candidates(spec):
    baseline = build_space(spec).baseline()  # dp2, as the tiny GPT study starts
    return {
        "dp2": baseline,
        "dp2 f1": baseline.replace(fusion_mb=1),
        "tp2": baseline.replace(dp=1, tp=2),
        "pp2": baseline.replace(dp=1, pp=2, micro_batches=2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=LEVERS)
    parser.add_argument(
        "--stop-rule",
        action="store_true",
        help="trials of a study without final_loss (the stop rule)",
    )
    args = parser.parse_args()
    spec = load_spec(
        ROOT / "examples" / "tiny_gpt.yaml",
        {"search.objectives": ["goodput"]} if args.stop_rule else None,
    )
    work = Path(tempfile.mkdtemp(prefix="autotune-trial-cost-"))
    pools = {
        lever: WarmPool(work / f"pool-{lever}", 2) for lever in args.levers if lever != "fresh"
    }
    rows = []
    try:
        for round_ in range(args.rounds):
            levers = (
                args.levers[round_ % len(args.levers) :] + args.levers[: round_ % len(args.levers)]
            )
            for lever in levers:
                for name, candidate in candidates(spec).items():
                    folder = work / f"{lever}-{round_}-{name.replace(' ', '-')}"
                    cache = work / "cache" if lever == "warm+cache" else None
                    config = trial_config(
                        spec,
                        candidate,
                        study="cost",
                        number=0,
                        out_dir=folder.resolve(),
                        steps=spec.trial.steps,
                        measure_after=spec.trial.measure_after,
                        stop_rule=spec.stop_rule(),
                        compile_cache=cache,
                    )
                    # the pool runs one size of trial, by the estimate the driver gives it
                    size_mb = costmodel.estimate(spec, candidate).memory_gb_per_device * 1024
                    result = (
                        run_trial(config, folder, 600, None, candidate.devices)
                        if lever == "fresh"
                        else pools[lever].run(config, folder, 600, None, size_mb)
                    )
                    if result.outcome != "ok":
                        raise SystemExit(
                            f"{lever} {name}: {result.outcome}: {result.detail[:2000]}"
                        )
                    parts = {p: result.metrics[p] for p in TIME_PARTS}
                    rows.append((lever, round_, name, parts, result.run_s))
                    print(
                        f"  {lever:>10} round {round_} {name}: run {result.run_s:.1f} s", flush=True
                    )
    finally:
        for pool in pools.values():
            pool.close()
        shutil.rmtree(work, ignore_errors=True)

    rule = f", stop rule {spec.stop_rule()}" if spec.stop_rule() else ""
    print(
        f"\ntiny GPT trials ({spec.trial.steps} steps, {spec.trial.measure_after} excluded"
        f"{rule}), seconds; fixed = run − measured steps\n"
    )
    header = " | ".join(f"{SHORT[p]:>6}" for p in TIME_PARTS)
    print(
        f"{'lever':>10} | {'rd':>2} | {'trial':>6} | {header} | {'run':>6} | {'fixed':>6} | fixed/steps"
    )
    print("-" * (50 + 9 * len(TIME_PARTS)))
    for lever, round_, name, parts, run_s in rows:
        fixed = run_s - parts["steps_s"]
        cells = " | ".join(f"{parts[p]:6.2f}" for p in TIME_PARTS)
        print(
            f"{lever:>10} | {round_:>2} | {name:>6} | {cells} | {run_s:6.1f} | {fixed:6.1f} | "
            f"{fixed / parts['steps_s']:.2f}"
        )
    print(f"\n{'lever':>10} | median fixed/steps | total run s | vs fresh")
    totals = {}
    for lever in args.levers:
        mine = [(run_s, parts) for lv, _, _, parts, run_s in rows if lv == lever]
        ratios = [(run_s - parts["steps_s"]) / parts["steps_s"] for run_s, parts in mine]
        totals[lever] = sum(run_s for run_s, _ in mine)
        against = f"{totals[lever] / totals['fresh']:.2f}×" if "fresh" in totals else ""
        print(
            f"{lever:>10} | {statistics.median(ratios):18.2f} | {totals[lever]:11.1f} | {against}"
        )


if __name__ == "__main__":
    main()
