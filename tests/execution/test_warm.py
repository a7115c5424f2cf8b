"""Trials in workers that stay up (autotune.execution.warm) against trials in processes of their
own: the same losses, the peak memory within noise, each trial's folder and logs its own; a
failed, timed-out, over-budget or cancelled trial retires the workers and the next one starts
fresh ones; and graphs compiled once are loaded by a later trial of the same graph, never by
another graph (autotune.train.runtime.compile_cache). Real two-worker msrun trials on CPU."""

import _thread
import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from autotune import procfs
from autotune.execution.runner import run_trial
from autotune.execution.warm import WarmPool
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import load_spec
from autotune.train.config import trial_config
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

DP2 = Candidate(2, 1, 1, 1, 64, 1, 1024, 0, "O1", "none")
TP2 = DP2.replace(dp=1, tp=2)
PEAK_NOISE = 0.08  # warm against fresh; docs/mindspore-cpu.md ("Warm workers") has the figures


def _spec():
    return load_spec(
        ROOT / "examples" / "tiny_gpt.yaml", {"trial.steps": 8, "trial.measure_after": 2}
    )


def _config(
    folder: Path, candidate: Candidate, cache: Path | None = None, steps: int = 8, **trial
) -> dict:
    """The trial's config; ``trial``: further keys of its ``trial`` section."""
    spec = _spec()
    config = trial_config(
        spec,
        candidate,
        study="warm",
        number=0,
        out_dir=folder.resolve(),
        steps=steps,
        measure_after=2,
        compile_cache=cache,
    )
    config["trial"].update(trial)
    return config


def _mb(candidate: Candidate) -> float:
    """The cost model's estimate of ``candidate``'s memory per device, as the driver gives a pool
    (the tiny GPT's candidates are all within `autotune.execution.warm.SAME_SIZE`)."""
    from autotune import costmodel

    return costmodel.estimate(_spec(), candidate).memory_gb_per_device * 1024


def _alive(pids) -> list[int]:
    return [pid for pid in pids if procfs.stat(pid) is not None and not procfs.stat(pid).zombie]


def test_warm_trials_train_as_fresh_ones_and_keep_their_own_folders(tmp_path):
    pool = WarmPool(tmp_path / "pool", 2)
    try:
        warm = {}
        for name, candidate in (("dp2", DP2), ("tp2", TP2), ("dp2-again", DP2)):
            folder = tmp_path / name
            warm[name] = pool.run(_config(folder, candidate), folder, 300, None, _mb(candidate))
            assert warm[name].outcome == "ok", warm[name].detail
            logs = folder / "logs"
            assert sorted(p.name for p in logs.iterdir()) == [
                "msrun.log",
                "worker_0.log",
                "worker_1.log",
            ]
            log = (logs / "worker_0.log").read_text()
            assert log.count("autotune.train running the candidate") == 1  # this trial only
            assert (logs / "msrun.log").read_text().startswith("launched: ")
        first_pid = pool.proc.pid
    finally:
        pool.close()
    assert not _alive([first_pid])
    for name, candidate in (("dp2", DP2), ("tp2", TP2)):
        folder = tmp_path / f"fresh-{name}"
        fresh = run_trial(_config(folder, candidate), folder, 300, None, 2)
        assert fresh.outcome == "ok", fresh.detail
        for again in [name] + (["dp2-again"] if name == "dp2" else []):
            assert warm[again].metrics["loss_last"] == pytest.approx(
                fresh.metrics["loss_last"], rel=1e-6
            )
            assert warm[again].metrics["peak_memory_mb"] == pytest.approx(
                fresh.metrics["peak_memory_mb"], rel=PEAK_NOISE
            )
    # the pool's first trial paid the launch; the others found it up
    assert warm["tp2"].metrics["init_s"] < warm["dp2"].metrics["init_s"] / 5


