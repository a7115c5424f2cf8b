"""A trial under msrun ends when its workers have, not when msrun's scheduler next looks.

MindSpore's scheduler checks every 5 s whether its workers have exited, and msrun waits for it;
the runner stops msrun and the scheduler once every rank wrote its last outputs and no worker is
left. Shown on a real process tree shaped as msrun's — a launcher waiting for a scheduler that
sleeps, and a worker that writes the outputs and exits — and on one whose worker exits without
them, which the runner leaves to the launcher."""

import json
import subprocess
import sys
import textwrap
import time

from autotune import procfs
from autotune.execution.classify import outputs_complete
from autotune.execution.processes import ProcessTree
from autotune.execution.runner import _supervise
from autotune.train.metrics import PROBE_UNFINISHED

LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    folder, write, wait_s = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
    worker = (
        "import json, os, sys\\n"
        "f = sys.argv[1]\\n"
        "json.dump({'rank': 0}, open(os.path.join(f, 'metrics.rank0.json'), 'w'))\\n"
        "json.dump({'underflow_note': None}, open(os.path.join(f, 'metrics.json'), 'w'))\\n"
    )
    sched = subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({wait_s})"],
        env={**os.environ, "MS_ROLE": "MS_SCHED"},
    )
    if write:
        subprocess.run([sys.executable, "-c", worker, folder], env={**os.environ, "MS_ROLE": "MS_WORKER"})
    else:
        subprocess.run([sys.executable, "-c", "pass"], env={**os.environ, "MS_ROLE": "MS_WORKER"})
    sched.wait()
    """
)


def _launch(tmp_path, write: bool, wait_s: float):
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), str(int(write)), str(wait_s)]
    )
    return proc, ProcessTree(proc.pid)


def _never(_now):
    return "", ""


def test_msrun_is_stopped_once_its_workers_exited_after_their_last_outputs(tmp_path):
    proc, tree = _launch(tmp_path, write=True, wait_s=60)
    started = time.monotonic()
    outcome, _, _, finished = _supervise(
        proc,
        tree,
        started,
        _never,
        None,
        launcher=proc.pid,
        done=lambda: outputs_complete(tmp_path, 1),
    )
    assert (outcome, finished) == ("", True)
    assert time.monotonic() - started < 20  # not the scheduler's 60 s
    assert not [pid for pid in tree.known if procfs.stat(pid) and not procfs.stat(pid).zombie]


def test_a_worker_gone_without_its_outputs_is_left_to_the_launcher(tmp_path):
    proc, tree = _launch(tmp_path, write=False, wait_s=2)
    outcome, _, _, finished = _supervise(
        proc,
        tree,
        time.monotonic(),
        _never,
        None,
        launcher=proc.pid,
        done=lambda: outputs_complete(tmp_path, 1),
    )
    assert (outcome, finished, proc.returncode) == ("", False, 0)


def test_outputs_are_complete_only_with_every_rank_and_the_final_metrics(tmp_path):
    (tmp_path / "metrics.rank0.json").write_text("{}")
    (tmp_path / "metrics.json").write_text(json.dumps({"underflow_note": PROBE_UNFINISHED}))
    assert not outputs_complete(tmp_path, 1)  # written before the probe: not the last
    (tmp_path / "metrics.json").write_text(json.dumps({"underflow_note": None}))
    assert outputs_complete(tmp_path, 1) and not outputs_complete(tmp_path, 2)
