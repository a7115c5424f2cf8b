"""Export from the stored model.yaml alone, a cpu-profile simulate study exported for cpu, grid
studies with a baseline, and repeats stored as copies, not measurements. Real simulate studies
into SQLite, through the CLI."""

import json
import textwrap

import optuna
from optuna.trial import TrialState

from autotune.cli import main
from autotune.storage import counting, schema
from tests.conftest import SMALL_CPU_SIMULATE

SMALL = (
    "study: small\n"
    + SMALL_CPU_SIMULATE
    + """\
search:
  space: space.yaml
  n_trials: 6
  seed: 0
"""
)
SPACE = """
tp: [1, 2]
pp: 1
fusion_mb: [1, 64]
grad_accum: [1, 2]
loss_scale: 1024
warmup_steps: 0
jit_level: O1
recompute: none
parallel_optimizer: false
"""


def study(tmp_path, *args):
    folder = tmp_path / "where-it-ran"
    folder.mkdir(exist_ok=True)
    (folder / "model.yaml").write_text(textwrap.dedent(SMALL))
    (folder / "space.yaml").write_text(textwrap.dedent(SPACE))
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(folder / "model.yaml"), "--storage", storage, *args]) == 0
    return folder, storage


def test_export_needs_nothing_at_the_original_path(tmp_path):
    folder, storage = study(tmp_path)
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()  # another machine: neither model.yaml nor its space file
    assert main(["export", "small", "--storage", storage, "--out", str(tmp_path / "x")]) == 0


def test_a_simulated_cpu_study_exports_for_cpu(tmp_path):
    _, storage = study(tmp_path)
    assert main(["export", "small", "--storage", storage, "--out", str(tmp_path / "x")]) == 0
    launch = (tmp_path / "x" / "launch.sh").read_text()
    assert "--bind_core" in launch
    assert '"device_target": "CPU"' in json.dumps(
        __import__("yaml").safe_load((tmp_path / "x" / "launch.yaml").read_text())
    )


def test_a_grid_runs_the_baseline_first(tmp_path, capsys):
    _, storage = study(tmp_path, "--sampler", "grid")
    trials = optuna.load_study(study_name="small", storage=storage).trials
    assert trials[0].user_attrs.get("baseline") is True
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]
    knobs = schema.knobs_of(trials[0])
    assert (knobs["dp"], knobs["tp"], knobs["fusion_mb"], knobs["grad_accum"]) == (2, 1, 64, 1)
    # 2 layouts: dp2 × fusion 2 × accumulation 2, tp2 (dp = 1: fusion does not act) × 2
    assert len(trials) == 6


def test_repeats_are_stored_as_copies_not_measurements(tmp_path):
    _, storage = study(tmp_path, "--sampler", "random", "--trials", "6")
    study_ = optuna.load_study(study_name="small", storage=storage)
    repeats = [t for t in study_.trials if "repeat_of" in t.user_attrs]
    assert repeats, "the random sampler on 6 candidates proposes a tried one"
    for t in repeats:
        original = study_.trials[t.user_attrs["repeat_of"]]
        assert t.state == TrialState.PRUNED and t.values is None
        assert schema.outcome_of(t) == schema.outcome_of(original)
        assert not counting.counted(t)
    assert not {t.number for t in study_.best_trials} & {t.number for t in repeats}
    assert sum(map(counting.counted, study_.trials)) == 6
