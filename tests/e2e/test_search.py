"""The search loop end to end: real MindSpore trials through a real embedded Ray into a real
SQLite Optuna storage; infeasible candidates never run; resume loses nothing."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import optuna
import pytest

import autotune
from autotune.cli import main
from autotune.search.untried import STALL
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting
from tests.conftest import ROOT, SIM8_MODEL, TINY_GPT_MODEL, stop_cluster

TINY_CPU = (
    "study: tiny\n"
    + TINY_GPT_MODEL
    + """\
cluster: {backend: cpu, devices: 2, devices_per_node: 2, device_memory_gb: 8}
search:
  space: {fusion_mb: [1, 64], grad_accum: [1, 2], loss_scale: [1024, 65536],
          warmup_steps: [0, 20], jit_level: [O0, O1], recompute: [none]}
  n_trials: 2
  objectives: [goodput, final_loss]
  seed: 1
trial: {steps: 8, measure_after: 2, timeout_s: 240}
"""
)

SIMULATE = (
    "study: sim\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 256],
          grad_accum: [1, 2], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  n_trials: 6
  seed: 0
"""
)


def ray_processes() -> list[str]:
    """Ray's raylet and GCS processes of this virtualenv's Ray (another checkout's studies on
    the same machine are not ours to count)."""
    venv = str(Path(sys.executable).parent.parent)
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()
        if ("raylet" in line or "gcs_server" in line) and line.startswith(venv)
    ]


def write(tmp_path, text):
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_real_search_of_every_layout_into_sqlite_then_export(tmp_path, capsys, monkeypatch):
    """make test's one end-to-end search: the baseline (dp2), then one trial of each other
    layout (a plain sampler opens so: pp2, tp2), each a real two-worker MindSpore run through
    the embedded Ray into the default SQLite storage; then the best is exported."""
    path = write(tmp_path, TINY_CPU)
    monkeypatch.chdir(tmp_path)  # the defaults a user gets: trials/ and its database here
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    assert main(["search", str(path), "--trials", "3", "--sampler", "tpe", "--no-confirm"]) == 0
    out = capsys.readouterr().out
    assert "[3/3]" in out and "best " in out and "ETA" in out
    storage = "sqlite:///trials/autotune.db"
    frame = autotune.trials_frame("tiny", storage)
    assert list(frame["outcome"]) == ["ok", "ok", "ok"], frame["detail"].tolist()
    assert frame["baseline"].tolist() == [True, False, False]
    assert sorted(zip(frame["dp"], frame["tp"], frame["pp"])) == [(1, 1, 2), (1, 2, 1), (2, 1, 1)]
    for knob in KNOB_NAMES:
        assert frame[knob].notna().all(), knob
    for _, t in frame.iterrows():
        folder = tmp_path / "trials" / "tiny" / str(t["number"])
        logs = sorted(p.name for p in (folder / "logs").glob("worker_*.log"))
        assert logs == ["worker_0.log", "worker_1.log"]
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["goodput"] == pytest.approx(t["goodput"]) and t["goodput"] > 0
        config = json.loads((folder / "config.json").read_text())
        assert config["knobs"]["dp"] == t["dp"]
    assert frame["driver_s"].max() < 5  # ask + feasibility + submit is not the bottleneck
    # every measured trial refits the cost model's correction, stored with the study
    calibration = optuna.load_study(study_name="tiny", storage=storage).user_attrs["calibration"]
    assert calibration["n_memory"] == 3 and calibration["memory_factor"] > 0
    # every layout starts from the same weights and data: the same first loss (float16)
    assert frame["loss_first"].max() == pytest.approx(frame["loss_first"].min(), rel=1e-2)
    assert not ray_processes(), "embedded Ray left processes behind"
    # where each trial's time went; the three ran one after another in the same warm workers
    from autotune.jobs import TIME_PARTS

    for _, t in frame.iterrows():
        parts = [t[p] for p in TIME_PARTS]
        assert all(x >= 0 for x in parts) and t["steps_s"] > 0
        assert 0.8 * t["run_s"] <= sum(parts) <= t["run_s"] + 0.05, (parts, t["run_s"])
        launched = (
            tmp_path / "trials" / "tiny" / str(t["number"]) / "logs" / "msrun.log"
        ).read_text()
        assert launched.startswith("launched: ")
        assert f"warm workers: trial {t['number']} of the processes" in launched
    assert frame["init_s"].iloc[1:].max() < frame["init_s"].iloc[0] / 5  # the start paid once
    assert main(["show", "tiny", "--storage", storage]) == 0
    assert "device time:" in capsys.readouterr().out

    out = tmp_path / "export"
    assert main(["export", "tiny", "--out", str(out), "--storage", storage]) == 0
    summary = json.loads((out / "summary.json").read_text())
    best = frame.set_index("number").loc[summary["trial"]]
    assert summary["knobs"] == {k: best[k] for k in KNOB_NAMES}
    import mindspore

    strategy = mindspore.parallel.build_searched_strategy(str(out / "strategy.ckpt"))
    assert len(strategy) == len(summary["parameters"]) * 3  # each parameter and its two moments


