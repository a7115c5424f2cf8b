"""backend replay end to end: a table of measured candidates stands in for the trial runs, the
constraints and the OOM screen run as on a real backend; bad tables exit 2 naming row and
column, with nothing written."""

import csv
import textwrap

import optuna
import pytest

import autotune
from autotune.cli import main
from autotune.spec.knobs import KNOB_NAMES
from tests.conftest import SIM8_MODEL

MODEL = (
    "study: rep\n"
    + SIM8_MODEL
    + """\
cluster: {backend: replay, replay: table.csv, devices: 8, devices_per_node: 8, device: a100-80g,
          device_memory_gb: 6}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 256],
          grad_accum: [1, 2], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  n_trials: 6
  seed: 0
"""
)


def write_table(tmp_path, header, rows, name="table.csv"):
    with open(tmp_path / name, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def model(tmp_path, text=MODEL):
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def goodput(tp, pp, recompute):
    return 100.0 * tp + 10.0 * pp + (1.0 if recompute == "full" else 0.0)


def test_a_study_replays_a_table_and_screens_as_a_real_backend_would(tmp_path, capsys):
    rows = []
    for tp in (1, 2, 4):
        for pp in (1, 2):
            for recompute in ("none", "full"):
                if (tp, pp, recompute) == (4, 2, "none"):
                    continue  # a candidate nobody measured
                outcome = "oom" if (tp, pp, recompute) == (2, 2, "full") else "ok"
                value = goodput(tp, pp, recompute) if outcome == "ok" else ""
                rows.append([tp, pp, recompute, value, 40.0, outcome, "run-a", 30])
    write_table(
        tmp_path,
        ["tp", "pp", "recompute", "goodput", "step_time_ms", "outcome", "study", "run_s"],
        rows,
    )
    path = model(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "grid"]) == 0
    out = capsys.readouterr().out
    assert "replay: columns ignored: study" in out
    assert (
        "replay: no column for micro_batches, fusion_mb, grad_accum, parallel_optimizer: "
        "a row matches any value"
    ) in out
    frame = autotune.trials_frame("rep", storage)
    # the grid: 48 candidates, twice over parallel_optimizer where dp > 1 (all but tp4·pp2,
    # whose dp = 1 leaves fusion_mb nothing to act on: its 8 are 4)
    assert len(frame) == (48 - 8) * 2 + 4 and not (tmp_path / "trials").exists()
    from autotune.costmodel import estimate
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import load_spec

    spec = load_spec(path)
    for _, t in frame.iterrows():
        key = (t["tp"], t["pp"], t["recompute"])
        predicted = estimate(spec, Candidate(**{k: t[k] for k in KNOB_NAMES}))
        if not predicted.feasible:  # the OOM screen runs before the table is read
            assert t["outcome"] == "infeasible" and "GB" in t["detail"], t
        elif key == (4, 2, "none"):
            assert t["outcome"] == "infeasible" and t["detail"] == "not in the replay table"
        elif key == (2, 2, "full"):
            assert t["outcome"] == "oom"
        else:
            assert t["outcome"] == "ok" and t["goodput"] == goodput(*key)
            assert t["run_s"] == 30 and t["step_time_ms"] == 40.0
    assert set(frame["outcome"]) == {"ok", "oom", "infeasible"}
    # the table is a measurement: it calibrates the cost model
    study = optuna.load_study(study_name="rep", storage=storage)
    assert study.user_attrs["calibration"]["n_time"] == (frame["outcome"] == "ok").sum()


