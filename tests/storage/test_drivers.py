"""Several drivers on one study: real `autotune search --resume` processes side by side on a real
PostgreSQL server started here (Debian's package, run as the `postgres` user: it refuses root),
and the recovery rule that fails a dead driver's trials but never a live one's.

The server is `tests/storage/conftest.py`'s `postgres` fixture."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.spec.knobs import KNOB_NAMES
from autotune.storage.counting import counted
from autotune.storage.drivers import OWNER, driver_id
from autotune.storage.recovery import recover_interrupted
from autotune.storage.schema import knobs_of, outcome_of
from tests.conftest import SIM8_MODEL
from tests.e2e.test_search import ONE_DEVICE  # noqa: E402

BIN = Path(sys.executable).parent
SIMULATE = (
    "study: sim\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 64, 256],
          grad_accum: [1, 2], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  seed: 0
"""
)


def drivers(tmp_path, text, storage, study, n, extra=(), count=2):
    """``count`` `autotune search --resume` processes on one study, started together; returns
    their (exit code, output)."""
    (tmp_path / "model.yaml").write_text(textwrap.dedent(text))
    argv = [
        str(BIN / "autotune"),
        "search",
        "model.yaml",
        "--storage",
        storage,
        "--study",
        study,
        "--trials",
        str(n),
        "--resume",
        *extra,
    ]
    procs = []
    for i in range(count):
        log = open(tmp_path / f"driver{i}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    argv + ["--artifacts", str(tmp_path / "art")],
                    cwd=tmp_path,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    results = []
    for proc, log in procs:
        try:
            proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        results.append((proc.returncode, Path(log.name).read_text()))
    return results


def check_study(storage, study, n):
    """N counted trials, none failed, no candidate run twice; returns the trials."""
    trials = optuna.load_study(study_name=study, storage=storage).trials
    assert [t.number for t in trials] == list(range(len(trials)))
    assert sum(map(counted, trials)) == n
    assert not [
        t.number for t in trials if t.state != TrialState.COMPLETE and t.state != TrialState.PRUNED
    ], [(t.number, t.state, t.user_attrs) for t in trials]
    ran = [
        tuple(knobs_of(t)[k] for k in KNOB_NAMES)
        for t in trials
        if not {"repeat_of", "confirm_of"} & set(t.user_attrs) and outcome_of(t) != "infeasible"
    ]
    assert len(ran) == len(set(ran)), "a candidate ran twice"
    assert (
        sum(
            bool(t.user_attrs.get("baseline"))
            for t in trials
            if "confirm_of" not in t.user_attrs and "repeat_of" not in t.user_attrs
        )
        == 1
    )
    return trials


@pytest.mark.slow
def test_two_simulate_drivers_reach_n_in_total_without_running_a_candidate_twice(
    tmp_path, postgres
):
    study, n = "sim-two", 24
    results = drivers(tmp_path, SIMULATE, postgres, study, n, ["--sampler", "tpe"])
    for code, out in results:
        assert code == 0, out[-3000:]
    trials = check_study(postgres, study, n)
    owners = {t.user_attrs.get(OWNER) for t in trials}
    assert len(owners) == 2, owners  # both drivers asked trials


@pytest.mark.filterwarnings(
    "ignore::optuna.exceptions.ExperimentalWarning",
    "ignore:Heartbeat of storage is supposed to be used",
)
def test_recovery_fails_a_dead_or_silent_drivers_trials_and_never_a_live_ones(tmp_path):
    """The rule itself, on an RDB storage with heartbeats (SQLite here, so it runs anywhere;
    the storage code is the same for PostgreSQL): of five RUNNING trials, only the one whose
    heartbeats stopped and the one whose driver process on this machine has ended are failed
    (read back as interrupted) and queued again."""
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=1
    )
    study = optuna.create_study(storage=storage, study_name="s")
    x = optuna.distributions.IntDistribution(0, 10)
    gone = subprocess.Popen(["sleep", "0"])
    dead_here = driver_id(gone.pid)  # recorded while it runs, then it ends
    gone.wait()
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        owners = {
            "live elsewhere": "otherhost/b00t/pid:[1]/123/456",
            "silent elsewhere": "otherhost/b00t/pid:[1]/124/457",
            "dead here": dead_here,
            "live here": driver_id(sleeper.pid),
            "no driver": None,
        }
        trials = {}
        for i, name in enumerate(owners):
            trials[name] = study.ask()
            storage.set_trial_param(trials[name]._trial_id, "x", float(i), x)  # its own params
        for name, trial in trials.items():
            if owners[name]:
                trial.set_user_attr(OWNER, owners[name])
                storage.record_heartbeat(trial._trial_id)
        time.sleep(2.2)  # past the grace period: then all but the silent one beat again
        for name in ("live elsewhere", "dead here", "live here"):
            storage.record_heartbeat(trials[name]._trial_id)
        numbers = recover_interrupted(study, me=driver_id())
        # a second recovery (another driver's) finds nothing more to do
        assert recover_interrupted(study, me="another/driver/1/1") == []
        sleeper.kill()
    assert numbers == sorted([trials["silent elsewhere"].number, trials["dead here"].number])
    frozen = {t.number: t for t in study.get_trials()}
    for name, trial in trials.items():
        state = frozen[trial.number].state
        if name in ("silent elsewhere", "dead here"):
            assert state == TrialState.FAIL and outcome_of(frozen[trial.number]) == "interrupted"
        else:
            assert state == TrialState.RUNNING, name
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.system_attrs["fixed_params"]["x"] for t in waiting) == sorted(
        frozen[trials[n].number].params["x"] for n in ("silent elsewhere", "dead here")
    )
    # once the live driver here ends, its trial is recovered too
    assert recover_interrupted(study, me=driver_id()) == [trials["live here"].number]


