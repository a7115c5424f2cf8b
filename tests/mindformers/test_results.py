"""What a MindFormers trial left, read into autotune's Result: the recorder's per-rank files and
rank 0's log of real runs (tests/fixtures/mindformers_trial/README.md) → steps.jsonl and
metrics.json as autotune's trainer writes them → `autotune.execution.classify`."""

import ast
import json
import shutil

import pytest

from autotune import train
from autotune.execution.classify import classify, program_verdict
from autotune.mindformers import CLUSTER_DIR
from autotune.mindformers.results import NO_PROBE, StopPlan, write_metrics
from autotune.mindformers.trial import STOP_FILE
from autotune.spec.backends import backend_of
from autotune.train.metrics import METRIC_KEYS, StepLog
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "mindformers_trial"
CONFIG = {  # the trial's config.json as the recorded run had it (train.total_steps: the run's)
    "backend": "cpu",
    "train": {"global_batch_size": 8, "total_steps": 1000},
    "trial": {"steps": 10, "measure_after": 2, "precision": 0.02, "min_steps": 8},
    "mindformers": {
        "ranks": 2,
        "loss_rank": None,  # data parallel: the mean of the ranks' shard losses
        "loss_divisor": 1,
        "loss_scaled": True,
        "initial_scale": 2.0**32,
    },
}


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def overflow(tmp_path):
    return shutil.copytree(FIXTURES / "overflow", tmp_path / "trial")


def test_a_recorded_trial_becomes_autotunes_metrics_and_an_ok_result(overflow):
    assert write_metrics(overflow, CONFIG)
    result = classify(0, overflow, overflow / "logs", 30.0, backend_of("cpu"))
    assert result.outcome == "ok" and result.detail == NO_PROBE
    metrics = result.metrics
    assert set(metrics) == set(METRIC_KEYS)
    ranks = [_lines(overflow / f"steps.rank{r}.jsonl") for r in (0, 1)]
    first = json.loads((overflow / "metrics.rank0.json").read_text())
    # the global batch's loss: the mean of the two data-parallel ranks' shard losses
    assert metrics["loss_first"] == pytest.approx((ranks[0][0]["loss"] + ranks[1][0]["loss"]) / 2)
    steps = _lines(overflow / "steps.jsonl")
    assert [s["step_time_ms"] for s in steps] == [r["step_time_ms"] for r in ranks[0]]
    # the cell returns the scale after its update: step 0 used 2^32 (it says 2^31), step n the
    # scale step n - 1 returned
    assert ranks[0][0]["loss_scale"] == 2.0**31
    assert [s["loss_scale"] for s in steps] == [2.0**32] + [r["loss_scale"] for r in ranks[0][:-1]]
    assert metrics["final_loss_scale"] == ranks[0][-1]["loss_scale"]
    # 12 back-off steps from 2^32 to 2^20, then the cap: 20 steps of a 10-update trial
    assert metrics["backoff_steps"] == 12 and metrics["steps"] == 20 == len(steps)
    assert metrics["applied_steps"] == 20 - metrics["overflow_steps"] == 7
    settled = [s["overflow"] for s in steps[12:]]
    assert metrics["overflow_rate"] == pytest.approx(sum(settled) / len(settled))
    assert metrics["goodput"] == pytest.approx(
        metrics["throughput"] * (1 - metrics["overflow_rate"]) * (1 - 12 / 1000)
    )
    # no underflow probe: unmeasured, said so, and no charge
    assert metrics["underflow_share"] is None and metrics["underflow_note"] == NO_PROBE
    # the time split: the entry's start → the train's begin → the first step's end
    assert metrics["init_s"] == first["train_begin_at"] - first["started_at"]
    assert metrics["first_step_s"] == ranks[0][0]["ended_at"] - first["train_begin_at"]
    assert metrics["compile_s"] == metrics["init_s"] + metrics["first_step_s"]
    assert metrics["started_at"] == first["started_at"]
    assert metrics["finished_at"] == first["finished_at"]
    peaks = [json.loads((overflow / f"metrics.rank{r}.json").read_text()) for r in (0, 1)]
    assert metrics["peak_memory_mb"] == max(p["peak_rss_mb"] for p in peaks)


def test_a_run_whose_rank_0_never_ended_its_train_has_no_metrics(overflow):
    (overflow / "metrics.rank0.json").unlink()
    assert not write_metrics(overflow, CONFIG)
    result = classify(0, overflow, overflow / "logs", 30.0, backend_of("cpu"))
    assert result.outcome == "error" and "exited 0 without metrics.json" in result.detail


