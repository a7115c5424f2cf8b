"""The accelerator path (issue 18, items 15–23): what cannot run on this CPU is checked as the
calls the trial program makes and the values it passes; what can (the CPU launch order, the
refusals, the exports) is checked for real. docs/accelerators.md says which is which."""

from pathlib import Path

import pytest

from autotune.execution.classify import classify
from autotune.spec.backends import BACKENDS
from autotune.train import CANDIDATE_STARTED, LAUNCH_FAILED

# item 22: device out-of-memory lines of MindSpore 2.10 (docs/accelerators.md names where each
# string is printed)
DEVICE_OOM_LINES = [
    ("ascend", "#umsg#Framework Error Message:#umsg#Malloc device memory failed, size[4294967296]"),
    ("ascend", "[EXCEPTION] DEVICE(1,ff,python) MallocAlign32 device memory failed, size[2147483648]"),
    ("ascend", "[EXCEPTION] PRE_ACT(1,ff,python) Somas allocate failed for graph 3"),
    ("gpu", "[EXCEPTION] PRE_ACT(1,7f,python) Somas allocate failed for graph 3"),
    ("gpu", "CUBLAS_STATUS_ALLOC_FAILED: Resource allocation failed inside the cuBLAS library. "
            "This is usually caused by a cudaMalloc() failure."),
]


@pytest.mark.parametrize("backend,line", DEVICE_OOM_LINES)
def test_device_oom_lines_are_oom(backend, line):
    assert BACKENDS[backend].oom_in(line), line


def _logs(tmp_path: Path, worker0: str) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text(worker0)
    (logs / "scheduler.log").write_text("scheduler\n")
    return logs


def test_an_oom_before_the_candidate_ran_is_the_launchs(tmp_path):
    """Out of device memory while joining the cluster (another process holds the device): the
    candidate never ran, so the failure is not remembered against it."""
    line = "Malloc device memory failed, size[1073741824]"
    logs = _logs(tmp_path, f"{line}\n{LAUNCH_FAILED} communication init failed: RuntimeError: x\n")
    result = classify(3, tmp_path, logs, 1.0, BACKENDS["ascend"])
    assert result.outcome == "error" and result.infrastructure, result
    assert line in result.detail


def test_an_oom_after_the_candidate_started_is_the_candidates(tmp_path):
    logs = _logs(tmp_path, f"{CANDIDATE_STARTED}: rank 0 of 2\nSomas allocate failed for graph 1\n"
                           "autotune.train: RuntimeError: Somas allocate failed for graph 1\n")
    result = classify(1, tmp_path, logs, 1.0, BACKENDS["ascend"])
    assert result.outcome == "oom", result


# item 23: threads of accelerator workers, msrun's cluster timeout in exports

def test_accelerator_workers_get_their_share_of_host_threads_not_rays_one(monkeypatch):
    from autotune.execution import runner

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in a num_cpus=1 task
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(16)))
    config = {"backend": "gpu", "model": {}}
    assert runner._environment({}, config, local_workers=4)["OMP_NUM_THREADS"] == "4"
    assert runner._environment({}, {**config, "backend": "ascend"}, 8)["OMP_NUM_THREADS"] == "2"
    assert runner._environment({}, {**config, "backend": "ascend"}, 32)["OMP_NUM_THREADS"] == "1"
    # CPU trials keep what they had (their workers are pinned to cores by msrun)
    assert runner._environment({}, {**config, "backend": "cpu"}, 2)["OMP_NUM_THREADS"] == "1"


def test_exported_launch_uses_msruns_default_cluster_timeout_trials_a_shorter_one():
    from autotune.train.msrun import CLUSTER_TIME_OUT_S, MSRUN_DEFAULT_CLUSTER_TIME_OUT_S, msrun_args

    assert MSRUN_DEFAULT_CLUSTER_TIME_OUT_S == 600 and CLUSTER_TIME_OUT_S == 120
    assert "--cluster_time_out=120" in msrun_args(2, 2, master_port=1, log_dir="d")