def test_predicted_oom_is_infeasible_and_never_runs(tmp_path, capsys):
    path = write(tmp_path, TINY_CPU.replace("device_memory_gb: 8", "device_memory_gb: 0.01"))
    storage = f"sqlite:///{tmp_path}/s.db"
    art = tmp_path / "trials"
    assert main(["search", str(path), "--storage", storage, "--artifacts", str(art)]) == 0
    # no rejection counts toward the 2 trials: the study ends when no candidate is left
    assert re.search(
        r"the space is exhausted: every candidate has run or is infeasible \(0 ran, \d+ "
        r"infeasible\)",
        capsys.readouterr().out,
    )
    frame = autotune.trials_frame("tiny", storage)
    assert len(frame) > 2 and set(frame["outcome"]) == {"infeasible"}
    # each with its reason: the memory screen's (the baseline's), or a constraint the sampler
    # ran into
    assert "GB" in frame["detail"][0] and (frame["detail"] != "").all()
    assert not (art / "tiny").exists()
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)


def test_constraint_violations_are_recorded_with_reason(tmp_path, capsys):
    text = SIMULATE.replace("n_trials: 6", "n_trials: 40").replace(
        "tp: [1, 2, 4]", "tp: [1, 2, 4, 8]"
    )
    text = text.replace("pp: [1, 2]", "pp: [1, 2, 4]")
    # tp = 8 cannot divide 12 heads (hidden 1152 keeps 96 per head)
    text = text.replace("hidden_size: 1024, num_heads: 16", "hidden_size: 1152, num_heads: 12")
    path = write(tmp_path, text)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "grid"]) == 0
    # a value no layout can use is removed from the space, with one line saying so ...
    assert (
        "tp: 8 removed: no feasible layout of this model on 8 devices uses them"
        in capsys.readouterr().out
    )
    frame = autotune.trials_frame("sim", storage)
    assert 8 not in set(frame["tp"])
    # ... a combination that breaks a constraint is recorded with the reason and never runs
    bad = frame[(frame["pp"] == 4) & (frame["micro_batches"] == 2)]
    assert len(bad) and (bad["outcome"] == "infeasible").all()
    assert bad["detail"].str.contains("micro_batches = 2 < pp = 4").all()


