"""A study whose trials are MindFormers' own runs, on this CPU (slow tier, ``.venv-mindformers``).

One real study of the tiny llama (`tests/mindformers/tiny_llama_cpu.yaml`: 2 layers of width 64
over MindFormers' Llama 3.1 8B config) on 2 data-parallel ranks, every trial MindFormers'
``run_mindformer.py`` on the export's config of its candidate (recompute, loss scale, warmup, jit
level), a synthetic MindRecord, through Ray, the runner and msrun; the confirm phase re-runs the
best and the baseline through MindFormers. Then two runs forced past the space's screen through
the same runner: a parallel optimizer MindFormers refuses on CPU at start-up (``infeasible``) and
a data-parallel-1 run whose learning rate of 30 diverges. Then the winner is exported and its
``mindformers.yaml`` run by ``run_mindformer.py`` through the export's ``launch.sh
--mindformers``: its losses are the trial's, step for step, and its step time the trial's within
the study's noise floor. The study prints its time (docs/mindformers.md records it).
"""

import json
import re
import shlex
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from autotune.cli import main
from autotune.execution.runner import run_trial
from autotune.jobs import TIME_PARTS
from autotune.mindformers.trial import SECTION, trial_section
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from autotune.storage.connection import load_study
from autotune.storage.schema import knobs_of, metrics_of, outcome_of
from autotune.train.config import trial_config
from tests.mindformers.conftest import RUN_MINDFORMER, mf_python, mindformers_model

pytestmark = pytest.mark.slow

STEPS = 6  # the trial's updates, and the schedule's: the export's run is the trial's, longer
SPACE = {  # what MindFormers runs on this CPU, 16 candidates of which the study tries 4
    "recompute": ["none", "full"],
    "loss_scale": [4096, 65536],
    "warmup_steps": [0, 2],
    "jit_level": ["O0", "O1"],
    "fusion_mb": [64],
}
SEED = 5  # the random sampler's: its 3 candidates and the baseline take both values of each knob
LOSS_LINE = re.compile(
    r"step:\[\s*(\d+)/\s*\d+\], loss:\[\s*([0-9.naNinf+-]+)/.*per_step_time: (\d+)ms"
)


def _logged(log: Path) -> list[tuple[int, str, int]]:
    """MFLossMonitor's (step, rank 0's loss as printed, per_step_time ms) lines of a worker log."""
    return [
        (int(m.group(1)), m.group(2), int(m.group(3)))
        for m in map(LOSS_LINE.search, log.read_text(errors="replace").splitlines())
        if m
    ]


def _forced(spec, knobs: dict, edits: dict, trial_dir: Path, data: str):
    """A MindFormers trial of ``knobs`` with ``edits`` written into its trial.yaml — past the
    space's screen — run by the runner as a study's trial would be."""
    c = Candidate(**{**build_space(spec).baseline().as_dict(), **knobs})
    config = trial_config(
        spec, c, study=spec.study, number=0, out_dir=trial_dir, steps=STEPS, measure_after=1
    )
    config.update(
        program=spec.trial.program, **{SECTION: trial_section(spec, c, 0, trial_dir, data)}
    )
    document = yaml.safe_load(config[SECTION]["trial_yaml"])
    for dotted, value in edits.items():
        *parents, last = dotted.split(".")
        node = document
        for part in parents:
            node = node[part]
        node[last] = value
    config[SECTION]["trial_yaml"] = yaml.safe_dump(document)
    return run_trial(config, trial_dir, 600, None, c.devices)


