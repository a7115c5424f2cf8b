"""The collective library's clock, ports and failures on Ascend (issue 44): HCCL's timeouts follow
the trial's, trials side by side on a node take their own HCCL and LCCL ports, and HCCL's "a peer
never answered" is the infrastructure's error, retried, not the candidate's."""

from pathlib import Path

from autotune.execution.classify import classify
from autotune.execution.mindformers_run import node_launch
from autotune.execution.nodes import free_port
from autotune.spec.backends import BACKENDS, reserved_ports
from autotune.train import CANDIDATE_STARTED

ASCEND = BACKENDS["ascend"]
CONFIG = {"backend": "ascend", "model": {}}
# CANN's words (its documentation: EI0006 "wait socket establish timeout", hccl_socket_manager;
# EI0002 "The wait execution of the Notify register times out"), in a worker's log after the
# candidate started, before the trial program's verdict
EI0006 = (
    "[ERROR] HCCL(3977573,python):2025-11-22-17:37:04.447.996 [hccl_socket_manager.cc:816] "
    "[3977663][Wait][LinkEstablish]wait socket establish timeout, role[0] rank[0] timeout[600 s]\n"
    "RuntimeError: Call HCCL API failed.\n"
    "EI0006: [PID: 3977573] 2025-11-22-17:37:04.448.990 Getting socket times out.\n"
    "autotune.train: RuntimeError: Call HCCL API failed.\n"
)
EI0002 = (
    "RuntimeError: Sync stream failed: Ascend_0\n"
    "EI0002: [PID: 1234] The wait execution of the Notify register times out. Reason: The Notify "
    "register has not received the Notify record from remote rank [3].\n"
    "autotune.train: RuntimeError: Sync stream failed: Ascend_0\n"
)


def _ports(env: dict) -> set[int]:
    base = int(env["HCCL_IF_BASE_PORT"])
    return {*range(base, base + 16), int(env["LCAL_COMM_ID"].rsplit(":", 1)[1])}


def test_two_trials_on_one_node_take_their_own_hccl_and_lccl_ports(monkeypatch, tmp_path):
    from autotune.execution.environment import environment

    monkeypatch.delenv("HCCL_IF_BASE_PORT", raising=False)
    monkeypatch.delenv("LCAL_COMM_ID", raising=False)
    first = environment({"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}, CONFIG, 4, 600)
    second = environment({"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, CONFIG, 4, 600)
    assert first["HCCL_IF_BASE_PORT"] == "60000"  # CANN's default for the first slot
    assert first["LCAL_COMM_ID"].startswith("127.0.0.1:")
    assert not _ports(first) & _ports(second)
    # ... each inside the ports autotune never hands to msrun (docs/cluster.md: reserve them)
    last_slot = environment({"ASCEND_RT_VISIBLE_DEVICES": "15"}, CONFIG, 1, 600)
    for env in (first, second, last_slot):
        assert all(any(a <= p <= b for a, b in reserved_ports()) for p in _ports(env))
    assert free_port() not in _ports(first)
    # a MindFormers trial's launch takes them too
    mf = {
        "run_mindformer": "/m/run_mindformer.py",
        "python": "/v/bin/python",
        "trial_yaml": "a: 1\n",
    }
    devices = {"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}
    _, env, _ = node_launch(mf, tmp_path, tmp_path, devices, 4, None, False, ASCEND, 600)
    assert env["HCCL_IF_BASE_PORT"] == second["HCCL_IF_BASE_PORT"]
    assert env["LCAL_COMM_ID"] == second["LCAL_COMM_ID"]


def test_hccls_timeouts_are_the_trials_own_and_the_users_are_kept(monkeypatch):
    from autotune.execution.environment import collective_environment, environment

    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    devices = {"ASCEND_RT_VISIBLE_DEVICES": "0"}
    long = environment(devices, CONFIG, 1, 3000)
    assert long["HCCL_CONNECT_TIMEOUT"] == "3000" and long["HCCL_EXEC_TIMEOUT"] == "3000"
    # never below the defaults (MindSpore's 600 s connect, CANN's 1836 s execution) ...
    short = environment(devices, CONFIG, 1, 120)
    assert short["HCCL_CONNECT_TIMEOUT"] == "600" and short["HCCL_EXEC_TIMEOUT"] == "1836"
    # ... nor above CANN's range (connect: 120-7200 s)
    assert environment(devices, CONFIG, 1, 10**5)["HCCL_CONNECT_TIMEOUT"] == "7200"
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "900")  # the user's own
    monkeypatch.setenv("HCCL_IF_BASE_PORT", "50000")
    kept = environment(devices, CONFIG, 1, 3000)
    assert kept["HCCL_CONNECT_TIMEOUT"] == "900" and kept["HCCL_IF_BASE_PORT"] == "50000"
    # the CPU's collectives are the host's: nothing of HCCL
    cpu = collective_environment(BACKENDS["cpu"], {"ASCEND_RT_VISIBLE_DEVICES": "1"}, 3000)
    assert cpu == {}


def _failed_trial(folder: Path, worker_log: str) -> Path:
    logs = folder / "logs"
    logs.mkdir(parents=True)
    (logs / "worker_0.log").write_text(f"{CANDIDATE_STARTED}\n{worker_log}")
    (logs / "worker_1.log").write_text(f"{CANDIDATE_STARTED}\n")
    return logs


def test_hccls_lost_peer_after_the_candidate_started_is_the_infrastructures(tmp_path):
    for name, lines in (("ei0006", EI0006), ("ei0002", EI0002)):
        logs = _failed_trial(tmp_path / name, lines)
        result = classify(1, tmp_path / name, logs, 700.0, ASCEND)
        assert result.outcome == "error" and result.infrastructure, (name, result)
        assert "the collectives lost a peer" in result.detail.splitlines()[0]
    # the candidate's own failure stays the candidate's
    own = _failed_trial(tmp_path / "own", "autotune.train: RuntimeError: For BatchMatMul, …\n")
    result = classify(1, tmp_path / "own", own, 70.0, ASCEND)
    assert result.outcome == "error" and not result.infrastructure
    # an out-of-memory line beside it is the candidate's oom (a peer waited for the dead rank)
    oom = _failed_trial(tmp_path / "oom", f"EL0004: Failed to allocate memory.\n{EI0002}")
    assert classify(1, tmp_path / "oom", oom, 70.0, ASCEND).outcome == "oom"