def test_a_failed_trial_retires_the_workers_and_the_next_starts_fresh(tmp_path):
    pool = WarmPool(tmp_path / "pool", 2)
    try:
        bad = _config(tmp_path / "bad", DP2)
        bad["knobs"]["recompute"] = "sometimes"  # the program refuses it: the candidate's error
        first = pool.run(_config(tmp_path / "a", DP2), tmp_path / "a", 300, None, _mb(DP2))
        pid = pool.proc.pid
        failed = pool.run(bad, tmp_path / "bad", 300, None, _mb(DP2))
        assert failed.outcome == "error" and not failed.infrastructure, failed.detail
        assert "knobs.recompute" in failed.detail
        assert not pool.up and not _alive([pid])
        after = pool.run(_config(tmp_path / "b", DP2), tmp_path / "b", 300, None, _mb(DP2))
        assert after.outcome == "ok", after.detail
        assert pool.proc.pid != pid  # fresh workers
        assert after.metrics["loss_last"] == pytest.approx(first.metrics["loss_last"], rel=1e-6)
    finally:
        pool.close()


def test_a_trial_past_its_time_is_stopped_with_its_workers(tmp_path):
    pool = WarmPool(tmp_path / "pool", 2)
    try:
        pool.run(_config(tmp_path / "a", DP2), tmp_path / "a", 300, None, _mb(DP2))
        known = dict(pool.tree.known)
        started = time.monotonic()
        result = pool.run(
            _config(tmp_path / "b", DP2, steps=100000), tmp_path / "b", 8, None, _mb(DP2)
        )
        assert result.outcome == "timeout"
        assert time.monotonic() - started < 8 + 10
        assert not _alive(known)
    finally:
        pool.close()


def test_a_cancelled_trial_leaves_no_process(tmp_path):
    # Ctrl-C as the CLI's process gets it, whatever SIGINT handler an earlier test's library
    # left in this process (in the whole slow tier the interrupt once raised nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        pool = WarmPool(tmp_path / "pool", 2)
        pool.run(_config(tmp_path / "a", DP2), tmp_path / "a", 300, None, _mb(DP2))
        known = dict(pool.tree.known)
        timer = threading.Timer(3.0, _thread.interrupt_main)  # what Ctrl-C does
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pool.run(
                _config(tmp_path / "b", DP2, steps=100000), tmp_path / "b", 300, None, _mb(DP2)
            )
        assert not _alive(known)
    finally:
        signal.signal(signal.SIGINT, previous)


def _hits(folder: Path) -> list[str]:
    return re.findall(
        r"compile cache: graph \w+: (\d+) of (\d+) graphs loaded",
        (folder / "logs" / "worker_0.log").read_text(),
    )


