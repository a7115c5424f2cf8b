"""Measure as long as the number needs: the interval ``step_time_ci``, the stop rule of
studies without final_loss, and how pruning and the confirm phase use it — pure Python first,
then the study loop on replay, then real MindSpore trials."""

import csv
import json
import math
import re
import statistics
import textwrap

import optuna
import pytest

from autotune.cli import main
from autotune.spec.model_yaml import load_spec
from autotune.stopping.pruning import SlowTrialPruner, StepWatcher
from autotune.train.intervals import mean_step_time, step_time_ci, student_t_quantile
from autotune.train.metrics import StepLog
from tests.conftest import SIM8_MODEL


def test_the_t_quantile_is_students():
    from scipy import stats  # a MindSpore dependency, so always here; the program has its own

    # textbook values of t(0.975, df)
    for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (24, 2.064), (120, 1.980)):
        assert student_t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    for df in (*range(1, 60), 100, 1000, 100000):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)


def test_step_time_ci_is_the_relative_t_half_width_of_the_mean():
    times = [100.0, 110.0, 90.0, 105.0, 95.0]
    expected = 2.776445 * statistics.stdev(times) / math.sqrt(5) / 100.0
    assert step_time_ci(times) == pytest.approx(expected, rel=1e-6)
    assert step_time_ci([t * 7 for t in times]) == pytest.approx(expected)  # relative: unitless
    assert step_time_ci([50.0] * 4) == 0.0
    assert step_time_ci([50.0]) is None and step_time_ci([]) is None  # no interval from one step


def log_of(times, overflows=None, measure_after=2) -> StepLog:
    log = StepLog(None, measure_after, samples_per_step=8, total_steps=1000)
    for i, t in enumerate(times):
        log.add(i, t / 1000.0, 1.0, bool(overflows and overflows[i]), 1024.0)
    return log


def test_the_stop_rule_counts_measured_steps_after_the_backoff():
    # steps 0-1 are not measured; with an initial back-off of 5 steps, the overflow rate (and
    # the stop rule's count) starts at step 5
    log = log_of([100.0] * 12, overflows=[True] * 5 + [False] * 7)
    assert log.settled_steps() == 7
    assert log_of([100.0] * 12).settled_steps() == 10
    assert log_of([100.0] * 2).settled_steps() == 0
    assert log_of([100.0] * 12, overflows=[True] * 12).settled_steps() == 0  # never settled


def simulated_trials(
    draw,
    seed: int,
    trials: int = 2000,
    steps: int = 30,
    measure_after: int = 5,
    min_steps: int = 10,
    precision: float = 0.02,
) -> tuple[list, list]:
    """``trials`` simulated trials of the program's own loop (`autotune.train.program`) and its
    `StepLog`, their step times (ms) drawn by ``draw(rng)``: (each trial's mean measured step
    time as its metrics say, samples per step / throughput, in ms; the steps each ran)."""
    import random

    from autotune.train.metrics import StepLog

    rng, means, ran = random.Random(seed), [], []
    timing = {"started_at": 0.0, "init_s": 0.0, "first_step_s": 0.0, "probe_s": 0.0}
    for _ in range(trials):
        log = StepLog(None, measure_after, 32, 10000, pilot_steps=min_steps)
        stop_at, i = None, 0
        while i < steps and (stop_at is None or i < stop_at):
            log.add(i, draw(rng) / 1000.0, 1.0, False, 1024.0)
            i += 1
            if log.pilot_ended() and i < steps:  # what the program does there, on one rank
                block = log.plan(precision, steps - i)
                stop_at = i + block if block < steps - i else None
        metrics = log.summary(timing, 0.0, 1024.0)
        means.append(32 / metrics["throughput"] * 1000.0)
        ran.append(metrics["steps"])
    return means, ran


