"""What autotune adds to a trial's time: bare MindSpore run vs runner vs full search dispatch.

Runs the same candidates (the quickstart model, fusion_mb 1/16/256, other knobs at their
baseline) three ways, side by side in one process so machine noise hits all alike:

- bare:       the trial program launched by hand (``msrun`` with 2 workers), as a user would;
- runner:     ``autotune.execution.runner.run_trial`` (config.json, supervision, outcome classification);
- dispatched: ``autotune search`` through an embedded Ray and SQLite storage (ask, feasibility,
              submit, Ray task, tell), timed per trial from submit to result, plus the one-time
              Ray start-up and shut-down.

    python benchmarks/overhead.py [--rounds 2] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from autotune.study.progress import Progress  # noqa: E402
from autotune.execution.runner import environment, command, free_port, run_trial  # noqa: E402
from autotune.storage.schema import knobs_of  # noqa: E402
from autotune.study.run import run_study  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402

FUSION = [1, 16, 256]


def _config(spec, candidate, folder: Path) -> dict:
    return trial_config(spec, candidate, study="overhead", number=0, out_dir=folder,
                        steps=spec.trial.steps, measure_after=spec.trial.measure_after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    fixed = {"fusion_mb": FUSION, "grad_accum": 1, "loss_scale": 1024, "warmup_steps": 100,
             "jit_level": "O1", "recompute": "none"}
    spec = load_spec(ROOT / "examples" / "quickstart.yaml",
                     {"trial.steps": args.steps, "search.sampler": "grid", "search.objectives": ["goodput"]})
    space = build_space(spec, fixed)
    candidates = list(space.candidates())
    work = Path(tempfile.mkdtemp(prefix="autotune-overhead-"))
    bare, runner, dispatched, startup = {}, {}, {}, []
    for round_ in range(args.rounds):
        for c in candidates:
            folder = work / f"bare{round_}-{c.fusion_mb}"
            folder.mkdir()
            config = _config(spec, c, folder)
            (folder / "config.json").write_text(json.dumps(config))
            t = time.monotonic()
            subprocess.run(command(folder / "config.json", c.devices, folder / "logs", free_port(),
                                   bind_cores=True),
                           env=environment(), cwd=folder, check=True, capture_output=True)
            bare.setdefault(c.fusion_mb, []).append(time.monotonic() - t)

            folder = work / f"runner{round_}-{c.fusion_mb}"
            result = run_trial(_config(spec, c, folder), folder, 600, None, c.devices)
            assert result.outcome == "ok", result.detail
            runner.setdefault(c.fusion_mb, []).append(result.run_s)

        t = time.monotonic()
        study = run_study(spec, space, storage=f"sqlite:///{work}/s{round_}.db",
                          study_name="overhead", n_trials=len(candidates), resume=False,
                          artifacts=work / f"search{round_}", progress=Progress(Console(quiet=True)))
        total = time.monotonic() - t
        trials = [t for t in study.trials if "wall_s" in t.user_attrs]
        for t in trials:
            dispatched.setdefault(knobs_of(t)["fusion_mb"], []).append(
                (t.user_attrs["wall_s"], t.user_attrs["driver_s"]))
        startup.append(total - sum(t.user_attrs["wall_s"] for t in trials))

    print(f"\n{args.steps} steps per trial, dp = 2 on CPU, median of {args.rounds} rounds "
          f"(seconds)\n")
    print(f"{'fusion_mb':>9} | {'bare':>6} | {'runner':>6} | {'dispatched':>10} | "
          f"{'driver':>6} | {'overhead vs bare':>16}")
    print("-" * 70)
    shares = []
    for mb in FUSION:
        b, r = statistics.median(bare[mb]), statistics.median(runner[mb])
        d = statistics.median(w for w, _ in dispatched[mb])
        drv = statistics.median(x for _, x in dispatched[mb])
        shares.append((d + drv - b) / b)
        print(f"{mb:>9} | {b:6.2f} | {r:6.2f} | {d:10.2f} | {drv:6.3f} | {shares[-1]:+15.1%}")
    print(f"\nper-trial overhead of driver + Ray + launch: median {statistics.median(shares):+.1%} "
          f"of a bare run")
    print(f"one-time Ray start-up + shut-down + study setup per search: "
          f"{statistics.median(startup):.1f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