def test_a_study_of_mindformers_trials_runs_classifies_and_exports_what_ran(tmp_path, capsys):
    python = mf_python()
    checkout = tmp_path / "mf"  # the user's checkout: trials must leave nothing in it
    checkout.mkdir()
    shutil.copy(RUN_MINDFORMER, checkout)
    settings = {
        "trial.run_mindformer": str(checkout / RUN_MINDFORMER.name),
        "trial.steps": STEPS,
        "trial.measure_after": 1,
        "train.total_steps": STEPS,
        "search.space": SPACE,
        "search.sampler": "random",
        "search.seed": SEED,
    }
    model = mindformers_model(tmp_path, python, **settings)
    storage, artifacts = f"sqlite:///{tmp_path}/s.db", tmp_path / "trials"
    began = time.monotonic()
    args = ["search", str(model), "--storage", storage, "--artifacts", str(artifacts)]
    assert main([*args, "--trials", "4", "--confirm", "1", "--confirm-runs", "1"]) == 0
    searched = time.monotonic() - began
    study = load_study("tiny_llama_cpu", storage)
    trials = study.get_trials(deepcopy=False)
    ran = [t for t in trials if "confirm_of" not in t.user_attrs]
    assert len(ran) == 4 and all(outcome_of(t) == "ok" for t in trials), [
        (t.number, outcome_of(t), t.user_attrs.get("detail", "")[:300]) for t in trials
    ]
    assert len({tuple(sorted(knobs_of(t).items())) for t in ran}) == 4
    for knob, values in SPACE.items():  # else pick another SEED: the sampler's draws changed
        assert {knobs_of(t)[knob] for t in ran} == set(values), (knob, SEED)
    for t in trials:  # every trial's metrics and where its time went
        metrics = metrics_of(t)
        assert all(metrics[part] is not None and metrics[part] >= 0 for part in TIME_PARTS), (
            t.number
        )
        folder = artifacts / "tiny_llama_cpu" / str(t.number)
        written = json.loads((folder / "metrics.json").read_text())
        assert (
            metrics["first_step_s"] > 0 and written["steps"] >= STEPS and metrics["loss_first"] > 4
        )
        config = json.loads((folder / "config.json").read_text())
        ran_yaml = yaml.safe_load(config[SECTION]["trial_yaml"])
        knobs = knobs_of(t)  # the candidate is in the config MindFormers ran
        assert ran_yaml["recompute_config"]["recompute"] == (knobs["recompute"] == "full")
        assert ran_yaml["context"]["jit_config"]["jit_level"] == knobs["jit_level"]
        assert ran_yaml["runner_wrapper"]["scale_sense"]["loss_scale_value"] == knobs["loss_scale"]
        assert ran_yaml["lr_schedule"]["warmup_steps"] == knobs["warmup_steps"]
    # the noise floor, run to run: each configuration the confirm phase ran again, |a - b| / mean
    pairs = {}
    for t in trials:
        pairs.setdefault(t.user_attrs.get("confirm_of", t.number), []).append(
            metrics_of(t)["step_time_ms"]
        )
    floor = statistics.median(
        abs(a - b) / ((a + b) / 2) for a, b in [p for p in pairs.values() if len(p) == 2]
    )
    assert list(checkout.iterdir()) == [checkout / RUN_MINDFORMER.name]

    # forced past the screen, side by side (their times are not compared): MindFormers refuses
    # the parallel optimizer on CPU at start-up, and one data-parallel rank at a learning rate
    # of 30 diverges
    data = str(next((artifacts / ".mindformers-data").glob("*/tokens.mindrecord")))
    (tmp_path / "dp1").mkdir()
    dp1 = {**settings, "cluster.devices": 1, "cluster.devices_per_node": 1, "baseline.dp": 1}
    one = load_spec(mindformers_model(tmp_path / "dp1", python, **dp1))
    with ThreadPoolExecutor(2) as pool:
        refusing = pool.submit(
            _forced,
            load_spec(model),
            {},
            {"parallel.enable_parallel_optimizer": True},
            tmp_path / "refused",
            data,
        )
        diverging = pool.submit(
            _forced,
            one,
            {"dp": 1},
            {"lr_schedule.learning_rate": 30.0},
            tmp_path / "dp1" / "t",
            data,
        )
        refused, diverged = refusing.result(), diverging.result()
    assert refused.outcome == "infeasible" and not refused.infrastructure, refused.detail[:2000]
    assert "parallel optimizer only supports" in refused.detail.splitlines()[0]
    assert diverged.outcome == "diverged", diverged.detail[:2000]
    assert diverged.metrics["diverged"] and diverged.metrics["steps"] >= STEPS

    # the winner, exported, run by run_mindformer.py as the export's launch line runs it
    out = tmp_path / "x"
    assert main(["export", "tiny_llama_cpu", "--storage", storage, "--out", str(out)]) == 0
    exported = capsys.readouterr().out
    winner = int(re.search(r"exported trial #(\d+)", exported).group(1))
    line = next(x for x in exported.splitlines() if "launch.sh --mindformers" in x)
    line = line[line.index("PATH=") :]  # the launch line export printed, run as printed
    rest = ["--out", str(tmp_path / "run"), "--", "--train_dataset_dir", str(data)]
    began_export = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", f"{line} {shlex.join(rest)}"], capture_output=True, text=True, timeout=900
    )
    exported_s = time.monotonic() - began_export
    log = tmp_path / "run" / "logs" / "worker_0.log"
    assert done.returncode == 0, log.read_text(errors="replace")[-4000:]
    trial_dir = artifacts / "tiny_llama_cpu" / str(winner)
    theirs, ours = _logged(log), _logged(trial_dir / "logs" / "worker_0.log")
    records = [json.loads(x) for x in (trial_dir / "steps.rank0.jsonl").read_text().splitlines()]
    assert len(ours) == len(records) >= STEPS and len(theirs) > len(ours)
    # the same losses, step for step, as MindFormers prints them, and as the recorder read them
    assert [loss for _, loss, _ in theirs[: len(ours)]] == [loss for _, loss, _ in ours]
    assert [f"{r['loss']:.6f}" for r in records] == [loss for _, loss, _ in ours]
    # the step time within the noise floor the study measured (run to run: the confirmed
    # configurations' relative difference), the export's on its log's (whole-ms) per_step_time
    runs = [t for t in trials if t.number == winner or t.user_attrs.get("confirm_of") == winner]
    trial_ms = statistics.median(metrics_of(t)["step_time_ms"] for t in runs)
    export_ms = statistics.median(ms for _, _, ms in theirs[1:])
    with capsys.disabled():
        print(
            f"\nMindFormers study: {len(trials)} trials in {searched:.0f} s; exported run "
            f"{exported_s:.0f} s; trial #{winner} {trial_ms:.1f} ms/step (median of {len(runs)} "
            f"runs), its export {export_ms:.0f} ms/step, noise floor {floor:.1%}"
        )
    assert abs(export_ms / trial_ms - 1) <= 3 * floor, (export_ms, trial_ms, floor)
    assert (
        "global_batch_size = batch_size_per_card * device_num * gradient_accumulation_steps "
        "= 8 = 4 * 2 * 1" in log.read_text(errors="replace")
    )