@pytest.mark.parametrize("kind", ["quiet", "spiky"])
def test_the_stop_rule_measures_the_mean_step_time_without_bias(kind):
    """Stopping at the first narrow interval and averaging the same steps favoured candidates
    that had not met a slow step yet (optional stopping: N(100, 3) ms steps with 6 % spikes at
    300 ms read 2.8-3.7 % fast). The rule's estimate, over 2,000 seeded trials, is the step-time
    distribution's mean to 1 %, spiky or quiet — and quiet trials still stop early."""

    def quiet(rng):
        return rng.gauss(100.0, 3.0)

    def spiky(rng):
        return 300.0 if rng.random() < 0.06 else rng.gauss(100.0, 3.0)

    draw, truth = {"quiet": (quiet, 100.0), "spiky": (spiky, 0.94 * 100.0 + 0.06 * 300.0)}[kind]
    means, ran = simulated_trials(draw, seed=28)
    assert statistics.fmean(means) == pytest.approx(truth, rel=0.01)
    if kind == "quiet":  # N(100, 3) needs ~5 steps beyond the 10 of the pilot, not 25
        assert statistics.fmean(ran) < 5 + 25 - 5 and statistics.median(ran) < 25


def test_the_pilot_plans_the_block_its_precision_needs():
    """The pilot (min_steps measured steps after the back-off) plans the steps that follow: as
    many as the estimate w·pilot + (1 − w)·block needs for its 95 % half-width to be within
    precision, w = pilot / (pilot + steps left) fixed before the block is seen; at least half
    the pilot; the rest of the trial when the pilot's spread allows no precision."""
    log = StepLog(None, 2, samples_per_step=8, total_steps=1000, pilot_steps=6)
    for i, t in enumerate([500.0, 400.0] + [100.0, 102.0, 98.0, 101.0, 99.0]):
        log.add(i, t / 1000.0, 1.0, False, 1024.0)
        assert not log.pilot_ended()
    log.add(7, 0.1, 1.0, False, 1024.0)
    assert log.pilot_ended() and log.pilot_end == 8
    pilot = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0]
    w, s, t = 6 / (6 + 20), statistics.stdev(pilot), student_t_quantile(0.975, 5)
    need = math.ceil(((1 - w) * s) ** 2 / ((0.01 * 100.0 / t) ** 2 - (w * s) ** 2 / 6))
    assert log.plan(0.01, 20) == max(3, need) and log.weight == w
    assert log.plan(0.5, 20) == 3  # half the pilot at least
    assert log.plan(0.001, 20) == 20  # the pilot's spread alone is wider: every step left
    log.plan(0.01, 20)
    for i, t in enumerate([110.0, 90.0, 100.0]):
        log.add(8 + i, t / 1000.0, 1.0, False, 1024.0)
    timing = {"started_at": 0.0, "init_s": 1.0, "first_step_s": 0.5, "probe_s": 0.1}
    metrics = log.summary(timing, 100.0, 1024.0)
    estimate = w * statistics.fmean(pilot) + (1 - w) * 100.0
    assert metrics["throughput"] == pytest.approx(8 / (estimate / 1000.0))
    times = pilot + [110.0, 90.0, 100.0]
    half = t * statistics.stdev(times) * math.sqrt(w * w / 6 + (1 - w) ** 2 / 3)  # Student-t, n − 1
    half *= student_t_quantile(0.975, 8) / t
    assert metrics["step_time_ci"] == pytest.approx(half / estimate)
    assert metrics["step_time_ci"] == pytest.approx(step_time_ci(times, pilot=6, weight=w))


def test_the_summary_records_the_interval_of_the_measured_steps():
    times = [500.0, 120.0, 100.0, 110.0, 90.0, 105.0, 95.0]
    timing = {"started_at": 0.0, "init_s": 1.0, "first_step_s": 0.5, "probe_s": 0.1}
    metrics = log_of(times).summary(timing, 100.0, 1024.0)
    assert metrics["step_time_ci"] == pytest.approx(step_time_ci(times[2:]))
    assert log_of(times[:3]).summary(timing, 100.0, 1024.0)["step_time_ci"] is None  # one measured


