"""A trial is a run, and a space ends: real studies on the replay and simulate backends (real
executors, real Optuna storage in SQLite, through the CLI).

- A candidate rejected before it ran (a replay table without it, a constraint, the memory
  screen) is recorded with its reason and does not count: a study of N trials runs N candidates.
- A study asking for more trials than its space holds ends when every candidate has run or is
  infeasible, with one line saying so, having tried each candidate once — whatever its sampler.
- Ctrl-C (a real SIGINT to ``autotune search``) stops a study, and ``--resume`` finishes it with
  nothing lost: no trial left running, every candidate run at most once, N runs in the end.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter

import optuna
import pytest

from autotune.cli import main
from autotune.search.untried import STALL
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from autotune.storage import counting, schema
from tests.conftest import ROOT, SIM8_MODEL, interruptible

REPLAYED = (
    "study: runs\n"
    + SIM8_MODEL
    + """\
cluster: {backend: replay, replay: table.csv, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4, 8], pp: 1, fusion_mb: 64, grad_accum: 1, loss_scale: 65536,
          warmup_steps: 0, jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 2
  sampler: tpe
  seed: 0
"""
)


def test_a_rejected_candidate_is_recorded_and_does_not_count(tmp_path, capsys):
    # the table lacks the baseline (tp1) and tp8: of the space's four candidates two can run,
    # and a study of 2 trials runs both, whatever it rejected on the way
    with open(tmp_path / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tp", "goodput", "step_time_ms"])
        writer.writerows([[2, 150.0, 1000.0], [4, 130.0, 1000.0]])
    (tmp_path / "model.yaml").write_text(REPLAYED)
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(tmp_path / "model.yaml"), "--storage", storage, "--no-confirm"]
    assert main(args) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="runs", storage=storage)
    baseline = study.trials[0]
    assert baseline.user_attrs["baseline"] and counting.rejected(baseline)
    assert baseline.user_attrs["detail"] == "not in the replay table"
    assert "#0   infeasible: not in the replay table (not run)" in out
    ran = [t for t in study.trials if counting.counted(t)]
    assert sorted(schema.knobs_of(t)["tp"] for t in ran) == [2, 4]
    assert [line.split("]")[0] for line in out.splitlines() if line.startswith("[")] == [
        "[1/2",
        "[2/2",
    ]
    # the rejected baseline is what show says of the baseline; a resume does not queue it again
    assert main(["show", "runs", "--storage", storage]) == 0
    assert "baseline: #0 infeasible" in capsys.readouterr().out
    assert main(args + ["--resume", "--trials", "2"]) == 0
    assert len(optuna.load_study(study_name="runs", storage=storage).trials) == len(study.trials)


def test_a_candidate_the_program_refused_after_it_was_dispatched_counts(tmp_path, capsys):
    # MindFormers refusing a setting at start-up: infeasible, but the run was dispatched and
    # took its seconds (run_s), so it is one of the study's N runs, not a rejection
    with open(tmp_path / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tp", "outcome", "run_s", "detail", "goodput", "step_time_ms"])
        writer.writerow([1, "ok", 30.0, "", 100.0, 1000.0])
        writer.writerow([2, "infeasible", 12.0, "Invalid backend: CPU", "", ""])
    (tmp_path / "model.yaml").write_text(REPLAYED.replace("tp: [1, 2, 4, 8]", "tp: [1, 2]"))
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(tmp_path / "model.yaml"), "--storage", storage, "--no-confirm"]
    assert main(args) == 0
    out = capsys.readouterr().out
    trials = optuna.load_study(study_name="runs", storage=storage).trials
    assert len(trials) == 2
    refused = next(t for t in trials if schema.knobs_of(t)["tp"] == 2)
    assert schema.outcome_of(refused) == "infeasible" and refused.user_attrs["run_s"] == 12.0
    assert counting.counted(refused) and counting.ran(refused)
    assert not counting.rejected(refused)
    assert "[2/2" in out


SIMULATED = (
    "study: small\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g,
          device_memory_gb: 12}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: 64, grad_accum: [1, 2],
          loss_scale: 65536, warmup_steps: 0, jit_level: O1, recompute: [none, full],
          parallel_optimizer: false}
  n_trials: 60
  seed: 0
"""
)


@pytest.mark.parametrize("sampler", ["auto", "tpe", "random"])
def test_a_space_smaller_than_the_study_ends_with_one_line_and_does_not_spin(
    tmp_path, capsys, sampler
):
    (tmp_path / "model.yaml").write_text(SIMULATED)
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(tmp_path / "model.yaml"), "--storage", storage, "--sampler", sampler]
    assert main(args) == 0
    out = capsys.readouterr().out
    ended = re.findall(
        r"the space is exhausted: every candidate has run or is infeasible "
        r"\((\d+) ran, (\d+) infeasible\): stopping",
        out,
    )
    trials = optuna.load_study(study_name="small", storage=storage).trials
    tried = Counter(
        Candidate(**schema.knobs_of(t)) for t in trials if "repeat_of" not in t.user_attrs
    )
    ran = [t for t in trials if counting.counted(t)]
    rejected = [t for t in trials if counting.rejected(t)]
    space = len(list(build_space(load_spec(tmp_path / "model.yaml")).candidates()))
    # each candidate tried once (rejected ones remembered too); every one ran or is rejected,
    # by a trial or by the screen of the untried ones
    assert set(tried.values()) == {1}
    assert ended == [(str(len(ran)), str(space - len(ran)))]
    assert 0 < len(ran) and len(ran) + len(rejected) <= space
    assert f"[{len(ran)}/60]" in out
    # what needed no run is bounded: fewer than STALL repeats in a row before the sampler
    # found a new candidate or the untried took their turns
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    assert len(repeats) < STALL * len(tried)


def test_ctrl_c_stops_a_study_and_resume_finishes_it_with_nothing_lost(tmp_path):
    (tmp_path / "model.yaml").write_text(
        textwrap.dedent(SIMULATED)
        .replace("study: small", "study: big")
        .replace("fusion_mb: 64", "fusion_mb: [4, 64, 256]")
        .replace("n_trials: 60", "n_trials: 50")  # of its 54 feasible candidates
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        str(tmp_path / "model.yaml"),
        "--storage",
        storage,
        "--sampler",
        "tpe",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    search = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=interruptible,
    )
    lines = 0
    # stop it after its fifth run, wherever it is then: its 45 other runs of ~50 ms each leave
    # a loaded machine (where this process may wait a second for the CPU) time to deliver it
    for line in search.stdout:
        lines += line.startswith("[")
        if lines == 5:
            search.send_signal(signal.SIGINT)
            break
    try:
        _, err = search.communicate(timeout=60)  # a liveness bound; the time is benchmarked
    finally:
        search.kill()
    assert search.returncode == 130, err[-2000:]
    assert "interrupted: running trials recorded as interrupted" in err
    before = optuna.load_study(study_name="big", storage=storage).trials
    assert 5 <= sum(map(counting.counted, before)) < 50
    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    trials = optuna.load_study(study_name="big", storage=storage).trials
    assert not [t.number for t in trials if t.state.name in ("RUNNING", "WAITING")]
    assert sum(map(counting.counted, trials)) == 50
    runs = Counter(Candidate(**schema.knobs_of(t)) for t in trials if counting.ran(t))
    assert set(runs.values()) == {1}  # nothing ran twice, nothing counted that did not run
    for t in trials:  # an interrupted trial's candidate ran later, or was never chosen
        if schema.outcome_of(t) == "interrupted" and t.params:
            assert Candidate(**schema.knobs_of(t)) in runs
