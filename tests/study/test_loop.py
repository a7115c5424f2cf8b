"""The study loop's logic on the replay backend — a real executor answering from a table of
measured runs, several rows per candidate (so re-runs see real spread), outcomes of every kind,
trials in flight as the pool holds them — with real Optuna storage: the confirm phase, a
candidate's own failure and the infrastructure's, resume after a driver died, several trials at
once. The same logic on real MindSpore trials: tests/e2e/test_search.py (make test-slow)."""

import csv
import signal
import statistics
import subprocess
import sys
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

import autotune
from autotune.cli import main
from autotune.search.untried import STALL
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting, schema
from autotune.storage.drivers import OWNER, driver_id
from tests.conftest import SIM8_MODEL

MODEL = (
    "study: loop\n"
    + SIM8_MODEL
    + """\
cluster: {backend: replay, replay: table.csv, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: 1, fusion_mb: 64, grad_accum: 1, loss_scale: 65536,
          warmup_steps: 0, jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 3
  sampler: tpe
  seed: 0
"""
)
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
                    writer.writerow(
                        [
                            tp,
                            "",
                            "",
                            outcome,
                            "true" if infrastructure else "",
                            f"replayed {outcome}",
                            60,
                        ]
                    )
    (tmp_path / "model.yaml").write_text(textwrap.dedent(text))
    return str(tmp_path / "model.yaml"), f"sqlite:///{tmp_path}/s.db"


def load(storage, name="loop"):
    return optuna.load_study(study_name=name, storage=storage)


