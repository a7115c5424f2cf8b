"""Cost model vs measured, on the real trials of a CPU study (e.g. the one `make search` ran).

Every ok trial stores the estimate it was admitted with beside its measured peak memory and
step time; this prints both with the error per trial, and the per-study calibration factors.

    python benchmarks/costmodel_cpu.py STUDY [--storage sqlite:///trials/autotune.db]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.spec.errors import SpecError  # noqa: E402
from autotune.storage.connection import load_study  # noqa: E402
from autotune.storage.schema import knobs_of, outcome_of  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("--storage")
    args = parser.parse_args()
    try:
        study = load_study(args.study, args.storage)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    rows = [
        t
        for t in study.trials
        if outcome_of(t) == "ok"
        and "repeat_of" not in t.user_attrs
        and t.user_attrs.get("estimate")
    ]
    print(
        f"{'trial':>5} {'jit':>8} {'recompute':>9} {'accum':>5} | {'mem est':>7} {'meas':>6} "
        f"{'err':>6} | {'step est':>8} {'meas':>7} {'err':>6}"
    )
    mem_err, time_err = [], []
    for t in rows:
        knobs, est = knobs_of(t), t.user_attrs["estimate"]
        mem_est, mem = est["memory_gb_per_device"] * 1024, t.user_attrs["peak_memory_mb"]
        step_est, step = est["step_time_s"] * 1000, t.user_attrs["step_time_ms"]
        mem_err.append(mem_est / mem - 1)
        time_err.append(step_est / step - 1)
        print(
            f"{t.number:>5} {knobs['jit_level']:>8} {knobs['recompute']:>9} "
            f"{knobs['grad_accum']:>5} | {mem_est:7.0f} {mem:6.0f} {mem_err[-1]:+6.1%} | "
            f"{step_est:8.1f} {step:7.1f} {time_err[-1]:+6.1%}"
        )
    if rows:
        print(
            f"\npeak memory: median |error| {statistics.median(map(abs, mem_err)):.1%}, "
            f"worst {max(mem_err, key=abs):+.1%} over {len(rows)} trials"
        )
        print(
            f"step time:   median |error| {statistics.median(map(abs, time_err)):.1%}, "
            f"worst {max(time_err, key=abs):+.1%}"
        )
    print(f"calibration stored with the study: {study.user_attrs.get('calibration')}")


if __name__ == "__main__":
    main()