def test_a_studys_own_csv_replays_to_the_same_results(tmp_path, capsys):
    simulated = model(
        tmp_path, MODEL.replace("backend: replay, replay: table.csv", "backend: simulate")
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(simulated),
                "--storage",
                storage,
                "--study",
                "sim",
                "--trials",
                "8",
                "--sampler",
                "tpe",
            ]
        )
        == 0
    )
    assert main(["compare", "sim", "--storage", storage, "--csv", str(tmp_path / "table.csv")]) == 0
    path = model(tmp_path)
    assert main(["search", str(path), "--storage", storage, "--sampler", "grid"]) == 0
    out = capsys.readouterr().out
    assert "replay: columns ignored: study, number" in out
    # the frame names the engine its study priced, so the table replays with that engine
    assert "replay: its rows ran the mindspore engine (column engine)" in out, out
    rep = optuna.load_study(study_name="rep", storage=storage)
    assert rep.user_attrs["engine"] == "mindspore"
    original = autotune.trials_frame("sim", storage)
    original = original[original["outcome"] == "ok"].drop_duplicates("goodput")
    replayed = autotune.trials_frame("rep", storage).set_index(list(KNOB_NAMES))
    for _, t in original.iterrows():
        row = replayed.loc[tuple(t[k] for k in KNOB_NAMES)]
        assert row["outcome"] == "ok" and row["goodput"] == pytest.approx(t["goodput"])
    assert (replayed["outcome"] == "ok").sum() == len(original)


HEADER = ["tp", "pp", "recompute", "goodput", "outcome"]


@pytest.mark.parametrize(
    "rows, where, says",
    [
        ([[3, 1, "none", 5, "ok"]], "row 1, column tp", "3 is not in the space"),
        (
            [[1, 1, "none", 5, "ok", "true"]],
            "row 1, column infrastructure",
            "only an error is the infrastructure's, not 'ok'",
        ),
        ([[1, 1, "none", "fast", "ok"]], "row 1, column goodput", "'fast' is not a number"),
        ([[1, 1, "none", "", "ok"]], "row 1, column goodput", "an ok row needs a finite goodput"),
        ([[1, 1, "none", 5, "great"]], "row 1, column outcome", "'great' is not one of ok"),
        (
            [[1, 1, "everything", 5, "ok"]],
            "row 1, column recompute",
            "'everything' is not in the space",
        ),
        ([[1, 1.5, "none", 5, "ok"]], "row 1, column pp", "'1.5' is not an integer"),
    ],
)
def test_a_bad_table_exits_2_naming_row_and_column(tmp_path, capsys, rows, where, says):
    write_table(tmp_path, HEADER + ["infrastructure"][: max(map(len, rows)) - len(HEADER)], rows)
    path = model(tmp_path)
    assert main(["search", str(path), "--storage", f"sqlite:///{tmp_path}/s.db"]) == 2
    err = capsys.readouterr().err
    assert "table.csv" in err and where in err and says in err, err
    assert not (tmp_path / "s.db").exists()  # nothing written


def test_a_missing_table_and_a_table_on_another_backend_are_input_errors(tmp_path, capsys):
    path = model(tmp_path)
    assert main(["validate", str(path)]) == 2
    assert "cluster.replay: cannot read" in capsys.readouterr().err
    path = model(tmp_path, MODEL.replace("backend: replay", "backend: simulate"))
    assert main(["validate", str(path)]) == 2
    assert "cluster.replay: is read by backend replay only" in capsys.readouterr().err


def timed_table(tmp_path, run_s=100):
    """Every (tp, pp, recompute) of MODEL's space, each run taking ``run_s`` seconds."""
    rows = [
        [tp, pp, rc, goodput(tp, pp, rc), 40.0, run_s]
        for tp in (1, 2, 4)
        for pp in (1, 2)
        for rc in ("none", "full")
    ]
    write_table(tmp_path, ["tp", "pp", "recompute", "goodput", "step_time_ms", "run_s"], rows)


def runs(storage) -> int:
    frame = autotune.trials_frame("rep", storage)
    return int(frame["run_s"].notna().sum())


def test_a_budget_of_device_hours_stops_the_study_and_spans_resumes(tmp_path, capsys):
    timed_table(tmp_path)  # each run: 100 s × 8 devices = 0.222 device-hours
    path = model(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(path), "--storage", storage, "--trials", "40", "--sampler", "random"]
    assert main(args + ["--budget", "1dh"]) == 0
    out = capsys.readouterr().out
    # 4 runs use 0.889 dh; a fifth (the median run, 0.222 dh) would pass 1 dh
    assert runs(storage) == 4
    assert (
        "budget: budget 0.889 dh of 1 dh (89%) used; the next run would take about 0.222 dh" in out
    )
    assert "| budget 0.222 dh of 1 dh (22%)" in out  # the progress line shows what is used
    # the budget spans resumes: what the study used is counted again, nothing more runs
    assert main(args + ["--budget", "1dh", "--resume"]) == 0
    assert runs(storage) == 4
    assert main(args + ["--budget", "2dh", "--resume"]) == 0
    assert runs(storage) == 9  # 9 × 0.222 = 2.0: a tenth would pass 2 dh


