"""Backends and placement: what each backend says about itself, out-of-memory lines as MindSpore
prints them, and how a trial's ranks are split over nodes."""

from pathlib import Path

import pytest

from autotune.spec.backends import BACKENDS
from autotune.execution.nodes import node_plan, unplaceable
from autotune.execution.classify import oom_evidence

FIXTURES = Path(__file__).parent / "fixtures"
# Lines a healthy or otherwise failing trial prints (worker logs of this project's trials).
NOT_OOM = [
    "autotune.train: ConfigError: knobs.tp: 3 does not divide num_heads 4",
    "[WARNING] DISTRIBUTED(1234,7f00,python):2026-11-29-10:00:00.000.000 [mindspore/ccsrc/"
    "distributed/cluster/cluster_context.cc:100] Initialize] The scheduler is not ready yet.",
    "RuntimeError: The pointer[cnode] is null.",
    '{"step": 3, "loss": 6.93, "step_time_ms": 45.1, "peak_memory_mb": 410.2}',
]


def recorded_oom_lines() -> list[tuple[str, str]]:
    """(backend, line) for each recorded line of tests/fixtures/oom_lines.txt."""
    lines, backend = [], None
    for line in (FIXTURES / "oom_lines.txt").read_text().splitlines():
        if line.startswith("## "):
            backend = line.split()[1]
        elif line and not line.startswith("# "):
            lines.append((backend, line))
    return lines


@pytest.mark.parametrize("backend,line", recorded_oom_lines())
def test_recorded_out_of_memory_lines_are_oom_on_their_backend(backend, line):
    assert BACKENDS[backend].oom_in(line)
    assert BACKENDS[backend].oom_in(line.upper())  # case does not matter


@pytest.mark.parametrize("name", ["cpu", "gpu", "ascend"])
def test_other_failures_are_not_out_of_memory(name):
    assert not any(BACKENDS[name].oom_in(line) for line in NOT_OOM)


def test_an_oom_line_in_any_workers_log_is_found(tmp_path):
    """Not only worker 0's log and not only its tail: rank 3's, under a traceback."""
    (tmp_path / "worker_0.log").write_text("\n".join(NOT_OOM) + "\n")
    oom = dict(recorded_oom_lines())["ascend"]
    (tmp_path / "worker_3.log").write_text(oom + "\nTraceback (most recent call last):\n"
                                           + "  File x\n" * 50)
    evidence = oom_evidence(tmp_path, BACKENDS["ascend"])
    assert evidence == f"[worker_3.log] {oom}"
    (tmp_path / "worker_3.log").write_text("RuntimeError: The pointer[cnode] is null.\n")
    assert oom_evidence(tmp_path, BACKENDS["ascend"]) is None


def test_each_backend_asks_ray_for_its_own_devices():
    assert BACKENDS["cpu"].task_options(4) == {"num_cpus": 4}
    assert BACKENDS["gpu"].task_options(4) == {"num_cpus": 1, "num_gpus": 4}
    assert BACKENDS["ascend"].task_options(4) == {"num_cpus": 1, "resources": {"NPU": 4}}
    assert BACKENDS["gpu"].visible_devices == "CUDA_VISIBLE_DEVICES"
    assert BACKENDS["ascend"].visible_devices == "ASCEND_RT_VISIBLE_DEVICES"
    # a device's memory is MindSpore's pool statistic there, a worker's RSS on CPU
    assert BACKENDS["gpu"].device_memory and not BACKENDS["cpu"].device_memory


def test_no_real_backend_executes_the_deprecated_o2():
    assert not BACKENDS["ascend"].executes("jit_level", "O2")
    assert not BACKENDS["gpu"].executes("jit_level", "O2")
    assert not BACKENDS["cpu"].executes("jit_level", "O2")
    assert "deprecated since MindSpore 2.9" in BACKENDS["cpu"].why_not("jit_level")
    assert BACKENDS["cpu"].executes("dp", 8) and BACKENDS["cpu"].why_not("dp") == ""


def test_ranks_fill_nodes_in_the_exports_order():
    """Node i holds ranks i·per_node …: tp's adjacent ranks share a node when tp divides it."""
    plan = node_plan(16, 8)
    assert [(n.index, n.local_workers, n.first_rank, n.msrun_node_rank) for n in plan] == \
        [(0, 8, 0, 0), (1, 8, 8, 1)]
    assert [n.first_rank for n in node_plan(6, 4)] == [0, 4]
    # msrun numbers ranks node_rank·local + i: the smaller last node gets node rank 2 (2·2 = 4)
    assert node_plan(6, 4)[1].msrun_node_rank == 2
    assert len(node_plan(4, 8)) == 1
    with pytest.raises(ValueError, match="msrun cannot number"):
        node_plan(7, 4)


def test_a_cluster_too_small_for_the_bundles_is_unplaceable():
    two = [{"CPU": 1}, {"CPU": 1}]
    assert unplaceable(two, [{"CPU": 1.0}, {"CPU": 1.0}]) is None
    assert "2 node(s) each holding 1 CPU" in unplaceable(two, [{"CPU": 1.0}])
    assert unplaceable(two, [{"CPU": 2.0}]) is not None  # STRICT_SPREAD: distinct nodes
    assert unplaceable([{"GPU": 8, "CPU": 1}], [{"CPU": 16.0}, {"CPU": 16.0}]) is not None
    assert unplaceable([{"NPU": 8, "CPU": 1}], [{"CPU": 4.0, "NPU": 8.0}]) is None
