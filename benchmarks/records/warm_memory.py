# measured at 200f801
# A MindSpore fact check (docs/mindspore-cpu.md, "Warm workers"): re-run it after a MindSpore
# upgrade.
"""What a process that trains one model after another keeps between them (docs/mindspore-cpu.md,
"Warm workers").

The tiny GPT's model (one process, dp1) trained N times in one process through the trial
program's own calls (`autotune.train.program.run_trial` in one session), freed between trials as
a warm worker frees them (`autotune.train.runtime.serve.release`), against one trial in a fresh
process. Prints per trial: the resident set before it, its raw peak (VmHWM after the reset the
trial makes once its network is built), the resident set once released, and the peak less what
earlier trials left (``leftover_mb``, what a warm worker reports), and how long the release took.
``--accumulations 1,8`` runs trials of different sizes one after another instead (gradient
accumulation 1 then 8; ``--batch`` sets the global batch), each against the same trial in a
fresh process: what a warm pool that mixed sizes would read (it no longer does:
`autotune.execution.warm.SAME_SIZE`).

    python benchmarks/records/warm_memory.py [--trials 5] [--accumulations 1,8 --batch 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def trials(accumulations: list[int], batch: int | None, folder: Path) -> list[dict]:
    """One trial per accumulation in ``accumulations``, in this process; one row each."""
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.train import program
    from autotune.train.config import trial_config
    from autotune.train.metrics import resident_mb
    from autotune.train.runtime.serve import release

    spec = load_spec(
        ROOT / "examples" / "tiny_gpt.yaml", {"train.global_batch_size": batch} if batch else None
    )
    candidate = build_space(spec).baseline().replace(dp=1)
    session, settled, rows = None, None, []
    for k, accumulation in enumerate(accumulations):
        out = folder / str(k)
        config = trial_config(
            spec,
            candidate.replace(grad_accum=accumulation),
            study="m",
            number=k,
            out_dir=out,
            steps=spec.trial.steps,
            measure_after=spec.trial.measure_after,
        )
        session = session or program.open_trial_session(config)
        before = resident_mb()
        leftover = max(0.0, before - settled) if settled is not None else 0.0
        program.run_trial(config, session, time.time())
        raw = json.loads((out / "metrics.rank0.json").read_text())["peak_memory_mb"]
        released_at = time.perf_counter()
        release(session)
        release_ms = (time.perf_counter() - released_at) * 1000
        settled = resident_mb() if settled is None else settled
        rows.append(
            {
                "accumulation": accumulation,
                "before": before,
                "raw_peak": raw,
                "released": resident_mb(),
                "peak": raw - leftover,
                "release_ms": release_ms,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--accumulations", help="e.g. 1,8: trials of these accumulations in turn")
    parser.add_argument("--batch", type=int, help="the global batch (default: the tiny GPT's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batch = ["--batch", str(args.batch)] if args.batch else []
    with tempfile.TemporaryDirectory(prefix="autotune-warm-memory-") as work:
        if args.child:
            accumulations = [int(a) for a in args.child.split(",")]
            print(json.dumps(trials(accumulations, args.batch, Path(work))), flush=True)
            return

        def child(accumulations) -> list[dict]:
            run = [sys.executable, __file__, *batch, "--child", ",".join(map(str, accumulations))]
            return json.loads(
                subprocess.run(run, capture_output=True, text=True, check=True).stdout.splitlines()[
                    -1
                ]
            )

        sequence = (
            [int(a) for a in args.accumulations.split(",")]
            if args.accumulations
            else [1] * args.trials
        )
        fresh = {a: child([a])[0]["raw_peak"] for a in sorted(set(sequence))}
        warm = child(sequence)
    print(
        "\ntiny GPT model, one process (MB); a fresh process's trial peaks at "
        + ", ".join(f"{peak:.0f} (accumulation {a})" for a, peak in fresh.items())
        + "\n"
    )
    print(
        f"{'trial':>5} | {'accum':>5} | {'before':>6} | {'raw peak':>8} | {'released':>8} | "
        f"{'peak less leftover':>18} | vs fresh | release ms"
    )
    for k, r in enumerate(warm):
        print(
            f"{k:>5} | {r['accumulation']:>5} | {r['before']:6.0f} | {r['raw_peak']:8.0f} | "
            f"{r['released']:8.0f} | {r['peak']:18.0f} | "
            f"{r['peak'] / fresh[r['accumulation']] - 1:>+8.1%} | {r['release_ms']:10.0f}"
        )


if __name__ == "__main__":
    main()