def test_simulate_grid_enumerates_once_and_resume_loses_nothing(tmp_path):
    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "grid"]) == 0
    frame = autotune.trials_frame("sim", storage)
    knobs = frame[list(KNOB_NAMES)].astype(str).agg("|".join, axis=1)
    assert knobs.is_unique
    # tp 3 × pp 2 × recompute 2 × fusion 2 × (grad_accum 2 when pp = 1, micro_batches 2 when
    # pp = 2) × parallel_optimizer 2 where dp > 1: all but tp4·pp2, whose dp = 1 leaves fusion
    # and the parallel optimizer nothing to act on (recompute 2 × micro_batches 2: 4 candidates)
    assert len(frame) == (3 * 2 * 2 * 2 * 2 - 8) * 2 + 4

    # TPE study; a driver that dies leaves a RUNNING trial; --resume reruns it and reaches N
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "tpe",
                "--trials",
                "3",
                "--sampler",
                "tpe",
            ]
        )
        == 0
    )
    study = optuna.load_study(study_name="tpe", storage=storage)
    # a driver that asked a candidate none of the 3 trials ran (the baseline and the layout
    # openers have recompute none), then died
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    space = build_space(load_spec(path))
    study.enqueue_trial(
        space.params_of(
            Candidate(
                dp=1,
                tp=4,
                pp=2,
                micro_batches=4,
                fusion_mb=256,
                grad_accum=1,
                loss_scale=65536,
                warmup_steps=0,
                jit_level="O1",
                recompute="full",
            )
        )
    )
    orphan = study.ask()
    space.sample(orphan)
    orphan = study.trials[orphan.number]
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "tpe",
                "--trials",
                "5",
                "--resume",
                "--sampler",
                "tpe",
            ]
        )
        == 0
    )
    frame = autotune.trials_frame("tpe", storage)
    assert frame.loc[orphan.number, "outcome"] == "interrupted"
    # the interrupted candidate ran again, under a new number, and was not just counted
    study = optuna.load_study(study_name="tpe", storage=storage)
    rerun = [
        t
        for t in study.trials
        if t.params == orphan.params
        and t.number > orphan.number
        and "repeat_of" not in t.user_attrs
    ]
    assert len(rerun) == 1 and rerun[0].user_attrs["outcome"] in ("ok", "infeasible")
    counted = frame[(frame["outcome"] != "interrupted") & frame["repeat_of"].isna()]
    assert len(counted) == 5
    assert (counted["number"] > orphan.number).sum() == 2
    repeats = frame[frame["repeat_of"].notna()]  # answered from storage, never run twice
    for _, row in repeats.iterrows():
        assert row["goodput"] == frame.loc[int(row["repeat_of"]), "goodput"]


ONE_DEVICE = TINY_CPU.replace("devices: 2, devices_per_node: 2", "devices: 1, devices_per_node: 1")


@pytest.mark.slow
def test_joins_an_existing_ray_cluster_and_runs_trials_side_by_side(tmp_path, monkeypatch):
    from autotune.execution.runner import free_port

    # a two-CPU Ray cluster on loopback, started the way a user would: `ray start --head`
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = str(Path(sys.executable).with_name("ray"))
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit in 107 bytes
    started = subprocess.run(
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
        ],
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        path = write(tmp_path, ONE_DEVICE)  # one-device trials: two fit side by side
        storage = f"sqlite:///{tmp_path}/s.db"
        assert (
            main(
                [
                    "search",
                    str(path),
                    "--storage",
                    storage,
                    "--artifacts",
                    str(tmp_path / "art"),
                    "--ray-address",
                    f"127.0.0.1:{port}",
                    "--no-confirm",
                ]
            )
            == 0
        )
    finally:
        stop_cluster(temp)
        shutil.rmtree(temp, ignore_errors=True)
    frame = autotune.trials_frame("tiny", storage)
    assert list(frame["outcome"]) == ["ok", "ok"], frame["detail"].tolist()
    assert (frame["dp"] == 1).all()
    # neither waited for the other: both started before either could have finished
    assert frame["queued_s"].max() < frame["run_s"].min()


@pytest.mark.slow
def test_clearly_slow_trial_is_pruned_while_running(tmp_path):
    # graph mode first (sets the best), then PyNative, which runs several times slower
    text = ONE_DEVICE.replace("objectives: [goodput, final_loss]", "objectives: [goodput]")
    text = text.replace("jit_level: [O0, O1]", "jit_level: [O1, pynative]")
    text = text.replace(
        "fusion_mb: [1, 64], grad_accum: [1, 2], loss_scale: [1024, 65536],\n"
        "          warmup_steps: [0, 20]",
        "fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0",
    )
    # a precision no run reaches: the PyNative trial must be stopped by the pruner, not end
    # early as an ok trial because its step time was known (trial.precision)
    text = text.replace(
        "steps: 8, measure_after: 2", "steps: 200, measure_after: 2, precision: 1.0e-6"
    )
    path = write(tmp_path, text)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--sampler",
                "grid",
                "--artifacts",
                str(tmp_path / "art"),
                "--no-confirm",
            ]
        )
        == 0
    )
    frame = autotune.trials_frame("tiny", storage).set_index("jit_level")
    assert frame.loc["O1", "outcome"] == "ok"
    assert frame.loc["pynative", "outcome"] == "pruned", frame.loc["pynative", "detail"]
    assert "below 0.5× the best" in frame.loc["pynative", "detail"]
    steps = tmp_path / "art" / "tiny" / str(frame.loc["pynative", "number"]) / "steps.jsonl"
    assert 3 <= len(steps.read_text().splitlines()) < 200  # stopped early, not run to the end
    # its devices were held until it stopped: that time counts toward a budget
    assert frame.loc["pynative", "run_s"] > 0
    # the steps the pruner judged were read by the trial program's rules; the record says which
    from autotune.train.metrics import MEASUREMENT

    assert frame.loc["pynative", "measurement"] == MEASUREMENT
    assert not ray_processes()


