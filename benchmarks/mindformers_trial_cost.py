"""What a MindFormers trial costs against autotune's own trainer on the same shape, side by side,
and whether MindSpore's compile cache makes a re-run of the same candidate compile faster under
MindFormers.

The shape: the tiny llama of tests/mindformers/tiny_llama_cpu.yaml (2 layers of width 64, seq 32,
vocab 128, float16 compute, global batch 8) at its own layout, dp 2 with 2 accumulated
micro-batches (MindFormers' CPU form folds them into a batch of 4 per rank), ``trial.steps`` 10
after 2 excluded, every trial in processes of its own (autotune's warm pools aside: a MindFormers
trial has none). Runs, each round interleaved so machine noise hits all:

- trainer:      autotune's trainer (``python -m autotune.train`` under msrun), its graph-keyed
                compile cache off;
- mindformers:  MindFormers' run_mindformer.py on the trial's config (``trial.program:
                mindformers``, a synthetic MindRecord);
- mf+cache:     the same with MindSpore's own compile cache (``MS_COMPILER_CACHE_ENABLE=1``,
                ``MS_COMPILER_CACHE_PATH`` a folder of this run's): the first round fills it,
                later rounds load it (what a confirm re-run of the candidate would see).

Prints one row per run — the time split as the study stores it (autotune.jobs.TIME_PARTS),
compile_s, the median measured step, the run's wall — then per kind the medians and each
MindFormers kind's ratio to the trainer's.

    python benchmarks/mindformers_trial_cost.py [--rounds 2] [--kinds trainer mindformers mf+cache]

Needs ``make mindformers`` (.venv-mindformers).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.execution.runner import fresh_trial_dir, run_trial  # noqa: E402
from autotune.jobs import TIME_PARTS  # noqa: E402
from autotune.mindformers.data import synthetic_dataset  # noqa: E402
from autotune.mindformers.trial import SECTION, trial_section  # noqa: E402
from autotune.spec.mindformers_init import init_text  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402

KINDS = ("trainer", "mindformers", "mf+cache")
TINY = ROOT / "tests" / "mindformers" / "tiny_llama_cpu.yaml"
RUN_MINDFORMER = ROOT / "tests" / "mindformers" / "run_mindformer.py"
MF_PYTHON = ROOT / ".venv-mindformers" / "bin" / "python"
SHORT = {
    "launch_s": "launch",
    "init_s": "init",
    "first_step_s": "first",
    "excluded_steps_s": "excl",
    "steps_s": "steps",
    "probe_s": "probe",
    "teardown_s": "down",
}


def specs(folder: Path):
    """(autotune's trainer's spec, MindFormers trials' spec) of the tiny llama."""
    out = folder / "model.yaml"
    text, _ = init_text(TINY, out, backend="cpu")
    data = yaml.safe_load(text)
    data["trial"] = {"steps": 10, "measure_after": 2}
    out.write_text(yaml.safe_dump(data))
    trainer = load_spec(out)
    data["trial"].update(
        program="mindformers",
        run_mindformer=str(RUN_MINDFORMER),
        python=str(MF_PYTHON),
        data="synthetic",
    )
    mf = folder / "mf.yaml"
    mf.write_text(yaml.safe_dump(data))
    return trainer, load_spec(mf)


def run(kind: str, spec, data: str, folder: Path, cache: Path) -> tuple[dict, float]:
    c = build_space(spec).baseline()
    fresh_trial_dir(folder)
    config = trial_config(
        spec, c, study=spec.study, number=0, out_dir=folder, steps=10, measure_after=2
    )
    env = {}
    if kind != "trainer":
        config.update(
            program=spec.trial.program, **{SECTION: trial_section(spec, c, 0, folder, data)}
        )
    if kind == "mf+cache":
        env = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache)}
    began = time.monotonic()
    result = run_trial(config, folder, 600, None, c.devices, env=env)
    wall = time.monotonic() - began
    if result.outcome != "ok":
        raise SystemExit(f"{kind}: {result.outcome}: {result.detail[:2000]}")
    return result.metrics, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    if not MF_PYTHON.exists():
        raise SystemExit(f"{MF_PYTHON} is missing: make mindformers")
    folder = Path(tempfile.mkdtemp(prefix="mf-trial-cost-"))
    try:
        trainer, mf = specs(folder)
        data = synthetic_dataset(mf, folder / "data")
        rows = []
        for round_ in range(args.rounds):
            for kind in args.kinds:
                spec = trainer if kind == "trainer" else mf
                metrics, wall = run(kind, spec, data, folder / "trial", folder / "cache")
                rows.append((round_, kind, metrics, wall))
        head = " ".join(f"{SHORT[p]:>7}" for p in TIME_PARTS)
        print(f"{'round':>5} {'kind':<12} {head} {'compile':>8} {'ms/step':>8} {'wall':>6}")
        for round_, kind, m, wall in rows:
            parts = " ".join(f"{m.get(p) or 0.0:7.2f}" for p in TIME_PARTS)
            print(
                f"{round_:>5} {kind:<12} {parts} {m['compile_s']:8.2f} "
                f"{m['step_time_ms']:8.1f} {wall:6.1f}"
            )
        print("\nmedians (ratio to the trainer's)")
        keys = ("launch_s", "init_s", "first_step_s", "compile_s", "step_time_ms", "teardown_s")
        medians = {
            kind: {
                k: statistics.median(m[k] for _, name, m, _ in rows if name == kind) for k in keys
            }
            | {"wall": statistics.median(w for _, name, _, w in rows if name == kind)}
            for kind in args.kinds
        }
        print(f"{'kind':<12} " + " ".join(f"{k:>16}" for k in (*keys, "wall")))
        base = medians.get("trainer")
        for kind, values in medians.items():
            cells = []
            for k, v in values.items():
                ratio = f" ({v / base[k]:.2f}×)" if base and base[k] else ""
                cells.append(f"{v:9.2f}{ratio:>7}")
            print(f"{kind:<12} " + " ".join(f"{c:>16}" for c in cells))
        if "mf+cache" in args.kinds and args.rounds > 1:
            cached = [m for r, name, m, _ in rows if name == "mf+cache" and r > 0]
            cold = [m for r, name, m, _ in rows if name == "mf+cache" and r == 0]
            print(
                f"\ncompile cache: first step {cold[0]['first_step_s']:.2f} s cold, "
                f"{statistics.median(m['first_step_s'] for m in cached):.2f} s warm "
                f"(median of {len(cached)})"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