def test_only_a_study_without_final_loss_stops_measuring_early(tmp_path):
    from autotune.spec.space import build_space
    from autotune.train.config import trial_config
    from autotune.train.config_check import check_config

    text = textwrap.dedent("""
        study: t
        model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,
                vocab_size: 64}
        train: {global_batch_size: 8}
        cluster: {backend: cpu, devices: 1}
        trial: {steps: 40, measure_after: 4, precision: 0.05, min_steps: 8}
        """)
    (tmp_path / "model.yaml").write_text(text)
    path = tmp_path / "model.yaml"
    for objectives, rule in (
        ([["goodput"], {"precision": 0.05, "min_steps": 8}]),
        ([["goodput", "peak_memory"], {"precision": 0.05, "min_steps": 8}]),
        ([["goodput", "final_loss"], None]),
        ([["final_loss"], None]),
    ):
        spec = load_spec(path, {"search.objectives": objectives})
        assert spec.stop_rule() == rule, objectives
        candidate = build_space(spec).baseline()
        config = trial_config(
            spec,
            candidate,
            study="t",
            number=0,
            out_dir=tmp_path,
            steps=40,
            measure_after=4,
            stop_rule=spec.stop_rule(),
        )
        check_config(config)  # the program takes it
        assert config["trial"] == {"steps": 40, "measure_after": 4, **(rule or {})}
    # defaults: ±2 %, after 10 measured steps, or every measured step of a shorter trial
    (tmp_path / "model.yaml").write_text(
        text.replace(
            "trial: {steps: 40, measure_after: 4, precision: 0.05, min_steps: 8}",
            "trial: {steps: 8, measure_after: 2}",
        )
    )
    spec = load_spec(path)
    assert (spec.trial.precision, spec.trial.min_steps) == (0.02, 6)
    assert spec.stop_rule() == {"precision": 0.02, "min_steps": 6}


@pytest.mark.parametrize(
    "trial, says",
    [
        ({"precision": 0.0, "min_steps": 5}, "trial.precision: must be > 0 and < 1"),
        ({"precision": 0.02}, "trial.precision/min_steps: give both or neither"),
        ({"precision": 0.02, "min_steps": 1}, "trial.min_steps: must be >= 2"),
    ],
)
def test_the_program_refuses_a_bad_stop_rule_naming_it(trial, says):
    from autotune.train.config import ConfigError
    from autotune.train.config_check import check_config

    config = {
        "out_dir": "x",
        "model": {
            "family": "mlp",
            "entry": None,
            "num_layers": 1,
            "hidden_size": 32,
            "num_heads": 4,
            "ffn_hidden_size": 64,
            "seq_length": 16,
            "vocab_size": 64,
        },
        "train": {"global_batch_size": 8, "learning_rate": 0.01, "total_steps": 100},
        "trial": {"steps": 30, "measure_after": 2, **trial},
        "knobs": {
            "dp": 1,
            "tp": 1,
            "pp": 1,
            "micro_batches": 1,
            "fusion_mb": 64,
            "grad_accum": 1,
            "loss_scale": 1024,
            "warmup_steps": 0,
            "jit_level": "O1",
            "recompute": "none",
        },
    }
    with pytest.raises(ConfigError, match=re.escape(says)):
        check_config(config)


def test_the_stop_rule_changes_no_compiled_graph():
    from autotune.train.runtime.compile_cache import graph_key

    config = {
        "study": "s",
        "trial_number": 0,
        "out_dir": "x",
        "seed": 0,
        "model": {"family": "mlp"},
        "trial": {"steps": 30, "measure_after": 2},
        "knobs": {"dp": 1},
    }
    ruled = {**config, "trial": {**config["trial"], "precision": 0.02, "min_steps": 10}}
    assert graph_key(config) == graph_key(ruled)  # a goodput-only study shares a final_loss one's


# --- pruning with the interval -----------------------------------------------------------


