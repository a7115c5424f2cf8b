"""The device check's step 8: trials that are MindFormers runs, on the device (docs/accelerators.md,
"The device check"). What the CPU cannot run — MindFormers' semi-auto parallel (tp), its fused
kernels, device memory — a 2-trial study runs here: the tiny llama of
tests/mindformers/tiny_llama_cpu.yaml (2 layers of width 64) on 2 devices, the grid of tp 1 and
2 (dp 2, then dp 1 · tp 2), every other knob at the config's own value, each trial MindFormers'
run_mindformer.py (the vendored r1.8.0 one) in MindFormers' venv (``make mindformers``) on a
synthetic MindRecord, through ``autotune search`` as a user runs it. One line per trial.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "mindformers" / "tiny_llama_cpu.yaml"
RUN_MINDFORMER = ROOT / "tests" / "mindformers" / "run_mindformer.py"
MF_PYTHON = ROOT / ".venv-mindformers" / "bin" / "python"
FIXED = {  # the tiny config's own values; tp is what the study searches
    "pp": 1,
    "micro_batches": 1,
    "grad_accum": 2,
    "fusion_mb": 64,
    "loss_scale": 65536,
    "warmup_steps": 0,
    "jit_level": "O1",
    "recompute": "none",
    "parallel_optimizer": False,
}
STUDY = "device-check-mindformers"


def plan(backend, devices: int) -> list[tuple[str, str]]:
    """Step 8 as the dry run says it: (name, what runs)."""
    if backend.no_mindformers:
        return [("8 mindformers", f"skipped: {backend.no_mindformers}")]
    if devices < 2:
        return [("8 mindformers", "skipped: a dp2 and a tp2 trial need --devices 2 or more")]
    steps = [] if MF_PYTHON.exists() else [("8 mindformers venv", f"make -C {ROOT} mindformers")]
    for tp in (1, 2):
        steps.append(
            (
                f"8 mindformers tp{tp}",
                f"MindFormers trial of the tiny llama, dp={2 // tp} tp={tp} (autotune search, "
                "trial.program mindformers, a synthetic MindRecord)",
            )
        )
    return steps


def check(backend, devices: int, work: Path, say, trial_line) -> None:
    """Run step 8, ``say``-ing one line per trial (``trial_line(result, folder)``)."""
    planned = plan(backend, devices)
    if planned[0][1].startswith("skipped"):
        say(*planned[0])
        return
    if not MF_PYTHON.exists():
        done = subprocess.run(["make", "-C", str(ROOT), "mindformers"], capture_output=True)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            say("8 mindformers venv", f"FAILED: {tail}", False)
            return
        say("8 mindformers venv", f"made {MF_PYTHON}")
    from autotune.jobs import Result
    from autotune.spec.mindformers_init import init_text
    from autotune.storage.connection import load_study
    from autotune.storage.schema import knobs_of, metrics_of, outcome_of

    folder = work / "mindformers"
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.yaml"
    text, _ = init_text(
        TINY,
        model,
        devices=2,
        devices_per_node=2,
        backend=backend.name,
        run_mindformer=str(RUN_MINDFORMER),
        python=str(MF_PYTHON),
        synthetic=True,
    )
    data = yaml.safe_load(text)
    data["study"] = STUDY
    data["search"]["space"] = {"tp": [1, 2], **{k: [v] for k, v in FIXED.items()}}
    data["trial"].update(steps=10, measure_after=2)
    model.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = f"sqlite:///{folder / 'study.db'}"
    artifacts = folder / "trials"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            str(model),
            "--sampler",
            "grid",
            "--no-confirm",
            "--storage",
            storage,
            "--artifacts",
            str(artifacts),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        say("8 mindformers", f"FAILED: autotune search: {done.stderr.strip()[-300:]}", False)
        return
    for trial in load_study(STUDY, storage).get_trials(deepcopy=False):
        knobs = knobs_of(trial)
        result = Result(
            outcome_of(trial),
            metrics_of(trial),
            trial.user_attrs.get("detail", ""),
            bool(trial.user_attrs.get("infrastructure")),
        )
        say(
            f"8 mindformers tp{knobs['tp']}",
            trial_line(result, artifacts / STUDY / str(trial.number)),
            result.outcome == "ok",
        )
