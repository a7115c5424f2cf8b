"""Where a trial's time goes: the split the launcher and the program measure, how
analysis reads it, and which config fields change a compiled graph's key."""

import copy
from types import SimpleNamespace

import pytest

from autotune.analysis import trial_time
from autotune.execution.launch_time import with_launch_and_teardown
from autotune.jobs import METRICS, TIME_PARTS
from autotune.spec.knobs import KNOBS
from autotune.train.metrics import METRIC_KEYS, StepLog
from autotune.train.runtime.compile_cache import graph_key


def test_the_launcher_turns_the_programs_clock_into_launch_and_teardown():
    metrics = {"goodput": 1.0, "started_at": 1000.5, "finished_at": 1010.0, "steps_s": 3.0}
    out = with_launch_and_teardown(metrics, handed_over=1000.0, ended=1010.25)
    assert out == {"goodput": 1.0, "steps_s": 3.0, "launch_s": 0.5, "teardown_s": 0.25}
    assert "started_at" in metrics  # the caller's dict is left as it was
    assert with_launch_and_teardown({"goodput": 1.0}, 0.0, 1.0) == {"goodput": 1.0}  # no run
    assert set(TIME_PARTS) <= set(METRICS)  # each part is stored under its own name


# What a trial's metrics.json holds that the study does not store under its own name, and why:
# the program's book-keeping (its step count, batch, applied steps and final scale, which the
# stored numbers already summarise) and the probe's note, which becomes the result's detail
# (`autotune.execution.classify`).
NOT_STORED = {"steps", "samples_per_step", "applied_steps", "final_loss_scale", "underflow_note"}


def test_the_study_stores_every_metric_a_trial_reports_but_its_book_keeping():
    # the trial program's own summary (pure Python), as the launcher hands it to the study: a
    # metric added to the program but not to jobs.METRICS (or the other way round) fails here
    log = StepLog(None, measure_after=2, samples_per_step=8, total_steps=1000)
    for step in range(6):
        log.add(step, 0.1, 4.0 - 0.1 * step, overflow=False, loss_scale=1024.0)
    reported = log.summary(
        {"started_at": 100.0, "init_s": 1.0, "first_step_s": 1.0, "probe_s": 0.0}, 1.0, 1024.0
    )
    assert tuple(reported) == METRIC_KEYS  # what metrics.json holds, in its order
    reported["finished_at"] = 110.0  # the program sets it once its outputs are written
    handed = with_launch_and_teardown(reported, handed_over=99.0, ended=111.0)
    assert NOT_STORED <= set(handed)
    assert sorted(set(handed) - NOT_STORED) == sorted(METRICS)


def trial(**attrs):
    return SimpleNamespace(user_attrs=attrs)


def test_fixed_time_is_the_run_less_its_measured_steps():
    attrs = {
        "run_s": 10.0,
        "launch_s": 0.5,
        "init_s": 1.0,
        "first_step_s": 2.0,
        "excluded_steps_s": 0.5,
        "steps_s": 4.0,
        "probe_s": 0.4,
        "teardown_s": 0.1,
    }
    parts = trial_time.split(attrs)
    assert parts["fixed_s"] == 6.0 and parts["measured_s"] == 4.0
    assert parts["other_s"] == pytest.approx(1.5)
    assert trial_time.split({"run_s": 3.0}) is None  # pruned: no split stored
    spent = trial_time.device_time(
        [(trial(**attrs), 2), (trial(**{**attrs, "run_s": 6.0}), 2), (trial(run_s=5.0), 4)]
    )
    assert spent["fixed_s"] == 6.0 * 2 + 2.0 * 2 + 5.0 * 4  # the pruned run: all fixed
    assert spent["measured_s"] == 4.0 * 2 * 2
    assert spent["median_ratio"] == pytest.approx((1.5 + 0.5) / 2) and spent["trials"] == 2
    assert "fixed 6.00 s against 4.00 s measured" in trial_time.line(parts)


BASE = {
    "study": "s",
    "trial_number": 3,
    "backend": "cpu",
    "seed": 0,
    "out_dir": "/x/3",
    "compile_cache": "/x/cache",
    "model": {"family": "transformer", "num_layers": 2, "hidden_size": 32, "dtype": "float16"},
    "train": {"global_batch_size": 8, "learning_rate": 5e-3, "total_steps": 200, "save_every": 100},
    "trial": {"steps": 30, "measure_after": 5},
    "knobs": {
        "dp": 2,
        "tp": 1,
        "pp": 1,
        "micro_batches": 1,
        "fusion_mb": 64,
        "grad_accum": 1,
        "loss_scale": 1024,
        "warmup_steps": 0,
        "jit_level": "O1",
        "recompute": "none",
        "parallel_optimizer": False,
    },
}


def changed(path, value):
    config = copy.deepcopy(BASE)
    *sections, field = path.split(".")
    target = config
    for section in sections:
        target = target[section]
    target[field] = value
    return graph_key(config)


@pytest.mark.parametrize(
    "path,value",
    [
        ("study", "other"),
        ("trial_number", 9),
        ("out_dir", "/y"),
        ("seed", 7),
        ("compile_cache", "/z"),
        ("knobs.loss_scale", 65536),
        ("knobs.warmup_steps", 400),
        ("knobs.fusion_mb", 4),
        ("train.learning_rate", 1e-4),
        ("train.total_steps", 5000),
        ("trial.steps", 10),
        ("trial.measure_after", 2),
        ("train.save_every", 7),
    ],
)
def test_what_no_graph_holds_keeps_the_graph_key(path, value):
    assert changed(path, value) == graph_key(BASE)


@pytest.mark.parametrize(
    "path,value",
    [
        ("knobs.recompute", "full"),
        ("knobs.grad_accum", 2),
        ("knobs.jit_level", "O0"),
        ("knobs.parallel_optimizer", True),
        ("knobs.dp", 1),
        ("model.dtype", "float32"),
        ("model.hidden_size", 64),
        ("backend", "gpu"),
        ("train.global_batch_size", 16),
        ("knobs.micro_batches", 2),
    ],
)
def test_what_changes_a_graph_changes_its_key(path, value):
    assert changed(path, value) != graph_key(BASE)


def update_free(config):
    return graph_key(config, update_free=True)


def test_a_graph_without_the_update_has_one_key_for_every_parallel_optimizer_setting():
    """The parallel optimizer acts in the update only (Knob.graphs "update"): graphs without it
    share a key over its values; everything else that changes a graph still changes that key,
    and it is never a whole trial's key."""
    base = update_free(BASE)
    config = copy.deepcopy(BASE)
    config["knobs"]["parallel_optimizer"] = True
    assert update_free(config) == base and graph_key(config) != graph_key(BASE)
    for path, value in (
        ("knobs.recompute", "full"),
        ("knobs.grad_accum", 2),
        ("knobs.dp", 1),
        ("model.dtype", "float32"),
        ("knobs.jit_level", "O0"),
    ):
        config = copy.deepcopy(BASE)
        section, field = path.split(".")
        config[section][field] = value
        assert update_free(config) != base, path
    assert base != graph_key(BASE)
    assert {knob.graphs for knob in KNOBS.values()} <= {"all", "update", "none"}