def watched(tmp_path, times, best=100.0, min_steps=10, measure_after=2):
    """A trial of a study whose best finished trial made ``best`` samples/s, with steps of
    ``times`` ms at 10 samples a step: its watcher after reading them all."""
    study = optuna.create_study(
        direction="maximize", pruner=SlowTrialPruner(ratio=0.5, min_steps=min_steps)
    )
    study.add_trial(optuna.trial.create_trial(value=best))
    trial = study.ask()
    with open(tmp_path / "steps.jsonl", "w") as f:
        for i, t in enumerate(times):
            f.write(
                json.dumps(
                    {
                        "step": i,
                        "step_time_ms": t,
                        "loss": 1.0,
                        "overflow": False,
                        "loss_scale": 1024.0,
                    }
                )
                + "\n"
            )
    watcher = StepWatcher(trial, tmp_path, samples_per_step=10, measure_after=measure_after)
    return watcher, watcher.report(), study.trials[-1]


def test_a_trial_clearly_below_half_the_best_is_pruned(tmp_path):
    # 250 ms steps at 10 samples: 40 samples/s, steady; the best made 100
    watcher, prune, trial = watched(tmp_path, [250.0, 250.0] + [250.0, 252.0, 248.0] * 4)
    assert prune and watcher.last[1] == pytest.approx(40.0, rel=1e-3)
    assert (
        trial.user_attrs["step_time_ci"]
        == pytest.approx(step_time_ci([250.0, 252.0, 248.0] * 4))
        == watcher.half_width
    )
    assert SlowTrialPruner.upper_bound(40.0, watcher.half_width) < 50.0


def test_a_noisy_trial_below_half_the_best_is_kept_while_its_interval_reaches_it(tmp_path):
    # mean 225 ms (44 samples/s: below 50, so a rule on the value alone would prune it), but
    # steps of 125 and 325 ms: the upper 95% bound is above 50
    times = [225.0, 225.0] + [125.0, 325.0] * 8
    watcher, prune, trial = watched(tmp_path, times)
    goodput = watcher.last[1]
    assert goodput == pytest.approx(10 / 0.225, rel=1e-3) and goodput < 50.0
    assert SlowTrialPruner.upper_bound(goodput, trial.user_attrs["step_time_ci"]) > 50.0
    assert not prune
    # the same trial once its interval is narrower, after more steps: pruned
    more = times + [125.0, 325.0] * 40
    assert watched(tmp_path, more)[1]


def test_no_trial_is_pruned_on_fewer_steps_than_its_interval_needs(tmp_path):
    steady = [500.0] * 2 + [500.0, 501.0] * 4  # 20 samples/s, 8 reported steps
    assert not watched(tmp_path, steady, min_steps=10)[1]
    assert watched(tmp_path, steady, min_steps=8)[1]
    # one measured step has no interval: never pruned on it
    assert not watched(tmp_path, [500.0] * 3, min_steps=1)[1]


# --- the study loop on replay -------------------------------------------------------------

