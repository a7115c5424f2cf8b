"""Warm start takes only comparable studies: measurements come from studies of the same backend
and trial length; an estimate-only study never stands as a measurement. Real studies on the
simulate and replay backends, into SQLite, through the CLI."""

import optuna

from autotune.cli import main
from autotune.storage import counting
from tests.search.test_proposals import REPLAY, SIMULATE, estimated_table, write


def studies(tmp_path):
    path = write(tmp_path, REPLAY)
    estimated_table(path, tmp_path)
    return path, f"sqlite:///{tmp_path}/s.db"


def copies(storage, name):
    study = optuna.load_study(study_name=name, storage=storage)
    return study, [t for t in study.trials if "warm_start" in t.user_attrs]


def test_an_estimate_only_study_copies_no_measurement(tmp_path, capsys):
    path, storage = studies(tmp_path)
    simulated = write(tmp_path, SIMULATE, "simulated.yaml")
    assert (
        main(
            [
                "search",
                str(simulated),
                "--storage",
                storage,
                "--study",
                "est",
                "--trials",
                "5",
                "--sampler",
                "random",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "measured",
                "--trials",
                "3",
                "--warm-start",
                "est",
            ]
        )
        == 0
    )
    study, copied = copies(storage, "measured")
    assert copied == []
    assert (
        "--warm-start est: it is a simulate study: its values are the cost model's "
        "estimates" in capsys.readouterr().out
    )
    baseline = study.trials[0]  # measured here, not answered from the estimate
    assert baseline.user_attrs["baseline"] and counting.counted(baseline)
    assert "repeat_of" not in baseline.user_attrs


def test_another_trial_length_only_calibrates(tmp_path, capsys):
    path, storage = studies(tmp_path)
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "first",
                "--trials",
                "4",
                "--sampler",
                "random",
            ]
        )
        == 0
    )
    longer = write(tmp_path, REPLAY + "trial: {steps: 60, measure_after: 5}\n", "longer.yaml")
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                str(longer),
                "--storage",
                storage,
                "--study",
                "second",
                "--trials",
                "3",
                "--warm-start",
                "first",
            ]
        )
        == 0
    )
    study, copied = copies(storage, "second")
    assert copied == []
    assert (
        "--warm-start first: its trials were 30 steps (measured after 5), this study's 60 "
        "steps (measured after 5)"
    ) in capsys.readouterr().out
    assert "repeat_of" not in study.trials[0].user_attrs


def test_a_study_of_another_backend_is_refused(tmp_path, capsys):
    path, storage = studies(tmp_path)
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "first",
                "--trials",
                "3",
                "--sampler",
                "random",
            ]
        )
        == 0
    )
    simulated = write(tmp_path, SIMULATE, "simulated.yaml")
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                str(simulated),
                "--storage",
                storage,
                "--study",
                "third",
                "--warm-start",
                "first",
            ]
        )
        == 2
    )
    assert (
        "--warm-start first: it measured on another backend (replay, this study: simulate)"
        in capsys.readouterr().err
    )
    assert "third" not in optuna.get_all_study_names(storage)