def test_a_graph_compiled_once_loads_in_a_later_trial_and_never_in_another_graph(
    tmp_path, monkeypatch
):
    """Confirm-phase shape: the same candidate again, in warm workers and in a fresh process;
    recompute none and full are two graphs, warmups A and B one (the schedule's numbers are
    Parameters); a trial that probes compiles the probe's two graphs after the step's, and
    loads all three, in order, when it runs again; an accumulating trial of another fusion and
    the parallel optimizer loads the accumulate graph (no part of the update) and compiles its
    update; MindSpore's own line says it loaded."""
    monkeypatch.setenv("GLOG_v", "2")  # MindSpore's WARNING line for a cache load
    cache = tmp_path / "cache"
    full = DP2.replace(recompute="full")
    warmup = DP2.replace(warmup_steps=1000)  # 4 of the trial's 8 steps
    accum = DP2.replace(grad_accum=2)
    accum_other = accum.replace(fusion_mb=1, parallel_optimizer=True)
    uncached = {}  # runs without the cache, for the graphs the pool only loads
    for name, candidate in (("warmup", warmup), ("accum-other", accum_other)):
        folder = tmp_path / f"uncached-{name}"
        result = run_trial(_config(folder, candidate), folder, 300, None, 2)
        uncached[name] = result.metrics["loss_last"]
    pool = WarmPool(tmp_path / "pool", 2)
    try:
        runs = {}
        for name, candidate in (
            ("none", DP2),
            ("full", full),
            ("none-again", DP2),
            ("full-again", full),
            ("warmup", warmup),
            ("probed", DP2),
            ("probed-again", DP2),
            ("accum", accum),
            ("accum-other", accum_other),
        ):
            folder = tmp_path / name
            probe = {"underflow_probe": "always"} if name.startswith("probed") else {}
            runs[name] = pool.run(
                _config(folder, candidate, cache, **probe), folder, 300, None, _mb(candidate)
            )
            assert runs[name].outcome == "ok", runs[name].detail
    finally:
        pool.close()
    assert _hits(tmp_path / "none") == [("0", "1")] and _hits(tmp_path / "full") == [("0", "1")]
    assert _hits(tmp_path / "none-again") == [("1", "1")]
    assert _hits(tmp_path / "full-again") == [("1", "1")]
    assert _hits(tmp_path / "warmup") == [("1", "1")]  # the graph of "none"
    assert _hits(tmp_path / "probed") == [("0", "3")]  # underflow_probe is part of the key
    assert _hits(tmp_path / "probed-again") == [("3", "3")]
    assert [runs[n].metrics["underflow_probed"] for n in ("none", "probed", "probed-again")] == [
        False,
        True,
        True,
    ]
    assert (
        runs["probed-again"].metrics["underflow_share"] == runs["probed"].metrics["underflow_share"]
    )
    assert _hits(tmp_path / "accum") == [("0", "2")]
    assert _hits(tmp_path / "accum-other") == [("1", "2")]  # the accumulate graph, not the update
    assert runs["accum-other"].metrics["loss_last"] == pytest.approx(
        uncached["accum-other"], rel=1e-6
    )
    assert runs["warmup"].metrics["loss_last"] == pytest.approx(uncached["warmup"], rel=1e-6)
    compiled = runs["none"].metrics["loss_last"]  # the pool's first run compiled its graph
    assert uncached["warmup"] != pytest.approx(compiled, rel=1e-5)  # B is not A
    log = (tmp_path / "none-again" / "logs" / "worker_0.log").read_text()
    assert "Use the compilation cache and execute the backend actions only" in log
    # a loaded graph trains as the run that compiled it ("none" and "full" compiled theirs, as
    # a run without the cache does: warmup and accum-other load graphs, and equal theirs)
    for name in ("none", "full"):
        assert runs[f"{name}-again"].metrics["loss_last"] == pytest.approx(
            runs[name].metrics["loss_last"], rel=1e-6
        )
    for run in ("probed", "probed-again"):
        assert runs[run].metrics["loss_last"] == pytest.approx(compiled, rel=1e-6)
    # a fresh process of the same graph loads it too
    folder = tmp_path / "fresh"
    fresh = run_trial(_config(folder, DP2, cache), folder, 300, None, 2)
    assert _hits(folder) == [("1", "1")]
    assert fresh.metrics["loss_last"] == pytest.approx(compiled, rel=1e-6)
    assert runs["none-again"].metrics["first_step_s"] < runs["none"].metrics["first_step_s"]
    stored = json.dumps(
        sorted(str(p.relative_to(cache)) for p in (cache / "graphs").rglob("*.mindir"))
    )
    # per rank: one compile for each of two graphs, three for the probed, two for the accumulating
    # one and one (its update) for the other accumulating one
    assert stored.count("rank_0") == 8


def _allreduces(ir_dir: Path) -> int:
    """AllReduce nodes of rank 0's step graph as MindSpore's backend built it (graph_build IR)."""
    (step_graph, *_) = sorted((ir_dir / "rank_0").glob("graph_build_0_*.ir"))
    return len(re.findall(r"AllReduce\(", step_graph.read_text()))