def server_storage(tmp_path, monkeypatch):
    """The storage a server database gets (`autotune.storage.connection`), heartbeats and all,
    on SQLite so it runs anywhere, with a grace period of one second."""
    from autotune.storage import connection

    monkeypatch.setattr(connection, "GRACE_S", 1)
    monkeypatch.setattr(connection, "HEARTBEAT_S", 1)
    storage = connection._server_storage(f"sqlite:///{tmp_path}/s.db")
    return storage, optuna.create_study(storage=storage, study_name="s")


def running_trial(study, owner, x=0.0):
    trial = study.ask()
    study._storage.set_trial_param(
        trial._trial_id, "x", x, optuna.distributions.FloatDistribution(0, 10)
    )
    trial.set_user_attr(OWNER, owner)
    study._storage.record_heartbeat(trial._trial_id)
    return trial


@pytest.mark.filterwarnings(
    "ignore::optuna.exceptions.ExperimentalWarning",
    "ignore:Heartbeat of storage is supposed to be used",
)
def test_a_driver_never_fails_its_own_trials_after_a_gap_in_its_heartbeats(tmp_path, monkeypatch):
    # fail_stale_trials excludes this driver: a database outage or a paused VM that stops its
    # heartbeats must not make a driver fail (and crash on) its own running trials
    storage, study = server_storage(tmp_path, monkeypatch)
    mine = running_trial(study, driver_id())
    time.sleep(2.2)  # this driver's beats stopped for longer than the grace period
    assert recover_interrupted(study, me=driver_id()) == []
    assert study.get_trials()[mine.number].state == TrialState.RUNNING
    assert not study.get_trials(states=(TrialState.WAITING,))


@pytest.mark.filterwarnings(
    "ignore::optuna.exceptions.ExperimentalWarning",
    "ignore:Heartbeat of storage is supposed to be used",
)
def test_a_driver_in_another_pid_namespace_of_this_host_is_judged_by_its_heartbeat(
    tmp_path, monkeypatch
):
    # alive() does not judge by hostname + this /proc alone: two drivers with one hostname in
    # different pid namespaces (containers) must not call each other dead; the heartbeat decides
    probe = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            "from autotune.storage.drivers import driver_id; print(driver_id())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode:
        pytest.skip(f"cannot start a process in a new pid namespace here: {probe.stderr[-300:]}")
    from autotune.storage.drivers import alive

    theirs = probe.stdout.strip()
    assert alive(theirs) is None  # this /proc cannot tell
    storage, study = server_storage(tmp_path, monkeypatch)
    trial = running_trial(study, theirs)
    assert recover_interrupted(study, me=driver_id()) == []  # its heartbeat is fresh
    assert study.get_trials()[trial.number].state == TrialState.RUNNING
    time.sleep(2.2)  # now it stopped beating: gone
    assert recover_interrupted(study, me=driver_id()) == [trial.number]


# test_search's one-device study: goodput only, six steps (two drivers' trials share 2 cores)
TINY_CPU = (
    ONE_DEVICE.replace("  n_trials: 2\n", "")
    .replace("objectives: [goodput, final_loss]", "objectives: [goodput]")
    .replace("steps: 8, measure_after: 2", "steps: 6, measure_after: 2")
)


@pytest.mark.slow
def test_two_real_drivers_on_cpu_share_a_study_and_run_the_confirm_phase_once(tmp_path, postgres):
    """Two real drivers (each with its embedded Ray, one-device MindSpore trials) on one study:
    N = 4 finished trials in total, asked by both, overlapping in time; the baseline once; the
    confirm phase (the best and the baseline once more) run by one driver only."""
    study, n = "cpu-two", 4
    results = drivers(
        tmp_path, TINY_CPU, postgres, study, n, ["--confirm", "1", "--confirm-runs", "1"]
    )
    for code, out in results:
        assert code == 0, out[-3000:]
    trials = check_study(postgres, study, n)
    searched = [
        t for t in trials if "confirm_of" not in t.user_attrs and "repeat_of" not in t.user_attrs
    ]
    assert len({t.user_attrs[OWNER] for t in searched}) == 2  # both drivers ran trials
    first_end = min(t.datetime_complete for t in searched)
    assert sum(t.datetime_start < first_end for t in searched) >= 2  # side by side
    # the best and the baseline (one trial when the baseline is the best), each re-run once,
    # all by one driver
    best = max((t for t in searched if t.values), key=lambda t: t.values[0])
    baseline = next(t for t in searched if t.user_attrs.get("baseline"))
    reruns = [t for t in trials if "confirm_of" in t.user_attrs]
    assert sorted(t.user_attrs["confirm_of"] for t in reruns) == sorted(
        {best.number, baseline.number}
    )
    assert len({t.user_attrs[OWNER] for t in reruns}) == 1
    left = [out for _, out in results if "the confirm phase is left to driver" in out]
    assert len(left) == 1, [out[-1500:] for _, out in results]
