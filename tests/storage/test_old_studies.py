"""Studies made before the packages were regrouped still open: show, report, compare, export,
--resume and --warm-start on a storage written by autotune at commit ae122fc (tests/fixtures/old_studies/README.md
says how it was made): a simulate study, a replay study and a real CPU study with a confirm
phase."""

import json
import shutil
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.storage import counting

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "old_studies"
STUDIES = ("old-sim", "old-rep", "old-cpu")


@pytest.fixture
def old(tmp_path, monkeypatch):
    """A copy of the fixture folder, as the current folder (the studies were made there and
    name their model.yaml relative to it); yields the storage URL."""
    folder = tmp_path / "old"
    shutil.copytree(FIXTURE, folder)
    monkeypatch.chdir(folder)
    return f"sqlite:///{folder}/autotune.db"


def test_show_compare_and_report_open_every_old_study(old, tmp_path, capsys):
    for name in STUDIES:
        assert main(["show", name, "--storage", old]) == 0, name
    out = capsys.readouterr().out
    assert "confirmed" in out and "noise floor: 30.5%" in out  # old-cpu's confirm phase
    assert main(["show", "old-cpu", "--trial", "1", "--storage", old]) == 0
    assert "verdict:" in capsys.readouterr().out
    assert main(["compare", *STUDIES, "--storage", old]) == 0
    assert "confirmed_mean" in capsys.readouterr().out
    assert main(["report", *STUDIES, "--storage", old, "--out", str(tmp_path / "report")]) == 0
    index = (tmp_path / "report" / "index.html").read_text()
    assert all(name in index for name in STUDIES)


def test_export_takes_each_old_studys_best(old, tmp_path, capsys):
    for name in STUDIES:
        out = tmp_path / name
        assert main(["export", name, "--out", str(out), "--storage", old]) == 0, name
        summary = json.loads((out / "summary.json").read_text())
        assert summary["study"] == name and (out / "strategy.ckpt").exists()
    # the old CPU study's confirm phase found its baseline best (640.6 ± 180.7 against 616.2)
    assert json.loads((tmp_path / "old-cpu" / "summary.json").read_text())["trial"] == 0


@pytest.mark.parametrize("name, yaml_file", [("old-sim", "sim.yaml"), ("old-rep", "rep.yaml")])
def test_an_old_study_resumes(old, name, yaml_file):
    before = optuna.load_study(study_name=name, storage=old).get_trials()
    counted = sum(map(counting.counted, before))
    assert (
        main(["search", yaml_file, "--storage", old, "--resume", "--trials", str(counted + 2)]) == 0
    )
    after = optuna.load_study(study_name=name, storage=old).get_trials()
    assert sum(map(counting.counted, after)) == counted + 2
    assert len(after) > len(before) and after[: len(before)] == before  # nothing rewritten


def test_a_new_study_warm_starts_from_an_old_one(old):
    # model.yaml's later fields (baseline, export, cluster.max_device_memory_gb) at their
    # defaults leave the fingerprint an old study compares against as it was
    assert (
        main(
            [
                "search",
                "sim.yaml",
                "--storage",
                old,
                "--warm-start",
                "old-sim",
                "--study",
                "new-sim",
                "--trials",
                "8",
            ]
        )
        == 0
    )
    new = optuna.load_study(study_name="new-sim", storage=old)
    assert any(str(t.user_attrs.get("warm_start", "")).startswith("old-sim#") for t in new.trials)
    stored = optuna.load_study(study_name="old-sim", storage=old).user_attrs["fingerprint"]
    assert new.user_attrs["fingerprint"]["cluster"] == stored["cluster"]


def test_a_resumed_study_says_in_one_line_that_its_trials_were_measured_by_older_rules(old, capsys):
    """Warm pools' peak memory, the stop rule's estimate, the graph key, the timeout's clock and
    the underflow probe changed what a trial records: a study resumed with trials measured
    before says so, once. Its trials stay as they are and it keeps running."""
    before = optuna.load_study(study_name="old-cpu", storage=old).get_trials()
    counted = sum(map(counting.counted, before))
    assert (
        main(
            [
                "search",
                "cpu.yaml",
                "--storage",
                old,
                "--resume",
                "--no-confirm",
                "--artifacts",
                "trials",
                "--trials",
                str(counted),
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    said = [
        line for line in (out.out + out.err).splitlines() if "measured by autotune's rules" in line
    ]
    measured = [t for t in before if t.user_attrs.get("outcome") in ("ok", "diverged")]
    assert len(said) == 1, out.out + out.err
    from autotune.train.metrics import MEASUREMENT

    assert (
        f"{len(measured)} of 'old-cpu''s measured trials were measured by autotune's rules "
        f"before measurement {MEASUREMENT}"
    ) in said[0]
    assert optuna.load_study(study_name="old-cpu", storage=old).get_trials() == before
    # a simulated study's trials are estimates: nothing to say
    sim = optuna.load_study(study_name="old-sim", storage=old)
    assert (
        main(
            [
                "search",
                "sim.yaml",
                "--storage",
                old,
                "--resume",
                "--trials",
                str(sum(map(counting.counted, sim.get_trials()))),
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "measured by autotune's rules" not in out.out + out.err


@pytest.mark.slow
def test_the_old_cpu_study_resumes_with_real_trials(old):
    before = optuna.load_study(study_name="old-cpu", storage=old).get_trials()
    counted = sum(map(counting.counted, before))
    assert (
        main(
            [
                "search",
                "cpu.yaml",
                "--storage",
                old,
                "--resume",
                "--no-confirm",
                "--artifacts",
                "trials",
                "--trials",
                str(counted + 1),
            ]
        )
        == 0
    )
    after = optuna.load_study(study_name="old-cpu", storage=old).get_trials()
    new = after[len(before) :]
    # a real two-worker run of a candidate not tried before (a goodput study: the pruner may
    # stop a slow one early)
    assert [t.user_attrs["outcome"] in ("ok", "pruned") for t in new] == [True], new
    assert new[0].params not in [t.params for t in before]
    assert sum(map(counting.counted, after)) == counted + 1
    from autotune.train.metrics import MEASUREMENT

    assert new[0].user_attrs["measurement"] == MEASUREMENT  # its rules, on the record