def test_two_objectives_give_a_pareto_front_and_export_takes_a_point_of_it(tmp_path):
    text = SIMULATE.replace(
        "n_trials: 6\n  seed: 0", "n_trials: 12\n  seed: 0\n  objectives: [goodput, peak_memory]"
    )
    path = write(tmp_path, text)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "grid"]) == 0
    study = optuna.load_study(study_name="sim", storage=storage)
    front = study.best_trials
    assert len(front) > 1  # faster layouts cost memory: no single best
    out = tmp_path / "export"
    assert main(["export", "sim", "--out", str(out), "--storage", storage]) == 0
    exported = json.loads((out / "summary.json").read_text())["trial"]
    assert exported in {t.number for t in front}
    assert exported == max(front, key=lambda t: t.values[0]).number


def test_resume_refuses_a_changed_study_and_accepts_a_new_budget(tmp_path, capsys):
    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "2"]) == 0
    # more trials, another seed or sampler: the same study, continued
    assert (
        main(
            ["search", str(path), "--storage", storage, "--trials", "3", "--seed", "5", "--resume"]
        )
        == 0
    )
    capsys.readouterr()
    # another model or space is another study: refused, naming what changed, nothing run
    changed = write(
        tmp_path,
        SIMULATE.replace("hidden_size: 1024", "hidden_size: 2048").replace(
            "recompute: [none, full]", "recompute: full"
        ),
    )
    before = len(autotune.trials_frame("sim", storage))
    # the same name without --resume is refused rather than silently mixed into the old study
    assert main(["search", str(path), "--storage", storage]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["search", str(changed), "--storage", storage, "--trials", "5", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "was run with other model, space" in err
    assert len(autotune.trials_frame("sim", storage)) == before


@pytest.mark.slow
def test_confirm_phase_reruns_the_best_and_the_baseline_and_export_takes_the_confirmed_best(
    tmp_path, capsys
):
    text = ONE_DEVICE.replace("objectives: [goodput, final_loss]", "objectives: [goodput]")
    path = write(tmp_path, text)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--artifacts",
                str(tmp_path / "art"),
                "--trials",
                "3",
                "--confirm",
                "1",
                "--confirm-runs",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="tiny", storage=storage)
    trials = study.trials
    originals = [t for t in trials if "confirm_of" not in t.user_attrs]
    reruns = [t for t in trials if "confirm_of" in t.user_attrs]
    assert sum(counting.counted(t) for t in trials) == 3  # re-runs don't count toward N
    best = max((t for t in originals if t.values), key=lambda t: t.values[0])
    baseline = next(t for t in originals if t.user_attrs.get("baseline"))
    confirmed = {best.number, baseline.number}
    # each confirmed trial ran twice more, with its own knobs; round by round
    assert sorted(t.user_attrs["confirm_of"] for t in reruns) == sorted(list(confirmed) * 2)
    assert all(t.params == study.trials[t.user_attrs["confirm_of"]].params for t in reruns)
    assert len({t.user_attrs["confirm_of"] for t in reruns[: len(confirmed)]}) == len(confirmed)
    # mean ± sd printed, the noise floor stored and printed
    floor = study.user_attrs["noise_floor"]
    assert (
        0 <= floor < 1
        and f"noise floor (median sd/mean of confirmed configurations): {floor:.1%}" in out
    )
    assert f"#{baseline.number} baseline: " in out and "(n=2; original " in out
    if best.number != baseline.number:  # the ratio of confirmed means, whichever won
        mean = {
            n: statistics.mean([t.values[0] for t in reruns if t.user_attrs["confirm_of"] == n])
            for n in confirmed
        }
        assert (
            f"#{best.number} vs baseline #{baseline.number}: {mean[best.number] / mean[baseline.number]:.2f}× ± "
            in out
        )
    assert "confirm [1/" in out
    # export takes the best confirmed mean, not the best single run
    values = {
        n: [t.values[0] for t in reruns if t.user_attrs["confirm_of"] == n and t.values]
        for n in confirmed
    }
    expected = max(values, key=lambda n: sum(values[n]) / len(values[n]))
    assert main(["export", "tiny", "--out", str(tmp_path / "export"), "--storage", storage]) == 0
    assert json.loads((tmp_path / "export" / "summary.json").read_text())["trial"] == expected


# Failure memory (autotune.study.retry): a candidate's own failure is remembered, an
# infrastructure failure is retried once. A user model on one device keeps the trials short.
USER_MODEL = """
study: fail
model: {entry: "{entry}", dtype: float32, input_size: 4, num_classes: 3}
train: {global_batch_size: 8, learning_rate: 1.0e-2, total_steps: 100}
cluster: {backend: cpu, devices: 1, devices_per_node: 1, device_memory_gb: 8}
search:
  space: {fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0, jit_level: [O0, O1],
          recompute: none}
  n_trials: 2
  sampler: random
  seed: 0
  # two objectives: never pruned (Optuna prunes one objective only) — three measured steps of a
  # 4-step run are too few for the pruner to judge on a shared machine (a rerun was stopped at
  # 0.42× the best); these tests are about failures
  objectives: [goodput, final_loss]
trial: {steps: 4, measure_after: 1, timeout_s: 120}
"""

BROKEN_MODEL = """
def build(config):
    raise RuntimeError("this network does not build")
"""


def ran(study) -> list:
    """The trials that ran a candidate (not answered from memory)."""
    return [t for t in study.trials if "repeat_of" not in t.user_attrs]


@pytest.mark.slow
def test_a_candidates_own_failure_runs_once_in_a_run_and_after_resume(tmp_path):
    # the space is exhausted after two: the study ends before its 4 trials
    (tmp_path / "broken.py").write_text(BROKEN_MODEL)
    path = write(tmp_path, USER_MODEL.replace("{entry}", "broken.py:build"))
    storage, art = f"sqlite:///{tmp_path}/s.db", tmp_path / "art"
    args = ["search", str(path), "--storage", storage, "--artifacts", str(art), "--no-confirm"]
    assert main(args + ["--trials", "4"]) == 0
    study = optuna.load_study(study_name="fail", storage=storage)
    # two candidates (jit_level O0, O1), each run once: every later proposal of either is
    # answered from memory, with the candidate's own error
    assert sorted(t.params["jit_level"] for t in ran(study)) == ["O0", "O1"]
    for t in ran(study):
        assert t.user_attrs["outcome"] == "error" and not t.user_attrs.get("infrastructure")
        assert "RuntimeError: this network does not build" in t.user_attrs["detail"]
    repeats = [t for t in study.trials if "repeat_of" in t.user_attrs]
    assert len(repeats) >= STALL  # the last STALL in a row: then no untried one was left
    for t in repeats:
        original = study.trials[t.user_attrs["repeat_of"]]
        assert t.params == original.params and t.user_attrs["outcome"] == "error"
    assert sorted(p.name for p in (art / "fail").iterdir()) == sorted(
        str(t.number) for t in ran(study)
    )

    # a restart remembers them too: nothing runs again
    assert main(args + ["--trials", "5", "--resume"]) == 0
    study = optuna.load_study(study_name="fail", storage=storage)
    assert len(ran(study)) == 2 and len(study.trials) == 2 + len(repeats) + STALL
    assert len(list((art / "fail").iterdir())) == 2


def kill_runners_of(trial_dirs: list[Path], stop) -> list[int]:
    """SIGKILL the Ray worker that runs each trial of ``trial_dirs``, as soon as its trial
    program has it: the parent of the warm worker (``--serve POOL``) whose pool was handed that
    trial's config. Only processes descending from this test's own are candidates. Returns the
    pids killed."""
    import signal
    import time

    from autotune import procfs

    def parent(pid):
        info = procfs.stat(pid)
        return info.ppid if info else 0

    def descends_from_us(pid):
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent(pid)
        return False

    def handed(pool: Path) -> str:
        """The handovers the pool's workers were given (`autotune.train.runtime.serve`), as text."""
        texts = []
        for path in pool.glob("trial.*.json"):
            try:
                texts.append(path.read_text())
            except OSError:  # taken back as the trial ended
                pass
        return " ".join(texts)

    killed, todo = [], [str(d / "config.json") for d in trial_dirs]
    while todo and not stop.is_set():
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                argv = Path(entry.path, "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            pool = argv[-2] if argv[-3:-2] == ["--serve"] else None  # cmdline ends with \0
            if (
                todo
                and pool
                and todo[0] in handed(Path(pool))
                and descends_from_us(int(entry.name))
            ):
                worker = parent(int(entry.name))
                os.kill(worker, signal.SIGKILL)
                killed.append(worker)
                todo.pop(0)
        time.sleep(0.05)
    return killed


@pytest.mark.slow
def test_an_infrastructure_failure_is_retried_once_and_not_remembered_after_resume(
    tmp_path, capsys
):
    import threading

    path = write(
        tmp_path, USER_MODEL.replace("{entry}", str(ROOT / "examples" / "user_model.py") + ":build")
    )
    storage, art = f"sqlite:///{tmp_path}/s.db", tmp_path.resolve() / "art"
    args = ["search", str(path), "--storage", storage, "--artifacts", str(art), "--no-confirm"]
    # the Ray worker running the baseline dies, and so does the one running its retry
    stop, killed = threading.Event(), []
    killer = threading.Thread(
        target=lambda: killed.extend(
            kill_runners_of([art / "fail" / "0", art / "fail" / "1"], stop)
        )
    )
    killer.start()
    try:
        assert main(args) == 0
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 2
    out = capsys.readouterr().out
    assert "#0 failed by infrastructure, not by its candidate (infrastructure: Ray: " in out
    study = optuna.load_study(study_name="fail", storage=storage)
    first, retry = study.trials[0], study.trials[1]
    # the failed attempt is on record, not counted; its params ran again once, as the baseline
    assert first.user_attrs["outcome"] == "error" and first.user_attrs["infrastructure"] is True
    assert (
        "WorkerCrashedError" in first.user_attrs["detail"] or "died" in first.user_attrs["detail"]
    )
    assert not counting.counted(first)
    assert retry.params == first.params and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["baseline"] is True
    # the retry failed by infrastructure too: that counts, and no third run of it this run
    assert retry.user_attrs["outcome"] == "error" and retry.user_attrs["infrastructure"] is True
    assert counting.counted(retry)
    assert [t.number for t in ran(study) if t.params == first.params] == [0, 1]
    # and with every run of the session lost before its candidate, a retry among them, the
    # study stops there in one line (the cluster cannot run trials as it is)
    assert "failed before their candidate ran, a retry among them" in out
    assert sum(counting.counted(t) for t in study.trials) == 1
    assert [t.number for t in ran(study)] == [0, 1]

    # after a restart an infrastructure failure is not remembered: the candidate runs again
    assert main(args + ["--trials", "3", "--resume"]) == 0
    study = optuna.load_study(study_name="fail", storage=storage)
    again = [t for t in ran(study) if t.params == first.params and t.number > 1]
    assert [t.user_attrs["outcome"] for t in again] == ["ok"]
    assert sum(counting.counted(t) for t in study.trials) == 3


def test_which_failures_count_and_which_a_restart_remembers():
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.study import retry

    def stored(**attrs):
        return create_trial(
            state=TrialState.FAIL,
            params={"jit_level": "O1"},
            distributions={"jit_level": CategoricalDistribution(["O0", "O1"])},
            user_attrs={"outcome": "error", **attrs},
        )

    own, lost = stored(detail="autotune.train: RuntimeError: ..."), stored(infrastructure=True)
    lost_twice = stored(infrastructure=True, retry_of=3)
    assert counting.counted(own) and retry.remembered_after_restart(own)
    assert not counting.counted(lost) and not retry.remembered_after_restart(lost)
    assert counting.counted(lost_twice) and not retry.remembered_after_restart(lost_twice)