MODEL = (
    "study: precise\n"
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


def replay_study(tmp_path, rows, text=MODEL):
    """model.yaml and its table: ``rows`` maps tp → [(goodput, step_time_ci or None)]."""
    with open(tmp_path / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tp", "goodput", "step_time_ms", "step_time_ci", "run_s"])
        for tp, runs in rows.items():
            for goodput, ci in runs:
                writer.writerow([tp, goodput, 64000 / goodput, "" if ci is None else ci, 60])
    (tmp_path / "model.yaml").write_text(textwrap.dedent(text))
    return str(tmp_path / "model.yaml"), f"sqlite:///{tmp_path}/s.db"


@pytest.mark.parametrize("min_steps", [None, 26])
def test_the_loop_prunes_a_clearly_slow_trial_and_keeps_a_noisy_one(
    tmp_path, monkeypatch, min_steps
):
    """The replay executor with trials that run while their steps are read: each run writes its
    ``steps.jsonl`` at once (25 measured steps) and ends only after the loop's pruner has read
    it. With ``trial.min_steps`` above 25 nothing is judged."""
    from autotune.execution.executors import ReplayExecutor

    times = {
        1: [1000.0] * 30,  # the baseline: 64 samples/s, so the bar is 32
        2: [1000.0, 3400.0] * 15,  # 29 samples/s, but noisy: within reach of 32
        4: [2600.0, 2620.0] * 15,
    }  # 24.5 samples/s, steady: clearly below 32

    class Streaming(ReplayExecutor):
        ends_later: set = set()

        def steps_dir(self, number):
            return tmp_path / "steps" / str(number)

        def submit(self, job):
            super().submit(job)
            folder = self.steps_dir(job.number)
            folder.mkdir(parents=True)
            (folder / "steps.jsonl").write_text(
                "".join(
                    json.dumps(
                        {
                            "step": i,
                            "step_time_ms": t,
                            "loss": 1.0,
                            "overflow": False,
                            "loss_scale": 1.0,
                        }
                    )
                    + "\n"
                    for i, t in enumerate(times[job.candidate.tp])
                )
            )
            self.ends_later.add(job.number)

        def wait(self, timeout_s=None):
            if self.ends_later:  # still running: the loop reads its steps before it ends
                self.ends_later.clear()
                return []
            return super().wait(timeout_s)

    monkeypatch.setattr(
        "autotune.study.run.make_executor",
        lambda spec, folder, ray_address, table: Streaming(spec, table),
    )
    measured = {
        tp: (64000 / statistics.fmean(t[5:]), step_time_ci(t[5:])) for tp, t in times.items()
    }
    text = MODEL if min_steps is None else MODEL + f"trial: {{steps: 40, min_steps: {min_steps}}}\n"
    path, storage = replay_study(tmp_path, {tp: [run] for tp, run in measured.items()}, text)
    assert main(["search", path, "--storage", storage, "--no-confirm"]) == 0
    study = optuna.load_study(study_name="precise", storage=storage)
    by_tp = {2 ** t.params["log2_tp"]: t for t in study.trials}
    assert by_tp[1].user_attrs["outcome"] == "ok" and by_tp[1].user_attrs.get("baseline")
    # below the bar, where a rule on the value alone stops it, but not clearly: it finished
    noisy = by_tp[2]
    assert measured[2][0] < 32 < SlowTrialPruner.upper_bound(*measured[2])
    assert noisy.user_attrs["outcome"] == "ok" and noisy.values == [pytest.approx(measured[2][0])]
    assert noisy.user_attrs["step_time_ci"] == pytest.approx(measured[2][1])
    slow = by_tp[4]
    if min_steps is not None:
        assert slow.user_attrs["outcome"] == "ok"
        return
    assert slow.user_attrs["outcome"] == "pruned", slow.user_attrs
    assert slow.user_attrs["step_time_ci"] == pytest.approx(measured[4][1])  # the one it stopped on
    upper = SlowTrialPruner.upper_bound(*measured[4])
    assert (
        f"(at most {upper:.4g}, 95%) is below 0.5× the best finished trial's"
        in slow.user_attrs["detail"]
    )


@pytest.mark.parametrize(
    "ci, verdict",
    [
        (
            0.01,
            "the runs differ by more than their steps' noise explains, so more re-runs "
            "(--confirm-runs), not a tighter trial.precision, would lower the noise floor",
        ),
        (
            0.05,
            "the steps' own noise accounts for the noise floor, so a tighter trial.precision "
            "would lower it",
        ),
    ],
)
def test_the_confirm_phase_reports_each_confirmed_value_with_its_runs_interval(
    tmp_path, capsys, ci, verdict
):
    # test_loop's confirm study, its rows carrying step_time_ci: the noise floor is 1.27 %
    # (the median of 2.83/100, 1.41/111, 1.41/119), set against the runs' own interval
    rows = {1: [100.0, 98.0, 102.0], 2: [150.0, 110.0, 112.0], 4: [130.0, 118.0, 120.0]}
    path, storage = replay_study(
        tmp_path, {tp: [(g, ci) for g in runs] for tp, runs in rows.items()}
    )
    assert (
        main(["search", path, "--storage", storage, "--confirm", "2", "--confirm-runs", "2"]) == 0
    )
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="precise", storage=storage)
    first = {
        t.params["log2_tp"]: t.number for t in study.trials if "confirm_of" not in t.user_attrs
    }
    assert f"#0 baseline: 100 ± 2.828 (n=2; original 100; ±{ci:.1%} within a run)" in out
    assert f"#{first[1]}: 111 ± 1.414 (n=2; original 150; ±{ci:.1%} within a run)" in out
    assert "noise floor (median sd/mean of confirmed configurations): 1.3%" in out
    assert (
        f"within a run the mean step time is known to ±{ci:.1%} (median step_time_ci of "
        f"the re-runs, 95%): {verdict}"
    ) in " ".join(out.split())
    assert main(["show", "precise", "--storage", storage]) == 0
    shown = f"over 2 re-runs (original 100 not included; ±{ci:.1%} within a run)"
    assert shown in capsys.readouterr().out
    from autotune.analysis.report.page import _standing
    from autotune.analysis.view import view

    assert shown in _standing(view("precise", storage))  # the report's index says the same


def test_a_confirm_phase_without_intervals_says_nothing_of_them(tmp_path, capsys):
    rows = {1: [100.0, 98.0, 102.0], 2: [150.0, 110.0, 112.0], 4: [130.0, 118.0, 120.0]}
    path, storage = replay_study(
        tmp_path, {tp: [(g, None) for g in runs] for tp, runs in rows.items()}
    )
    assert (
        main(["search", path, "--storage", storage, "--confirm", "2", "--confirm-runs", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "#0 baseline: 100 ± 2.828 (n=2; original 100)" in out
    assert "within a run" not in out and "noise floor" in out


def test_a_study_resumes_with_another_precision_but_not_another_length(tmp_path, capsys):
    # precision and min_steps say how precisely a trial measures, not what: a goodput measured
    # to ±2 % and one to ±5 % estimate the same number (trial.steps changes what is measured)
    rows = {1: [(100.0, 0.01)], 2: [(150.0, 0.01)], 4: [(130.0, 0.01)]}
    path, storage = replay_study(tmp_path, rows, MODEL + "trial: {precision: 0.02}\n")
    assert main(["search", path, "--storage", storage, "--trials", "2", "--no-confirm"]) == 0
    replay_study(tmp_path, rows, MODEL + "trial: {precision: 0.05, min_steps: 20}\n")
    assert (
        main(["search", path, "--storage", storage, "--trials", "3", "--resume", "--no-confirm"])
        == 0
    )
    assert len(optuna.load_study(study_name="precise", storage=storage).trials) == 3
    replay_study(tmp_path, rows, MODEL + "trial: {steps: 40}\n")
    capsys.readouterr()
    assert main(["search", path, "--storage", storage, "--resume", "--no-confirm"]) == 2
    assert "was run with other trial" in capsys.readouterr().err


# --- real MindSpore trials ----------------------------------------------------------------

REAL = """
study: measured
model: {family: transformer, num_layers: 2, hidden_size: 64, num_heads: 2, seq_length: 32,
        vocab_size: 128, dtype: float16}
train: {global_batch_size: 16, learning_rate: 5.0e-3, total_steps: 2000}
cluster: {backend: cpu, devices: 1, devices_per_node: 1, device_memory_gb: 8}
search:
  space: {fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0, jit_level: O1,
          recompute: none}
  n_trials: 1
  objectives: [goodput]
# ±15 %: reached well within the steps on a machine other work shares (there the steps' CV
# was 25-35 %: ~25 steps), on a quiet one after 5
trial: {steps: 60, measure_after: 2, precision: 0.15, min_steps: 5, timeout_s: 300}
"""


def real_trial(tmp_path, name, objectives, devices=1):
    """Run the one-trial study ``REAL`` with ``objectives`` on ``devices`` workers; returns the
    stored trial, its metrics.json, its steps' times and its folder."""
    text = REAL.replace("objectives: [goodput]", f"objectives: [{', '.join(objectives)}]")
    text = text.replace(
        "devices: 1, devices_per_node: 1", f"devices: {devices}, devices_per_node: {devices}"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(path),
                "--study",
                name,
                "--storage",
                storage,
                "--artifacts",
                str(tmp_path / "art"),
                "--no-confirm",
            ]
        )
        == 0
    )
    trial = optuna.load_study(study_name=name, storage=storage).trials[0]
    assert trial.user_attrs["outcome"] == "ok", trial.user_attrs.get("detail")
    folder = tmp_path / "art" / name / "0"
    steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    return trial, json.loads((folder / "metrics.json").read_text()), steps, folder


def check_stopped_where_the_pilot_planned(
    trial, metrics, steps, folder, precision=0.15, min_steps=5
):
    """The trial ran its pilot and the block its pilot planned (rank 0's times, as recorded),
    and reports the rule's estimate and interval."""
    from autotune.train.program import UPDATE_CAP

    times = [s["step_time_ms"] for s in steps]
    log, applied = StepLog(None, 2, 8, 1000, pilot_steps=min_steps), 0
    for i, step in enumerate(steps):
        log.add(
            i, step["step_time_ms"] / 1000.0, step["loss"], step["overflow"], step["loss_scale"]
        )
        applied += not step["overflow"]
        if log.pilot_ended():
            break
    left = min(UPDATE_CAP * 60 - log.pilot_end, 60 - applied)
    block = log.plan(precision, left)
    # stopped where planned — or, when the pilot's spread needed every step left (a machine
    # busy enough), ran them all
    assert len(times) == log.pilot_end + block if block < left else metrics["applied_steps"] == 60
    assert metrics["steps"] == len(times)
    pilot = log.pilot_end - 2
    assert metrics["step_time_ci"] == pytest.approx(step_time_ci(times[2:], pilot, log.weight))
    assert metrics["throughput"] == pytest.approx(
        metrics["samples_per_step"] / mean_step_time(times[2:], pilot, log.weight) * 1000
    )
    assert trial.user_attrs["step_time_ci"] == pytest.approx(metrics["step_time_ci"])
    said = [
        line
        for line in (folder / "logs" / "worker_0.log").read_text().splitlines()
        if "autotune.train precision:" in line
    ]
    assert len(said) == 1, said
    verdict = (
        f"stopped after {len(times)} steps of 60"
        if block < left
        else f"needed every step: ran {len(times)} steps"
    )
    planned = block if block < left else len(times) - log.pilot_end
    assert (
        f"a pilot of {pilot} measured steps planned {planned} more; {verdict}, step_time_ci"
        in said[0]
    )
    assert "the plan took one all-reduce" in said[0]


# two real 60-step trials (~19 s): the fast tier's real MindSpore run is its end-to-end search
@pytest.mark.slow
def test_a_goodput_study_stops_measuring_at_its_precision_and_a_final_loss_one_does_not(tmp_path):
    trial, metrics, steps, folder = real_trial(tmp_path, "goodput", ["goodput"])
    check_stopped_where_the_pilot_planned(trial, metrics, steps, folder)
    config = json.loads((folder / "config.json").read_text())
    assert (config["trial"]["precision"], config["trial"]["min_steps"]) == (0.15, 5)
    # final_loss is the loss after trial.steps updates: every one of them runs
    trial, metrics, steps, folder = real_trial(tmp_path, "loss", ["goodput", "final_loss"])
    assert metrics["applied_steps"] == 60 and len(steps) == metrics["steps"] >= 60
    assert "precision" not in json.loads((folder / "config.json").read_text())["trial"]
    assert metrics["step_time_ci"] == pytest.approx(
        step_time_ci([s["step_time_ms"] for s in steps[2:]])
    )


@pytest.mark.slow
def test_every_rank_of_a_two_worker_trial_stops_at_the_same_step(tmp_path):
    """dp2 under msrun: rank 0's interval decides, and both ranks stop after the same step —
    their weights agree (a dp group applies the same updates), and the trial ends at all (a
    rank that went on would wait for its peer's collectives until the timeout)."""
    trial, metrics, steps, folder = real_trial(tmp_path, "dp2", ["goodput"], devices=2)
    assert json.loads((folder / "config.json").read_text())["knobs"]["dp"] == 2
    check_stopped_where_the_pilot_planned(trial, metrics, steps, folder)
    ranks = [json.loads((folder / f"metrics.rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