def test_the_confirm_phase_reruns_the_best_and_the_baseline_and_export_takes_the_confirmed_best(
    tmp_path, capsys
):
    # tp2's first run was lucky: its re-runs say it is slower than tp4. The confirmed means are
    # the re-runs' only: with the lucky original in them tp2 would win
    # (124 vs 122.7), on its re-runs alone tp4 does (119 vs 111).
    path, storage = study_files(
        tmp_path, {1: [100.0, 98.0, 102.0], 2: [150.0, 110.0, 112.0], 4: [130.0, 118.0, 120.0]}
    )
    assert (
        main(["search", path, "--storage", storage, "--confirm", "2", "--confirm-runs", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "replay: 3 measured candidates in table.csv (9 rows" in out
    study = load(storage)
    reruns = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert sum(counting.counted(t) for t in study.trials) == 3  # re-runs don't count toward N
    # the two best (tp2, then tp4) and the baseline (tp1, #0), twice more each, round by round,
    # the second round reversed: a drift through the phase moves all three means alike
    first = {
        t.params.get("log2_tp"): t.number for t in study.trials if "confirm_of" not in t.user_attrs
    }
    tp2, tp4 = first[1], first[2]
    assert [t.user_attrs["confirm_of"] for t in reruns] == [tp2, tp4, 0, 0, tp4, tp2]
    assert [t.values[0] for t in reruns] == [110.0, 118.0, 98.0, 102.0, 120.0, 112.0]
    assert all(t.params == study.trials[t.user_attrs["confirm_of"]].params for t in reruns)
    assert "confirm [6/6]" in out
    assert "#0 baseline: 100 ± 2.828 (n=2; original 100)" in out
    assert f"#{tp2}: 111 ± 1.414 (n=2; original 150)" in out
    assert f"best confirmed #{tp4} vs baseline #0: {119 / 100:.2f}× ± " in out
    floor = study.user_attrs["noise_floor"]
    assert floor == pytest.approx(
        statistics.median([2.83 / 100, 1.414 / 111, 1.414 / 119]), rel=1e-2
    )
    assert f"noise floor (median sd/mean of confirmed configurations): {floor:.1%}" in out
    assert main(["export", "loop", "--out", str(tmp_path / "export"), "--storage", storage]) == 0
    assert f"exported trial #{tp4} of loop" in capsys.readouterr().out


def test_a_candidates_own_failure_runs_once_in_a_run_and_after_resume(tmp_path, capsys):
    path, storage = study_files(
        tmp_path, {1: [100.0], 2: [("error", False), 150.0], 4: [("oom", False)]}
    )
    args = ["search", path, "--storage", storage, "--sampler", "random", "--no-confirm"]
    assert main(args + ["--trials", "5"]) == 0  # 3 candidates: the space ends first
    assert (
        "the space is exhausted: every candidate has run or is infeasible (3 ran, 0 infeasible)"
        in capsys.readouterr().out
    )
    study = load(storage)
    ran = [t for t in study.trials if "repeat_of" not in t.user_attrs]
    assert sorted(t.user_attrs["outcome"] for t in ran) == ["error", "ok", "oom"]
    error = next(t for t in ran if t.user_attrs["outcome"] == "error")
    assert (
        error.user_attrs["detail"] == "replayed error" and "infrastructure" not in error.user_attrs
    )
    repeats = [t for t in study.trials if "repeat_of" in t.user_attrs]
    # the sampler's last STALL proposals in a row were repeats, each answered from memory; then
    # the untried candidates were taken: none was left
    assert len(repeats) >= STALL
    assert all(
        t.user_attrs["outcome"] == study.trials[t.user_attrs["repeat_of"]].user_attrs["outcome"]
        for t in repeats
    )
    # a restart remembers them too: tp2 never takes its second (ok) row
    assert main(args + ["--trials", "6", "--resume"]) == 0
    study = load(storage)
    assert len([t for t in study.trials if "repeat_of" not in t.user_attrs]) == 3


def test_an_infrastructure_failure_is_retried_once_and_not_remembered_after_resume(
    tmp_path, capsys
):
    # the baseline's first two runs were lost to the infrastructure, its third measured
    path, storage = study_files(
        tmp_path, {1: [("error", True), ("error", True), 100.0], 2: [150.0], 4: [130.0]}
    )
    args = ["search", path, "--storage", storage, "--no-confirm"]
    assert main(args + ["--trials", "2"]) == 0
    assert (
        "#0 failed by infrastructure, not by its candidate (replayed error): running it again once"
        in capsys.readouterr().out
    )
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
    again = [
        t
        for t in study.trials
        if t.params == first.params and t.number > retry.number and "repeat_of" not in t.user_attrs
    ]
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
    study.enqueue_trial(
        {"log2_tp": 2},
        user_attrs={
            **{k: v for k, v in base.user_attrs.items() if k in KNOB_NAMES},
            "tp": 4,
            "dp": 2,
        },
    )
    trial = study.ask(base.distributions)
    trial.set_user_attr(OWNER, dead)
    capsys.readouterr()
    assert main(args + ["--trials", "2", "--resume"]) == 0
    assert (
        f"resuming: trial #{trial.number} (driver {dead}) was interrupted (SQLite keeps one "
        "driver, so a trial this run did not start is not running); its candidate runs again"
        in capsys.readouterr().out
    )
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


@pytest.mark.parametrize(
    "field, says",
    [
        ("pool_devices: 4", "cluster.pool_devices: must be ≥ 8, got 4"),
    ],
)
def test_a_pool_smaller_than_a_trial_is_an_input_error(tmp_path, capsys, field, says):
    path, storage = study_files(
        tmp_path, {1: [100.0]}, MODEL.replace("device: a100-80g}", f"device: a100-80g, {field}}}")
    )
    assert main(["validate", path]) == 2
    assert says in capsys.readouterr().err


def dead_driver():
    """The id of a driver of this machine whose process has ended."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = driver_id(gone.pid)
    gone.wait()
    return dead


def left_running(storage, tp, attrs, owner):
    """A RUNNING trial of the tp-``tp`` candidate with user attrs ``attrs``, asked by ``owner``
    (a driver that then vanished); returns its number."""
    study = load(storage)
    base = study.trials[0]
    knobs = {k: v for k, v in base.user_attrs.items() if k in KNOB_NAMES}
    study.enqueue_trial(
        {"log2_tp": tp.bit_length() - 1}, user_attrs={**knobs, "tp": tp, "dp": 8 // tp, **attrs}
    )
    trial = study.ask(base.distributions)
    trial.set_user_attr(OWNER, owner)
    return trial.number


def test_an_interrupted_confirm_rerun_is_measured_again_on_resume_not_copied(tmp_path):
    # the interrupted re-run's candidate, requeued with confirm_of, runs again: it must not come
    # back as a repeat of its original (value 150) that the confirm phase takes for a re-run
    path, storage = study_files(
        tmp_path, {1: [100.0, 98.0, 102.0], 2: [150.0, 110.0, 112.0], 4: [130.0, 128.0]}
    )
    args = ["search", path, "--storage", storage]
    assert main(args + ["--no-confirm"]) == 0
    best = max(load(storage).trials, key=lambda t: t.values[0])
    lost = left_running(storage, 2, {"confirm_of": best.number}, dead_driver())
    assert main(args + ["--resume", "--confirm", "1", "--confirm-runs", "2"]) == 0
    study = load(storage)
    assert study.trials[lost].user_attrs["outcome"] == "interrupted"
    assert not [t.number for t in study.trials if {"confirm_of", "repeat_of"} <= set(t.user_attrs)]
    reruns = [
        t
        for t in study.trials
        if t.user_attrs.get("confirm_of") == best.number and t.number != lost
    ]
    assert [t.values[0] for t in reruns] == [110.0, 112.0]  # measured, each its next row
    assert sum(counting.counted(t) for t in study.trials) == 3


def test_a_confirm_rerun_asks_its_own_queued_trial_not_the_oldest_waiting_one(tmp_path):
    # again() takes the trial queued for this re-run, not the oldest WAITING one: with a retry
    # left queued by the search, every confirm job would run the job before it
    from autotune.search.proposer import Proposer
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0]})
    assert main(["search", path, "--storage", storage, "--no-confirm"]) == 0
    study = load(storage)
    leftover = next(t for t in study.trials if t.params == {"log2_tp": 2})
    study.enqueue_trial(leftover.params, user_attrs={"retry_of": leftover.number})
    spec = load_spec(path)
    proposer = Proposer(spec, build_space(spec), study)
    best = max(study.trials, key=lambda t: t.values[0] if t.values else 0)
    job = proposer.again(best)
    assert job.trial.user_attrs.get("confirm_of") == best.number
    assert job.trial.params == best.params
    assert study.get_trials(states=(TrialState.WAITING,))[0].user_attrs == {
        "retry_of": leftover.number
    }
    retry = proposer.rerun(leftover.number)
    assert (
        retry.trial.user_attrs["retry_of"] == leftover.number
        and retry.trial.params == leftover.params
    )


def test_a_resume_on_sqlite_reruns_what_a_driver_on_another_host_left_running(tmp_path, capsys):
    # alive() cannot judge a driver of another host and SQLite keeps no heartbeats: the resume
    # reruns that driver's trial instead of waiting for it forever
    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0, 131.0]})
    args = ["search", path, "--storage", storage, "--no-confirm"]
    assert main(args + ["--trials", "2"]) == 0
    elsewhere = "a-copied-database-host/b00t/pid:[4026531836]/123/456"
    lost = left_running(storage, 4, {}, elsewhere)
    capsys.readouterr()

    def hung(*_):
        raise TimeoutError("the resume still waits for the other host's trial after 60 s")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        assert main(args + ["--trials", "3", "--resume"]) == 0
    finally:
        signal.alarm(0)
    assert (
        f"resuming: trial #{lost} (driver {elsewhere}) was interrupted" in capsys.readouterr().out
    )
    study = load(storage)
    assert study.trials[lost].user_attrs["outcome"] == "interrupted"
    assert study.trials[-1].params == {"log2_tp": 2} and study.trials[-1].values == [130.0]


def test_a_late_result_for_a_trial_another_driver_failed_is_kept_without_a_traceback(tmp_path):
    # a driver taken for dead (here: a second driver resuming on SQLite) has its running trial
    # failed and requeued; its late tell is stored as a new trial, not an
    # UpdateFinishedTrialError
    from autotune.jobs import Result
    from autotune.search.proposer import Proposer
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.storage.drivers import Drivers
    from autotune.storage.recovery import recover_interrupted
    from autotune.study.progress import Progress
    from autotune.study.recorder import Recorder

    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0]})
    assert main(["search", path, "--storage", storage, "--no-confirm", "--trials", "1"]) == 0
    study = load(storage)
    spec = load_spec(path)
    space = build_space(spec)
    proposer = Proposer(spec, space, study, drivers=Drivers(study))
    study.enqueue_trial({"log2_tp": 1})
    job = proposer.propose()
    assert job.settled is None and job.candidate.tp == 2
    # another job of the same params queued first (a retry) is no copy of the failed trial
    study.enqueue_trial({"log2_tp": 1}, user_attrs={"retry_of": 0})
    assert recover_interrupted(study, me="another/driver/pid:[1]/1/1") == [job.number]
    requeued = [t for t in study.get_trials(states=(TrialState.WAITING,)) if not t.user_attrs]
    assert [t.system_attrs["fixed_params"] for t in requeued] == [{"log2_tp": 1}]
    progress = Progress()
    progress.start(study, done=1, total=2, objectives=spec.search.objectives)
    recorder = Recorder(spec, study, progress, calibrates=True)
    metrics = {"goodput": 150.0, "step_time_ms": 1000.0}
    assert recorder.finished(job, Result("ok", metrics, run_s=60.0)) is False
    study = load(storage)
    late = study.trials[-1]
    assert late.user_attrs["late_of"] == job.number and late.values == [150.0]
    assert late.params == {"log2_tp": 1} and counting.counted(late)
    withdrawn = study.trials[requeued[0].number]
    assert (
        withdrawn.state == TrialState.FAIL and withdrawn.user_attrs["withdrawn_for"] == late.number
    )
    assert [t.user_attrs for t in study.get_trials(states=(TrialState.WAITING,))] == [
        {"retry_of": 0}
    ]


def test_one_driver_never_runs_a_candidate_that_is_still_running(tmp_path):
    # proposer.running is kept with one driver too: with two trials in flight, the sampler's
    # proposal of a running candidate must not run it a second time
    text = MODEL.replace("device: a100-80g}", "device: a100-80g, pool_devices: 16}").replace(
        "tp: [1, 2, 4]", "tp: [1, 2]"
    )
    path, storage = study_files(tmp_path, {1: [100.0] * 4, 2: [150.0] * 4}, text)
    # tp2 runs ten times as long as tp1: the asks after tp1 ended see tp2 running
    table = (tmp_path / "table.csv").read_text().splitlines()
    (tmp_path / "table.csv").write_text(
        "\n".join(line[:-2] + "600" if line.startswith("2,") else line for line in table) + "\n"
    )
    assert (
        main(
            [
                "search",
                path,
                "--storage",
                storage,
                "--sampler",
                "random",
                "--trials",
                "4",
                "--no-confirm",
            ]
        )
        == 0
    )
    study = load(storage)
    ran = [t.params["log2_tp"] for t in study.trials if "repeat_of" not in t.user_attrs]
    assert sorted(ran) == [0, 1], [
        (t.number, t.params, t.user_attrs.get("repeat_of")) for t in study.trials
    ]
    repeats = [t for t in study.trials if "repeat_of" in t.user_attrs]
    assert repeats and all(t.state != TrialState.RUNNING for t in repeats)
    # a repeat is a copy of its original's outcome, stored PRUNED: never a measurement
    assert all(
        t.state == TrialState.PRUNED
        and t.values is None
        and schema.outcome_of(t) == schema.outcome_of(study.trials[t.user_attrs["repeat_of"]])
        for t in repeats
    )


def test_a_resumed_budget_counts_confirm_reruns_and_retried_failures(tmp_path, capsys):
    # a resume sums every trial that ran, not only those that count toward N: the device time
    # of confirm re-runs and of retried infrastructure failures stays in the budget
    path, storage = study_files(
        tmp_path, {1: [("error", True), 100.0, 98.0], 2: [150.0, 140.0], 4: [130.0]}
    )
    args = ["search", path, "--storage", storage]
    assert main(args + ["--trials", "2", "--confirm", "1", "--confirm-runs", "1"]) == 0
    ran = [t for t in load(storage).trials if "run_s" in t.user_attrs]
    assert len(ran) == 5  # the lost baseline, its retry, tp2, and both re-runs: 5 × 60 s × 8
    capsys.readouterr()
    assert main(args + ["--trials", "3", "--resume", "--budget", "0.5dh", "--no-confirm"]) == 0
    assert "budget: budget 0.667 dh of 0.5 dh (133%) used" in capsys.readouterr().out
    assert not [t for t in load(storage).trials if t.params == {"log2_tp": 2}]  # tp4 never ran


def test_drivers_share_one_device_budget_read_from_storage(tmp_path):
    # each driver reads the budget spent from storage, not once at start (then N drivers could
    # each spend the whole budget): what another driver spent since must stop this one
    from autotune.stopping.budget import Budget, Stopper

    path, storage = study_files(tmp_path, {1: [100.0], 2: [150.0], 4: [130.0]})
    assert main(["search", path, "--storage", storage, "--trials", "1", "--no-confirm"]) == 0
    study = load(storage)
    stopper = Stopper(study, Budget("device", 2.5 * 480.0), False, virtual_clock=True)
    assert stopper.reason(0) is None  # 480 used, 480 ahead, 1200 allowed
    base = study.trials[0]
    study.add_trial(
        optuna.trial.create_trial(  # another driver's finished run
            state=TrialState.COMPLETE,
            values=[150.0],
            params={"log2_tp": 1},
            distributions=base.distributions,
            user_attrs={
                **{k: base.user_attrs[k] for k in KNOB_NAMES if k in base.user_attrs},
                "tp": 2,
                "dp": 4,
                "outcome": "ok",
                "run_s": 60.0,
                OWNER: "other/driver",
            },
        )
    )
    assert stopper.reason(0).startswith("budget: budget 0.267 dh of 0.333 dh")
