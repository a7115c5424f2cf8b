"""The study loop's logic on the replay backend — a real executor answering from a table of
measured runs, several rows per candidate (so re-runs see real spread), outcomes of every kind,
trials in flight as the pool holds them — with real Optuna storage: the confirm phase, a
candidate's own failure and the infrastructure's, resume after a driver died, several trials at
once. The same logic on real MindSpore trials: test_search.py (make test-slow)."""

import csv
import statistics
import subprocess
import sys
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

import autotune
from autotune.cli import main
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting
from autotune.storage.drivers import OWNER, driver_id

MODEL = """
study: loop
model: {family: transformer, num_layers: 8, hidden_size: 1024, num_heads: 16, seq_length: 1024,
        vocab_size: 32000, dtype: bfloat16}
train: {global_batch_size: 64}
cluster: {backend: replay, replay: table.csv, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: 1, fusion_mb: 64, grad_accum: 1, loss_scale: 65536,
          warmup_steps: 0, jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 3
  sampler: tpe
  seed: 0
"""
HEADER = ["tp", "goodput", "step_time_ms", "outcome", "infrastructure", "detail", "run_s"]


def study_files(tmp_path, rows, text=MODEL):
    """model.yaml and its table: ``rows`` maps tp → [(goodput | outcome, infrastructure)] in
    the order its runs take them."""
    with open(tmp_path / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for tp, runs in rows.items():
            for run in runs:
                if isinstance(run, float):
                    writer.writerow([tp, run, 1000.0, "ok", "", "", 60])
                else:
                    outcome, infrastructure = run
                    writer.writerow([tp, "", "", outcome, "true" if infrastructure else "",
                                     f"replayed {outcome}", 60])
    (tmp_path / "model.yaml").write_text(textwrap.dedent(text))
    return str(tmp_path / "model.yaml"), f"sqlite:///{tmp_path}/s.db"


def load(storage, name="loop"):
    return optuna.load_study(study_name=name, storage=storage)


def test_the_confirm_phase_reruns_the_best_and_the_baseline_and_export_takes_the_confirmed_best(
        tmp_path, capsys):
    # tp2's first run was lucky: its re-runs say it is about as fast as tp4
    path, storage = study_files(tmp_path, {1: [100.0, 98.0, 102.0], 2: [150.0, 110.0, 112.0],
                                           4: [130.0, 128.0, 131.0]})
    assert main(["search", path, "--storage", storage, "--confirm", "1",
                 "--confirm-runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "replay: 3 measured candidates in table.csv (9 rows" in out
    study = load(storage)
    reruns = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert sum(counting.counted(t) for t in study.trials) == 3  # re-runs don't count toward N
    # the best (tp2, #1 or #2) and the baseline (tp1, #0), twice more each, round by round
    best = next(t for t in study.trials if t.params.get("log2_tp") == 1 and not t.user_attrs.get("confirm_of"))
    assert [t.user_attrs["confirm_of"] for t in reruns] == [best.number, 0, best.number, 0]
    assert [t.values[0] for t in reruns] == [110.0, 98.0, 112.0, 102.0]  # each run its next row
    assert all(t.params == study.trials[t.user_attrs["confirm_of"]].params for t in reruns)
    assert "confirm [4/4]" in out
    means = {best.number: statistics.mean([150.0, 110.0, 112.0]), 0: 100.0}
    assert f"#0 baseline: {means[0]:.4g} ± 2 (n=3)" in out
    ratio = means[best.number] / means[0]
    assert f"best confirmed #{best.number} vs baseline #0: {ratio:.2f}× ± " in out
    floor = study.user_attrs["noise_floor"]
    assert f"noise floor (median sd/mean of confirmed configurations): {floor:.1%}" in out
    assert main(["export", "loop", "--out", str(tmp_path / "export"), "--storage", storage]) == 0
    assert f"exported trial #{best.number} of loop" in capsys.readouterr().out


def test_a_candidates_own_failure_runs_once_in_a_run_and_after_resume(tmp_path, monkeypatch):
    monkeypatch.setattr("autotune.study.loop.MAX_REPEATS", 6)  # the space is exhausted soon
    path, storage = study_files(tmp_path, {1: [100.0], 2: [("error", False), 150.0],
                                           4: [("oom", False)]})
    args = ["search", path, "--storage", storage, "--sampler", "random", "--no-confirm"]
    assert main(args + ["--trials", "5"]) == 0
    study = load(storage)
    ran = [t for t in study.trials if "repeat_of" not in t.user_attrs]
    assert sorted(t.user_attrs["outcome"] for t in ran) == ["error", "ok", "oom"]
    error = next(t for t in ran if t.user_attrs["outcome"] == "error")
    assert error.user_attrs["detail"] == "replayed error" and "infrastructure" not in error.user_attrs
    repeats = [t for t in study.trials if "repeat_of" in t.user_attrs]
    assert len(repeats) >= 6  # the last 6 in a row stopped the run; each answered from memory
    assert all(t.user_attrs["outcome"] == study.trials[t.user_attrs["repeat_of"]].user_attrs["outcome"]
               for t in repeats)
    # a restart remembers them too: tp2 never takes its second (ok) row
    assert main(args + ["--trials", "6", "--resume"]) == 0
    study = load(storage)
    assert len([t for t in study.trials if "repeat_of" not in t.user_attrs]) == 3


def test_an_infrastructure_failure_is_retried_once_and_not_remembered_after_resume(tmp_path, capsys):
    # the baseline's first two runs were lost to the infrastructure, its third measured
    path, storage = study_files(tmp_path, {1: [("error", True), ("error", True), 100.0],
                                           2: [150.0], 4: [130.0]})
    args = ["search", path, "--storage", storage, "--no-confirm"]
    assert main(args + ["--trials", "2"]) == 0
    assert "#0 failed by infrastructure, not by its candidate (replayed error): running it again once" \
        in capsys.readouterr().out
    study = load(storage)
    first = study.trials[0]
    retry = next(t for t in study.trials if "retry_of" in t.user_attrs)
    assert first.user_attrs["infrastructure"] is True and not counting.counted(first)
    assert retry.params == first.params and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["baseline"] is True
    # the retry failed by infrastructure too: it counts, and is not run a third time this run
    assert retry.user_attrs["infrastructure"] is True and counting.counted(retry)
    assert sum(counting.counted(t) for t in study.trials) == 2
    # after a restart the candidate runs again, and takes its next row: measured
    assert main(args + ["--trials", "4", "--resume"]) == 0
    study = load(storage)
    again = [t for t in study.trials if t.params == first.params and t.number > retry.number
             and "repeat_of" not in t.user_attrs]
    assert [t.user_attrs["outcome"] for t in again] == ["ok"] and again[0].values == [100.0]


def test_a_resume_reruns_what_a_dead_driver_left_running(tmp_path, capsys):
    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0, 131.0]})
    args = ["search", path, "--storage", storage, "--no-confirm"]
    assert main(args + ["--trials", "2"]) == 0  # the baseline (tp1), then tp2
    # a driver that died while it ran tp4: a RUNNING trial owned by a process of this machine
    # that has ended
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = driver_id(gone.pid)
    gone.wait()
    study = load(storage)
    base = study.trials[0]
    study.enqueue_trial({"log2_tp": 2}, user_attrs={**{k: v for k, v in base.user_attrs.items()
                                                       if k in KNOB_NAMES}, "tp": 4, "dp": 2})
    trial = study.ask(base.distributions)
    trial.set_user_attr(OWNER, dead)
    capsys.readouterr()
    assert main(args + ["--trials", "2", "--resume"]) == 0
    assert f"resuming: trials [{trial.number}] were interrupted and will run again" \
        in capsys.readouterr().out
    study = load(storage)
    lost = study.trials[trial.number]
    assert lost.state == TrialState.FAIL and lost.user_attrs["outcome"] == "interrupted"
    rerun = study.trials[-1]
    assert rerun.params == lost.params == {"log2_tp": 2} and rerun.number > lost.number
    assert rerun.values == [130.0]  # the lost run measured nothing: tp4's first row
    assert sum(counting.counted(t) for t in study.trials) == 3  # a queued candidate runs past N


def test_trials_run_side_by_side_as_the_pool_holds_them(tmp_path, capsys):
    text = MODEL.replace("device: a100-80g}", "device: a100-80g, pool_devices: 16}")
    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0]}, text)
    assert main(["search", path, "--storage", storage, "--no-confirm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    started = [i for i, line in enumerate(lines) if "running:" in line]
    ended = [i for i, line in enumerate(lines) if line.startswith("[")]
    assert len(started) == 3 and len(ended) == 3
    assert started[1] < ended[0]  # two trials of 8 devices on a pool of 16: both in flight
    frame = autotune.trials_frame("loop", storage)
    assert list(frame["outcome"]) == ["ok", "ok", "ok"]


@pytest.mark.parametrize("field, says", [
    ("pool_devices: 4", "cluster.pool_devices: must be ≥ 8, got 4"),
])
def test_a_pool_smaller_than_a_trial_is_an_input_error(tmp_path, capsys, field, says):
    path, storage = study_files(tmp_path, {1: [100.0]},
                                MODEL.replace("device: a100-80g}", f"device: a100-80g, {field}}}"))
    assert main(["validate", path]) == 2
    assert says in capsys.readouterr().err
