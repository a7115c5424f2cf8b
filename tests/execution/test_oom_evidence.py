"""What makes a killed trial an ``oom``: a memory line in a log, the budget crossed, or the
kernel's OOM report for one of the trial's own processes — a bare SIGKILL is the
infrastructure's error, not the candidate's."""

import subprocess

from autotune.execution.classify import classify
from autotune.procfs import stat
from autotune.spec.backends import BACKENDS
from autotune.train import CANDIDATE_STARTED

CPU = BACKENDS["cpu"]


def killed_process() -> tuple[int, int, int]:
    """(returncode, pid, start ticks) of a real process ended by SIGKILL."""
    proc = subprocess.Popen(["sleep", "30"])
    start = stat(proc.pid).start
    proc.kill()
    return proc.wait(), proc.pid, start


def trial(tmp_path):
    """A trial folder whose worker got to run the candidate, then went silent."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text(f"{CANDIDATE_STARTED}\n" + '{"step": 1}\n')
    return tmp_path, logs


def test_a_sigkill_without_evidence_is_an_infrastructure_error(tmp_path):
    returncode, pid, start = killed_process()
    result = classify(returncode, *trial(tmp_path), 1.0, CPU)  # the kernel's own log, read
    assert result.outcome == "error" and result.infrastructure, result.outcome
    assert result.detail.startswith(
        "infrastructure: killed by SIGKILL (exit code -9) with no sign of running out of memory"
    )


def test_exit_137_without_evidence_is_not_oom_either(tmp_path):
    result = classify(137, *trial(tmp_path), 1.0, CPU)
    assert result.outcome == "error" and result.infrastructure


def test_the_kernels_report_for_the_trials_process_is_oom(tmp_path):
    from autotune.procfs import oom_kills

    returncode, pid, start = killed_process()
    after = int((start / 100 + 0.5) * 1e6)  # USER_HZ is 100 on Linux
    kills = oom_kills(
        [
            f"3,9001,{after},-;Out of memory: Killed process {pid} (sleep) "
            "total-vm:1000kB, anon-rss:900kB"
        ]
    )
    result = classify(returncode, *trial(tmp_path), 1.0, CPU, {pid: start}, kernel_kills=kills)
    assert result.outcome == "oom"
    assert result.detail.startswith(f"[kernel] Out of memory: Killed process {pid}")


def test_a_kill_of_the_same_pid_before_the_process_started_is_not_its_oom(tmp_path):
    from autotune.procfs import oom_kills

    returncode, pid, start = killed_process()
    before = int((start / 100 - 5) * 1e6)
    kills = oom_kills([f"3,9001,{before},-;Out of memory: Killed process {pid} (old)"])
    result = classify(returncode, *trial(tmp_path), 1.0, CPU, {pid: start}, kernel_kills=kills)
    assert result.outcome == "error" and result.infrastructure


def test_a_memory_line_in_a_log_is_oom_whatever_the_exit(tmp_path):
    folder, logs = trial(tmp_path)
    (logs / "worker_1.log").write_text("MemoryError: Unable to allocate 4.00 GiB\n")
    assert classify(-9, folder, logs, 1.0, CPU).outcome == "oom"


def test_the_kernels_three_ways_of_saying_it():
    from autotune.procfs import oom_kills

    kills = oom_kills(
        [
            "3,1,5000000,-;Out of memory: Killed process 11 (python) total-vm:1kB",
            "3,2,6000000,-;Memory cgroup out of memory: Killed process 12 (python)",
            "6,3,7000000,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python,pid=13,uid=0",
            "6,4,8000000,-;python invoked oom-killer: gfp_mask=0x140cca",
        ]
    )
    assert {pid: when for pid, (when, _) in kills.items()} == {11: 5.0, 12: 6.0, 13: 7.0}