def test_a_refusal_at_start_up_is_the_candidates_infeasible_wherever_its_verdict_is(tmp_path):
    trial = shutil.copytree(FIXTURES / "refused", tmp_path / "trial")
    result = classify(1, trial, trial / "logs", 20.0, backend_of("cpu"))
    assert result.outcome == "infeasible" and not result.infrastructure
    assert result.detail.startswith(
        'autotune.train: Refused: RuntimeError: AdamW: For "Optimizer", parallel optimizer only '
        'supports "Ascend"'
    )
    # teardown lines after the verdict push it out of the log's tail: it is still the verdict
    log = trial / "logs" / "worker_0.log"
    log.write_text(log.read_text() + "[INFO] DISTRIBUTED … Event base dispatch success!\n" * 40)
    assert program_verdict(trial / "logs").startswith("autotune.train: Refused:")
    assert classify(1, trial, trial / "logs", 20.0, backend_of("cpu")).outcome == "infeasible"


def _run(step_times_ms, overflows=()):
    return [
        {"step": i, "step_time_ms": t, "loss": 4.85, "overflow": i in overflows, "loss_scale": 1.0}
        for i, t in enumerate(step_times_ms)
    ]


def test_the_stop_rule_plans_a_mindformers_trial_as_autotunes_trainer_would(tmp_path):
    config = {
        **CONFIG,
        "trial": {"steps": 40, "measure_after": 2, "precision": 0.02, "min_steps": 10},
    }
    times = [9000.0, 60.0] + [40.0 + (i % 5) for i in range(38)]
    live = tmp_path / "steps.jsonl"
    plan = StopPlan(config, tmp_path)
    with open(live, "w") as f:
        for record in _run(times[:8]):  # the pilot has not ended: no stop yet
            f.write(json.dumps(record) + "\n")
            f.flush()
            plan.poll()
    assert not (tmp_path / STOP_FILE).exists()
    live.write_text("".join(json.dumps(r) + "\n" for r in _run(times)))
    plan.poll()
    reference = StepLog(None, 2, 8, 1000, pilot_steps=10)
    for r in _run(times):
        reference.add(r["step"], r["step_time_ms"] / 1000, r["loss"], r["overflow"], 1.0)
        if reference.pilot_ended():
            done = len(reference.records)
            block = reference.plan(0.02, min(80 - done, 40 - done))
            break
    stop = json.loads((tmp_path / STOP_FILE).read_text())["stop_after"]
    assert stop == reference.pilot_end + block < 40


def _assigned(path) -> dict:
    return {
        node.targets[0].id: node.value.value
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }


def test_the_cluster_files_speak_the_words_autotunes_launcher_reads():
    """The entry and the recorder run in MindFormers' venv and cannot import autotune: the words
    they print and the variables they share are autotune's own, spelled again."""
    entry = _assigned(CLUSTER_DIR / "autotune_mf_entry.py")
    recorder = _assigned(CLUSTER_DIR / "autotune_mf_recorder.py")
    assert entry["CANDIDATE_STARTED"] == train.CANDIDATE_STARTED
    assert entry["VERDICT"] == train.VERDICT
    assert entry["REFUSED"] == train.REFUSED and entry["LAUNCH_FAILED"] == train.LAUNCH_FAILED
    assert entry["NODE"] == train.NODE_VARIABLE
    assert entry["TRAINING"] == recorder["TRAINING"] and entry["STARTED"] == recorder["STARTED"]


def test_a_real_trial_stopped_where_the_stop_rule_said_on_every_rank(tmp_path):
    """The recorded run whose runner followed the stop rule (README): the plan autotune's
    StepLog makes from rank 0's steps is the step both ranks stopped after, and the metrics are
    the rule's estimate."""
    trial = shutil.copytree(FIXTURES / "stopped", tmp_path / "trial")
    config = {
        **CONFIG,
        "trial": {"steps": 30, "measure_after": 2, "precision": 0.2, "min_steps": 10},
    }
    ranks = [_lines(trial / f"steps.rank{r}.jsonl") for r in (0, 1)]
    stop = json.loads((trial / STOP_FILE).read_text())["stop_after"]
    assert len(ranks[0]) == len(ranks[1]) == stop < 30
    replayed = tmp_path / "replayed"
    replayed.mkdir()
    (replayed / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ranks[0][:stop]))
    StopPlan(config, replayed).poll()
    assert json.loads((replayed / STOP_FILE).read_text())["stop_after"] == stop
    assert write_metrics(trial, config)
    metrics = json.loads((trial / "metrics.json").read_text())
    assert metrics["steps"] == stop and metrics["step_time_ci"] <= 0.2
