"""Goodput scores what the full run will see: the initial back-off is charged once over
train.total_steps, overflows after it by their rate, underflow by the share of gradient elements
float16 flushes to zero (measured by the real probe where its bound does not settle it); a
diverged run is a rising loss trend."""

import json
import math
import random

import optuna
import pytest

from autotune.stopping.pruning import SlowTrialPruner, StepWatcher
from autotune.train.metrics import StepLog, backoff_steps, rising
from tests.conftest import train  # noqa: E402


def test_rising_needs_a_trend_beyond_noise():
    rng = random.Random(0)
    flat = [4.0 + rng.gauss(0, 0.3) for _ in range(28)]
    assert not rising(flat)
    # a tiny batch whose first step happened to be low: the old "last 5 above the first" rule
    # called this diverged
    assert not rising([3.2] + [4.0 + rng.gauss(0, 0.3) for _ in range(27)])
    assert not rising([4.0 - 0.05 * i + rng.gauss(0, 0.1) for i in range(28)])  # learning
    assert rising([4.0 + 0.1 * i + rng.gauss(0, 0.1) for i in range(28)])
    assert rising([1.0, 1.2, 1.4, 1.6, 1.8])  # no noise at all: any real rise
    assert not rising([1.0, 5.0, 9.0])  # too few steps to judge a trend


def test_backoff_is_the_leading_run_of_overflows():
    assert backoff_steps([True, True, False, True, False]) == 2
    assert backoff_steps([False, True]) == 0
    assert backoff_steps([True, True]) == 2


def records(overflows, ms=100.0):
    return [
        {"step": i, "loss": 4.0 - 0.01 * i, "overflow": o, "step_time_ms": ms, "loss_scale": 1.0}
        for i, o in enumerate(overflows)
    ]


def summary(overflows, total_steps=1000, underflow=0.0):
    log = StepLog(None, measure_after=2, samples_per_step=10, total_steps=total_steps)
    log.records = records(overflows)
    timing = {"started_at": 0.0, "init_s": 0.5, "first_step_s": 0.5, "probe_s": 0.0}
    return log.summary(timing, peak_mb=1.0, final_loss_scale=1.0, underflow_share=underflow)


def test_goodput_charges_the_backoff_once_per_run_and_overflows_by_their_rate():
    # 6 steps of back-off then 24 clean ones: 4 of the measured steps were skipped
    backoff = summary([True] * 6 + [False] * 24)
    assert backoff["throughput"] == pytest.approx(28 * 10 / 2.8)
    assert backoff["backoff_steps"] == 6 and backoff["overflow_rate"] == 0
    assert backoff["goodput"] == pytest.approx(backoff["throughput"] * (1 - 6 / 1000))
    # the same 6 overflows spread over the run: the scale does not hold, each costs its step
    spread = summary(([True] + [False] * 4) * 6)
    assert spread["backoff_steps"] == 1
    assert spread["overflow_rate"] == pytest.approx(5 / 28)  # measured steps 2..29
    assert spread["goodput"] == pytest.approx(spread["throughput"] * (1 - 5 / 28) * (1 - 1 / 1000))
    assert backoff["goodput"] > spread["goodput"]
    # never settled: no update applied, no goodput
    assert summary([True] * 30)["overflow_rate"] == 1 and summary([True] * 30)["goodput"] == 0
    # underflow is charged by its share
    clean = summary([False] * 30, underflow=0.25)
    assert clean["goodput"] == pytest.approx(0.75 * clean["throughput"])


def test_the_pruner_waits_for_the_backoff(tmp_path):
    study = optuna.create_study(
        direction="maximize", pruner=SlowTrialPruner(ratio=0.5, min_steps=3)
    )
    study.add_trial(
        optuna.trial.create_trial(value=100.0)
    )  # the best finished trial: 100 samples/s
    trial = study.ask()
    watcher = StepWatcher(trial, tmp_path, samples_per_step=10, measure_after=2)
    with open(tmp_path / "steps.jsonl", "w") as f:
        for r in records([True] * 8 + [False] * 4):
            f.write(json.dumps(r) + "\n")
    # 100 ms steps at 10 samples: 100 samples/s once settled; the 6 measured back-off steps do
    # not make it look like 0
    assert not watcher.report()
    assert watcher.last == (11, pytest.approx(100.0))
    assert sorted(trial.storage.get_trial(trial._trial_id).intermediate_values) == [8, 9, 10, 11]


QUICKSTART = {
    "num_layers": 2,
    "hidden_size": 128,
    "num_heads": 4,
    "ffn_hidden_size": 512,
    "seq_length": 32,
    "vocab_size": 256,
}


@pytest.mark.slow
def test_the_probe_runs_where_float16_flushes_gradients_and_the_bound_stands_in_elsewhere(tmp_path):
    """The tiny GPT model on a dp2 shard (16 samples), under the bound's rule ("auto") and the
    old one (the probe after every trial, "always"). At a loss scale of 2^-8 float16 flushes ~2 %
    of the gradients: the bound is above SKIP_BELOW, the probe runs and underflow_share is the old
    rule's. At 1 the share is ~1e-4: the probe is skipped and the bound stands in, within
    SKIP_BELOW of the old share — goodput moves by no more than that."""
    from autotune.train.step.probe import SKIP_BELOW

    runs = {
        (scale, mode): train(
            tmp_path,
            f"{scale}-{mode}",
            model=QUICKSTART,
            knobs={"loss_scale": scale},
            steps=6,
            lr=5e-3,
            trial={"underflow_probe": mode},
        )[0]
        for scale in (2.0**-8, 1.0)
        for mode in ("auto", "always")
    }
    flushing, old = runs[2.0**-8, "auto"], runs[2.0**-8, "always"]
    assert flushing["underflow_probed"] and flushing["underflow_bound"] > SKIP_BELOW
    assert flushing["underflow_share"] == old["underflow_share"] > 0.005
    healthy, old = runs[1.0, "auto"], runs[1.0, "always"]
    assert not healthy["underflow_probed"] and old["underflow_probed"]
    assert (
        healthy["underflow_share"]
        == healthy["underflow_bound"]
        == old["underflow_bound"]
        <= SKIP_BELOW
    )
    assert (
        0 < old["underflow_share"]
        and abs(healthy["underflow_share"] - old["underflow_share"]) <= SKIP_BELOW
    )
    assert old["underflow_share"] < flushing["underflow_share"]  # a smaller scale flushes more
    for m in runs.values():
        assert (
            m["final_loss_scale"] in (2.0**-8, 1.0)
            and m["backoff_steps"] == 0
            and m["overflow_rate"] == 0
        )
        assert m["goodput"] == pytest.approx(m["throughput"] * (1 - m["underflow_share"]))


@pytest.mark.slow
def test_float32_has_no_underflow_to_measure(tmp_path):
    metrics, _ = train(tmp_path, "f32", model={"dtype": "float32"}, steps=3)
    assert metrics["underflow_share"] == 0 and math.isfinite(metrics["goodput"])
    assert metrics["underflow_bound"] == 0 and not metrics["underflow_probed"]
