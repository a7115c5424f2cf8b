"""Every layout of a 2-device model, measured side by side on this CPU, beside the cost model.

For each (dp, tp, pp) layout the search space of MODEL_YAML allows — the baseline's and one per
other layout, as a study opens (`SearchSpace.layout_openers`) — runs the real trial program
through `autotune.execution.runner.run_trial` (msrun, pinned cores), interleaved over ``--rounds`` so machine
noise hits every layout alike, with no memory budget (so a layout over it is still measured), and
prints the median step time, each worker's peak RSS, and the cost model's estimate of both
(uncalibrated), with the model's per-worker budget (``cluster.device_memory_gb``) and the 90%
line the search screens against.

    python benchmarks/layouts_cpu.py [MODEL_YAML] [--rounds 2] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from autotune import costmodel  # noqa: E402
from autotune.execution.runner import run_trial  # noqa: E402
from autotune.spec.errors import SpecError  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_yaml", nargs="?", default=str(ROOT / "examples" / "tiny_gpt.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    try:
        spec = load_spec(
            args.model_yaml,
            {"trial.steps": args.steps, "trial.measure_after": min(5, args.steps - 1)},
        )
        space = build_space(spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    layouts = [space.baseline(), *space.layout_openers(spec)]
    profile = costmodel.resolve_profile(spec.cluster)
    work = Path(tempfile.mkdtemp(prefix="autotune-layouts-"))
    measured = {c: [] for c in layouts}
    try:
        for round_ in range(args.rounds):
            for i, c in enumerate(layouts):
                folder = work / f"{round_}-{i}"
                config = trial_config(
                    spec,
                    c,
                    study="layouts",
                    number=i,
                    out_dir=folder,
                    steps=spec.trial.steps,
                    measure_after=spec.trial.measure_after,
                )
                result = run_trial(config, folder, spec.trial.timeout_s, None, c.devices)
                ranks = [
                    json.loads(p.read_text()) for p in sorted(folder.glob("metrics.rank*.json"))
                ]
                measured[c].append(
                    (
                        result.outcome,
                        result.metrics.get("step_time_ms"),
                        [r["peak_memory_mb"] for r in ranks],
                    )
                )
                print(
                    f"round {round_ + 1}: dp{c.dp} tp{c.tp} pp{c.pp}: {result.outcome} "
                    f"{result.metrics.get('step_time_ms', float('nan')):.1f} ms/step",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    budget_mb = profile.memory_gb * 1024
    table = Table(
        title=f"{Path(args.model_yaml).name}: {args.rounds} interleaved rounds of "
        f"{args.steps} steps; budget {budget_mb:.0f} MB/worker "
        f"(screen at {costmodel.SAFETY_MARGIN:.0%}: {budget_mb * costmodel.SAFETY_MARGIN:.0f} MB)"
    )
    for column in (
        "layout",
        "knobs",
        "step ms (median)",
        "vs first",
        "est. step ms",
        "peak RSS MB per worker (max over rounds)",
        "est. MB",
        "fits",
    ):
        table.add_column(column, justify="right" if column not in ("layout", "knobs") else "left")
    first = None
    for c, runs in measured.items():
        ok = [t for _, t, _ in runs if t]  # diverged runs were timed too
        step_ms = statistics.median(ok) if ok else float("nan")
        first = first or step_ms
        peaks = [
            max(p[r] for _, _, p in runs if len(p) > r)
            for r in range(max(len(p) for *_, p in runs))
        ]
        est = costmodel.estimate(spec, c)
        table.add_row(
            f"dp{c.dp} tp{c.tp} pp{c.pp}",
            f"mb{c.micro_batches} ga{c.grad_accum} {c.jit_level} {c.recompute}",
            f"{step_ms:.1f}",
            f"{step_ms / first:.2f}×",
            f"{est.step_time_s * 1000:.1f}",
            " / ".join(f"{p:.0f}" for p in peaks),
            f"{est.memory_gb_per_device * 1024:.0f}",
            "yes" if est.feasible else "no (screened)",
        )
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