def test_a_wall_time_budget_counts_the_replayed_run_times(tmp_path, capsys):
    timed_table(tmp_path, run_s=60)
    path = model(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ["search", str(path), "--storage", storage, "--trials", "40", "--sampler", "random"]
    assert main(args + ["--budget", "5m"]) == 0
    assert runs(storage) == 5  # replayed one after another: 5 × 60 s fill the 5 minutes
    study = optuna.load_study(study_name="rep", storage=storage)
    assert study.user_attrs["wall_s_used"] == 300


@pytest.mark.parametrize(
    "budget, says",
    [
        ("2x", "--budget '2x': give a wall time"),
        ("0h", "--budget '0h'"),
        ("-3dh", "--budget '-3dh'"),
    ],
)
def test_a_bad_budget_exits_2_naming_it(tmp_path, capsys, budget, says):
    timed_table(tmp_path)
    assert (
        main(
            [
                "search",
                str(model(tmp_path)),
                "--storage",
                f"sqlite:///{tmp_path}/s.db",
                f"--budget={budget}",
            ]
        )
        == 2
    )
    assert says in capsys.readouterr().err and not (tmp_path / "s.db").exists()


def test_a_budget_needs_runs_that_take_time(tmp_path, capsys):
    write_table(tmp_path, HEADER, [[1, 1, "none", 5, "ok"]])  # no run_s
    assert (
        main(
            [
                "search",
                str(model(tmp_path)),
                "--storage",
                f"sqlite:///{tmp_path}/s.db",
                "--budget",
                "2h",
            ]
        )
        == 2
    )
    assert "has no run_s column" in capsys.readouterr().err


def test_stop_when_flat_ends_a_search_that_stopped_improving(tmp_path, capsys):
    rows = [
        [tp, pp, rc, 100.0, 40.0] for tp in (1, 2, 4) for pp in (1, 2) for rc in ("none", "full")
    ]
    write_table(tmp_path, ["tp", "pp", "recompute", "goodput", "step_time_ms"], rows)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(model(tmp_path)),
                "--storage",
                storage,
                "--trials",
                "40",
                "--sampler",
                "random",
                "--stop-when-flat",
            ]
        )
        == 0
    )
    assert (
        "flat: the last 5 runs did not improve the best by more than 1%" in capsys.readouterr().out
    )
    frame = autotune.trials_frame("rep", storage)
    ran = frame[(frame["outcome"] == "ok") & frame["repeat_of"].isna()]
    assert len(ran) == 8  # the fewest runs the rule looks at


def test_rows_that_are_no_run_of_their_candidate_are_skipped(tmp_path, capsys):
    # as `autotune compare --csv` writes them: a lost attempt and its retry, a repeat, a confirm
    # re-run, an interrupted run: the repeat and the interrupted run are no runs
    header = [
        "number",
        "tp",
        "pp",
        "recompute",
        "goodput",
        "outcome",
        "repeat_of",
        "confirm_of",
        "infrastructure",
    ]
    write_table(
        tmp_path,
        header,
        [
            [0, 1, 1, "none", 5.0, "ok", "", "", "False"],
            [1, 2, 1, "none", "", "error", "", "", "True"],
            [2, 2, 1, "none", 7.0, "ok", "", "", "False"],
            [3, 1, 1, "none", 5.0, "ok", "0.0", "", "False"],
            [4, 1, 1, "none", 5.5, "ok", "", "0.0", "False"],
            [5, 4, 1, "none", "", "interrupted", "", "", "False"],
        ],
    )
    assert main(["validate", str(model(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "replay: 2 measured candidates in table.csv (4 rows" in out
    assert "replay: 2 rows skipped" in out and "columns ignored: number" in out
