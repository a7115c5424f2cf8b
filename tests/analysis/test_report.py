"""Seeing a study: the bottleneck diagnosis, `autotune show`, `compare`'s per-study summary and
`autotune report` on real simulate studies and one real CPU study."""

import importlib.util
import json
import re
import sys
import textwrap

import matplotlib.image
import optuna
import pandas as pd
import pytest

import autotune
from autotune.analysis import frames
from autotune.cli import main
from autotune.costmodel import diagnosis
from autotune.storage import schema
from tests.conftest import SIM8_MODEL, TINY_GPT_MODEL

DIAG = """
study: diag
model: {family: transformer, num_layers: 16, hidden_size: 2048, num_heads: 16, seq_length: 1024,
        vocab_size: 32000, dtype: bfloat16}
train: {global_batch_size: 512}
cluster: {backend: simulate, devices: 64, devices_per_node: 8, device: a100-80g}
search: {n_trials: 1, seed: 0}
"""

SIMULATE = (
    "study: sim\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 256],
          grad_accum: [1, 2], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  n_trials: 10
  objectives: [goodput, peak_memory]
  seed: 0
"""
)

# One worker, so a trial is one MindSpore process (no msrun): the cheapest real study there is.
REAL_CPU = (
    "study: cpu\n"
    + TINY_GPT_MODEL
    + """\
cluster: {backend: cpu, devices: 1, devices_per_node: 1, device_memory_gb: 8}
search:
  space: {fusion_mb: 64, grad_accum: [1, 2], loss_scale: [1024, 65536], warmup_steps: 0,
          jit_level: O1, recompute: [none, full]}
  n_trials: 2
  objectives: [goodput, final_loss]   # two objectives: never pruned, so both trials finish
  seed: 1
trial: {steps: 6, measure_after: 2, timeout_s: 240}
"""
)

NON_COMPUTE = ("recompute", "tp_comm", "pp_comm", "bubble", "dp_comm", "optimizer", "host")


def write(tmp_path, text, name="model.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def ok_numbers(study, storage) -> list[int]:
    """The ok trials the search ran, as `trials_frame` sees them (the report's per-trial points)."""
    frame = autotune.trials_frame(study, storage)
    ran = frame[(frame["outcome"] == "ok") & frame["repeat_of"].isna() & frame["confirm_of"].isna()]
    return sorted(int(n) for n in ran["number"])


@pytest.mark.parametrize(
    "name, knobs, part",
    [
        ("bubble", ["dp=8", "tp=1", "pp=8", "micro_batches=8", "recompute=none"], "bubble"),
        (
            "allreduce",
            ["dp=64", "tp=1", "pp=1", "fusion_mb=1", "grad_accum=1", "recompute=none"],
            "dp_comm",
        ),
    ],
)
def test_show_names_the_largest_non_compute_part(tmp_path, capsys, name, knobs, part):
    storage = f"sqlite:///{tmp_path}/s.db"
    sets = [arg for knob in knobs for arg in ("--set", knob)]
    assert (
        main(
            [
                "search",
                write(tmp_path, DIAG),
                "--storage",
                storage,
                "--study",
                name,
                "--trials",
                "1",
                *sets,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["show", name, "--storage", storage, "--trial", "0"]) == 0
    out = capsys.readouterr().out
    trial = optuna.load_study(study_name=name, storage=storage).trials[0]
    times = trial.user_attrs["estimate"]["breakdown"]["time_s"]
    largest = max(NON_COMPUTE, key=times.get)  # from the cost model's own breakdown
    assert largest == part
    stored = trial.user_attrs["diagnosis"]  # written when the trial was recorded
    assert stored["largest"] == part
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert verdict.split(":", 1)[1].strip().startswith(diagnosis.PARTS[part]), verdict
    assert f"{stored['shares'][part]:.0%}" in verdict
    # a trial recorded before diagnoses were stored gets the same one, computed on read
    older = {k: v for k, v in trial.user_attrs.items() if k != "diagnosis"}
    frozen = optuna.trial.create_trial(
        state=trial.state,
        values=trial.values,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs=older,
    )
    study_attrs = optuna.load_study(study_name=name, storage=storage).user_attrs
    assert diagnosis.of_trial(frozen, schema.knobs_of(trial), study_attrs) == stored
    assert main(["show", name, "--storage", storage]) == 0
    assert stored["verdict"] in capsys.readouterr().out.replace("\n", " ")


def test_verdict_puts_measured_alarms_first():
    breakdown = {"compute": 0.5, "bubble": 0.3, "host": 0.2}
    found = diagnosis.diagnose(
        breakdown,
        {"step_time_ms": 2000.0, "overflow_rate": 0.25, "peak_memory_mb": 7800.0},
        {"pp": 2},
        8.0,
    )
    assert found["parts_ms"]["bubble"] == pytest.approx(600.0)  # 30% of the measured 2 s
    assert found["verdict"].startswith("peak memory 95% of the budget")
    assert "overflows 25%" in found["verdict"] and "bubble 30%" in found["verdict"]
    assert diagnosis.diagnose(breakdown, {}) is None  # nothing measured to scale by


def figure_traces(path) -> list[dict]:
    """The data of the plotly figure a report's HTML page draws."""
    text = path.read_text()
    start = re.search(r'Plotly\.newPlot\(\s*"[^"]*",\s*', text)
    return json.JSONDecoder().raw_decode(text, start.end())[0]


def points(traces, mode="markers") -> int:
    return sum(len(t.get("x") or ()) for t in traces if t.get("mode") == mode)


def check_report(out, studies, storage, objective="goodput"):
    """index.html links every figure; each per-trial figure holds one point per ok trial; no
    PNG is blank."""
    index = (out / "index.html").read_text()
    pngs = sorted(out.glob("*.png"))
    for png in pngs:
        assert f"src='{png.name}'" in index and f"href='{png.stem}.html'" in index
        assert (out / f"{png.stem}.html").exists()
        pixels = matplotlib.image.imread(png)[..., :3]
        ink = (pixels.min(axis=2) < 0.9).mean()  # share of pixels that are not near-white
        assert ink > 0.02, f"{png.name} is blank ({ink:.1%} ink)"
        assert len(set(map(tuple, pixels.reshape(-1, 3)[::97]))) > 8, f"{png.name}: flat image"
    for study in studies:
        numbers = ok_numbers(study, storage)
        assert len(numbers) >= 2
        traces = {
            f: figure_traces(out / f"{study}-{f}.html")
            for f in ("history", "parallel", "slice", "memory")
        }
        history = next(t for t in traces["history"] if t.get("name") == objective)
        assert sorted(history["x"]) == numbers
        lines = [t for t in traces["parallel"] if t.get("mode") == "lines"]
        assert len(lines) == len(numbers)  # one line per trial across the knobs
        for axis in {t.get("xaxis") for t in traces["slice"]}:  # every knob's panel
            assert points([t for t in traces["slice"] if t.get("xaxis") == axis]) == len(numbers)
        assert points(traces["memory"]) == len(numbers)
    return pngs


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim")
    storage = f"sqlite:///{folder}/s.db"
    path = write(folder, SIMULATE)
    assert main(["search", path, "--storage", storage]) == 0
    assert (
        main(
            [
                "search",
                path,
                "--storage",
                storage,
                "--study",
                "sim2",
                "--sampler",
                "random",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    return folder, storage


def test_report_of_simulated_studies(simulated, tmp_path, capsys):
    folder, storage = simulated
    out = tmp_path / "report"
    assert main(["report", "sim", "sim2", "--storage", storage, "--out", str(out)]) == 0
    pngs = check_report(out, ["sim", "sim2"], storage)
    names = {p.stem for p in pngs}
    assert {
        "sim-history",
        "sim-importances",
        "sim-parallel",
        "sim-slice",
        "sim-pareto",
        "sim-memory",
        "sim-breakdown",
        "studies-history",
    } <= names
    for study in ("sim", "sim2"):
        pareto = figure_traces(out / f"{study}-pareto.html")
        assert points(pareto) == len(ok_numbers(study, storage))
    together = figure_traces(out / "studies-history.html")
    assert [len(t["x"]) for t in together] == [len(ok_numbers(s, storage)) for s in ("sim", "sim2")]
    index = (out / "index.html").read_text()
    assert "Diagnosis of #" in index and "trials_to_3pct" in index
    assert "a simulated trial is its estimate" in index  # why there is no estimate figure

    # bad input: exit 2, a message naming it, nothing written
    capsys.readouterr()
    assert main(["report", "sim", "--storage", storage, "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    assert main(["report", "sim", "nope", "--storage", storage, "--out", str(fresh)]) == 2
    assert "'nope' not found" in capsys.readouterr().err and not fresh.exists()
    assert (
        main(["report", "sim", "--storage", f"sqlite:///{tmp_path}/none.db", "--out", str(fresh)])
        == 2
    )
    assert "no such storage file" in capsys.readouterr().err and not fresh.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_report_without_plotting_packages_names_the_install(
    simulated, tmp_path, capsys, monkeypatch
):
    folder, storage = simulated
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly fails
    out = tmp_path / "report"
    assert main(["report", "sim", "--storage", storage, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs plotly" in err and "pip install" in err and "Traceback" not in err
    assert not out.exists()


def test_compare_prints_the_per_study_summary(simulated, tmp_path, capsys):
    folder, storage = simulated
    capsys.readouterr()
    parquet = tmp_path / "all.parquet"
    code = main(["compare", "sim", "sim2", "--storage", storage, "--parquet", str(parquet)])
    out, err = capsys.readouterr()
    if importlib.util.find_spec("pyarrow") or importlib.util.find_spec("fastparquet"):
        assert code == 0
        assert set(pd.read_parquet(parquet)["study"]) == {"sim", "sim2"}
    else:  # pandas has no Parquet engine here (make install leaves pyarrow out)
        assert code == 2 and "pip install pyarrow" in err and not parquet.exists()
        assert main(["compare", "sim", "sim2", "--storage", storage]) == 0
        out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    for field in (
        "best_trial",
        "best_goodput",
        "trials_to_3pct",
        "ok",
        "infeasible",
        "device_hours",
    ):
        assert len(rows[field]) == 2, field
    assert rows["device_hours"] == ["0.0", "0.0"]  # nothing ran on a simulated pool
    frame = autotune.trials_frame("sim", storage).set_index("number")
    summary = frames.summary(["sim"], storage)["sim"]
    values = frame.loc[ok_numbers("sim", storage), "value_goodput"]
    best = values.max()
    assert summary["best_goodput"] == best and summary["best_trial"] == values.idxmax()
    ran = [n for n in frame.index if pd.isna(frame.loc[n, "repeat_of"])]
    reached = next(n for n in ran if frame.loc[n, "value_goodput"] >= 0.97 * best)
    assert summary["trials_to_3pct"] == ran.index(reached) + 1


@pytest.mark.slow
def test_report_and_show_of_a_real_cpu_study(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                write(tmp_path, REAL_CPU),
                "--storage",
                storage,
                "--no-confirm",
                "--artifacts",
                str(tmp_path / "trials"),
            ]
        )
        == 0
    )
    assert ok_numbers("cpu", storage) == [0, 1], autotune.trials_frame("cpu", storage)["detail"]
    out = tmp_path / "report"
    assert main(["report", "cpu", "--storage", storage, "--out", str(out)]) == 0
    pngs = check_report(out, ["cpu"], storage)
    assert len(pngs) >= 6
    assert points(figure_traces(out / "cpu-pareto.html")) == 2
    estimate = figure_traces(out / "cpu-estimate.html")  # both panels: one point per trial
    assert [len(t["x"]) for t in estimate if t["mode"] == "markers"] == [2, 2]
    capsys.readouterr()
    assert main(["show", "cpu", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "largest non-compute part" in out
    stored = optuna.load_study(study_name="cpu", storage=storage).trials[0].user_attrs
    assert stored["diagnosis"]["facts"]["memory_budget_mb"] == 8 * 1024
    assert stored["diagnosis"]["verdict"] in out.replace("\n", " ")