def test_a_graph_loaded_under_another_fusion_threshold_buckets_by_its_own(tmp_path, monkeypatch):
    """The fusion threshold is no part of a cached graph (Knob.graphs "none"): MindSpore's
    backend buckets the all-reduces after a load, so a fusion-1 trial loading the graph a
    fusion-64 trial stored runs fusion 1's buckets, and its losses."""
    monkeypatch.setenv("MS_DEV_SAVE_GRAPHS", "1")
    monkeypatch.setenv("MS_DEV_DUMP_IR_PASSES", "graph_build")
    cache, fusion_1 = tmp_path / "cache", DP2.replace(fusion_mb=1)
    runs, buckets = {}, {}
    for name, candidate, cached in (
        ("uncached-1", fusion_1, None),
        ("store-64", DP2, cache),
        ("load-as-1", fusion_1, cache),
    ):
        folder = tmp_path / name
        monkeypatch.setenv("MS_DEV_SAVE_GRAPHS_PATH", str(tmp_path / f"ir-{name}"))
        runs[name] = run_trial(_config(folder, candidate, cached), folder, 300, None, 2)
        assert runs[name].outcome == "ok", runs[name].detail
        buckets[name] = _allreduces(tmp_path / f"ir-{name}")
    assert _hits(tmp_path / "store-64") == [("0", "1")] and _hits(tmp_path / "load-as-1") == [
        ("1", "1")
    ]
    assert buckets["load-as-1"] == buckets["uncached-1"] > buckets["store-64"]
    assert runs["load-as-1"].metrics["loss_last"] == pytest.approx(
        runs["uncached-1"].metrics["loss_last"], rel=1e-6
    )


def test_a_trials_peak_is_its_own_whatever_ran_before_it_in_the_pool(tmp_path):
    """A larger trial leaves MindSpore's CPU memory pool holding its activations (~0.5 GB here,
    after every release), which a smaller trial after it reuses unseen: its peak read +29 %
    (+52 % at global batch 512), and a budget between the two made it ``oom`` for its place. A
    pool runs trials of one size — the cost model's estimate within `SAME_SIZE` — and starts
    fresh workers for another: one process, dp1, float32, accumulation 1 (large) and 8 (small)
    at global batch 256, large → small → large, each peak against the same candidate's in a
    process of its own within 5 %, the small one under a budget 15 % above its own fresh
    peak."""
    from autotune import costmodel

    spec = load_spec(
        ROOT / "examples" / "tiny_gpt.yaml",
        {
            "train.global_batch_size": 256,
            "model.dtype": "float32",
            "cluster.devices": 1,
            "cluster.devices_per_node": 1,
        },
    )
    large = DP2.replace(dp=1, grad_accum=1)
    small = large.replace(grad_accum=8)

    def config(name, candidate):
        return trial_config(
            spec,
            candidate,
            study="warm",
            number=0,
            out_dir=(tmp_path / name).resolve(),
            steps=3,
            measure_after=1,
        )

    def size_mb(candidate):
        return costmodel.estimate(spec, candidate).memory_gb_per_device * 1024

    fresh = {}
    for name, candidate in (("large", large), ("small", small)):
        result = run_trial(
            config(f"fresh-{name}", candidate), tmp_path / f"fresh-{name}", 300, None, 1
        )
        assert result.outcome == "ok", result.detail
        fresh[name] = result.metrics["peak_memory_mb"]
    assert fresh["large"] > 1.5 * fresh["small"]
    pool = WarmPool(tmp_path / "pool", 1)
    try:
        pids = []
        for k, (name, candidate) in enumerate(
            (("large", large), ("small", small), ("large", large))
        ):
            budget = 1.15 * fresh["small"] if name == "small" else None
            folder = tmp_path / f"warm-{k}-{name}"
            result = pool.run(
                config(folder.name, candidate), folder, 300, budget, size_mb(candidate)
            )
            assert result.outcome == "ok", result.detail
            assert result.metrics["peak_memory_mb"] == pytest.approx(fresh[name], rel=0.05), name
            pids.append(pool.proc.pid)
            log = (folder / "logs" / "worker_0.log").read_text()
            assert ("fresh workers: the pool's processes ran trials of" in log) == (k > 0)
    finally:
        pool.close()
    assert len(set(pids)) == 3  # another size: other workers, each time
