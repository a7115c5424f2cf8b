"""autotune.train.msrun: the options trials and launch.sh pass to msrun, read back by msrun's own parser."""

import pytest

from autotune.train.msrun import msrun_args, node_count

run = pytest.importorskip("mindspore.parallel.cluster.run")


def parsed(monkeypatch, args):
    """msrun's own argument parser (mindspore/parallel/cluster/run.py) on ``args``."""
    monkeypatch.setattr("sys.argv", ["msrun", *args, "train.py", "config.json"])
    return run.get_args()


def test_trial_options_as_msrun_reads_them(monkeypatch):
    args = msrun_args(2, 2, master_port=9001, log_dir="/t/logs", bind_core=True)
    # the trial runner's flags, in its order
    assert args == [
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        "--master_port=9001",
        "--log_dir=/t/logs",
        "--join=True",
        "--cluster_time_out=120",
        "--tail_worker_log=2",
        "--bind_core=True",
    ]
    got = parsed(monkeypatch, args)
    assert (got.worker_num, got.local_worker_num, got.master_addr, got.master_port) == (
        2,
        2,
        "127.0.0.1",
        9001,
    )
    assert (got.node_rank, got.log_dir, got.join, got.cluster_time_out) == (
        -1,
        "/t/logs",
        True,
        120,
    )
    assert (
        got.bind_core is True
        and got.task_script == "train.py"
        and got.task_script_args == ["config.json"]
    )
    # msrun tails the listed ranks: 2 is none of ranks 0 and 1
    assert got.tail_worker_log == "2"


def test_multi_node_options(monkeypatch):
    args = msrun_args(
        8,
        4,
        master_addr="10.0.0.1",
        master_port=8118,
        node_rank=1,
        log_dir="logs",
        tail_worker=0,
        cluster_time_out=300,
    )
    got = parsed(monkeypatch, args)
    assert (got.worker_num, got.local_worker_num, got.node_rank, got.master_addr) == (
        8,
        4,
        1,
        "10.0.0.1",
    )
    assert got.tail_worker_log == "0" and got.cluster_time_out == 300 and got.bind_core is False
    assert node_count(8, 4) == 2 and node_count(2, 2) == 1


@pytest.mark.parametrize(
    "workers, local, extra",
    [
        (0, 1, {}),
        (4, 8, {}),
        (6, 4, {}),
        (2, 2, {"cluster_time_out": 0}),
        (2, 2, {"tail_worker": 2}),
    ],
)
def test_bad_counts_are_a_callers_bug(workers, local, extra):
    with pytest.raises(ValueError, match="msrun"):
        msrun_args(workers, local, master_port=1, log_dir="x", **extra)
