"""A trial starts from a clean folder, and the loop's step watcher never dies on what it reads:
a second study of the same name (another storage, a deleted database) finds the first one's
trial folders."""

import json
from pathlib import Path

import optuna
import pytest

from autotune.execution.runner import run_trial
from autotune.stopping.pruning import StepWatcher


def steps(n: int, step_time_ms: float) -> str:
    return "".join(
        json.dumps(
            {
                "step": i,
                "step_time_ms": step_time_ms,
                "loss": 6.9,
                "overflow": False,
                "loss_scale": 1024.0,
            }
        )
        + "\n"
        for i in range(n)
    )


def watcher(tmp_path) -> StepWatcher:
    trial = optuna.create_study(direction="maximize").ask()
    return StepWatcher(trial, tmp_path, samples_per_step=8, measure_after=0)


def test_a_steps_file_written_anew_is_read_from_its_start(tmp_path):
    """The old study's steps.jsonl is read, then the new trial truncates and rewrites it: the
    watcher's offset lands mid-line in the new file."""
    path = tmp_path / "steps.jsonl"
    path.write_text(steps(3, 1000.0))
    follow = watcher(tmp_path)
    follow.report()
    path.write_text(steps(8, 12.5))  # mode "w", as the trial program opens it
    follow.report()
    assert follow.last == (7, pytest.approx(8 / 0.0125))  # the new run's steps only


def test_a_steps_file_that_shrank_is_read_again(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text(steps(6, 1000.0))
    follow = watcher(tmp_path)
    follow.report()
    path.write_text(steps(2, 10.0))
    follow.report()
    assert follow.last == (1, pytest.approx(800.0))


def test_a_fragment_or_a_line_being_written_is_not_a_step(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('tep": 3, "step_time_ms": 5}\n' + steps(2, 10.0) + '{"step": 2, "step_')
    follow = watcher(tmp_path)
    follow.report()
    assert follow.last == (1, pytest.approx(800.0))


def stale_folder(trial_dir: Path) -> None:
    """What an earlier study's trial 0 left: a worker's out-of-memory line, its steps and
    metrics."""
    logs = trial_dir / "logs"
    logs.mkdir(parents=True)
    (logs / "worker_1.log").write_text(
        "autotune.train running the candidate\nMemoryError: Unable to allocate 4.00 GiB\n"
    )
    (trial_dir / "steps.jsonl").write_text(steps(3, 1000.0)[:-20])
    (trial_dir / "metrics.json").write_text('{"goodput": 1.0}')


def test_the_driver_clears_a_trial_folder_before_it_dispatches(tmp_path):
    from autotune.execution.runner import fresh_trial_dir

    stale_folder(tmp_path / "0")
    fresh_trial_dir(tmp_path / "0")
    assert list((tmp_path / "0").iterdir()) == []


def test_a_node_clears_its_logs_and_on_rank_0s_node_the_outputs(tmp_path):
    from autotune.execution.runner import fresh_trial_dir

    stale_folder(tmp_path)
    (tmp_path / "logs" / "node1").mkdir()
    (tmp_path / "logs" / "node1" / "worker_2.log").write_text("node 1's\n")
    fresh_trial_dir(tmp_path, tmp_path / "logs" / "node0", outputs=True)
    assert (tmp_path / "logs" / "node1" / "worker_2.log").exists()  # node 1's own to clear
    assert not (tmp_path / "steps.jsonl").exists() and not (tmp_path / "metrics.json").exists()
    fresh_trial_dir(tmp_path, tmp_path / "logs" / "node1", outputs=False)
    assert list((tmp_path / "logs" / "node1").iterdir()) == []


def test_a_stale_out_of_memory_line_is_not_this_trials(tmp_path):
    """The real trial program in the old folder refuses its config: the candidate's own error,
    not the old worker_1.log's oom."""
    trial_dir = tmp_path / "trials" / "s" / "0"
    stale_folder(trial_dir)
    config = {
        "study": "s",
        "trial_number": 0,
        "backend": "cpu",
        "seed": 0,
        "out_dir": str(trial_dir),
        "model": {"family": "mlp"},
        "train": {},
        "trial": {"steps": 2, "measure_after": 1},
        "knobs": {"recompute": "everything"},
    }
    result = run_trial(config, trial_dir, 120, None, 1)
    assert result.outcome == "error", result.detail
    assert "autotune.train: ConfigError" in result.detail.splitlines()[0]
