"""Backends and placement: what each backend says about itself, out-of-memory lines as MindSpore
prints them, and how a trial's ranks are split over nodes."""

from pathlib import Path

import pytest

from autotune.execution.classify import oom_evidence
from autotune.execution.nodes import node_plan, unplaceable
from autotune.spec.backends import BACKENDS

FIXTURES = Path(__file__).parents[1] / "fixtures"
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
    (tmp_path / "worker_3.log").write_text(
        oom + "\nTraceback (most recent call last):\n" + "  File x\n" * 50
    )
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
    assert [(n.index, n.local_workers, n.first_rank, n.msrun_node_rank) for n in plan] == [
        (0, 8, 0, 0),
        (1, 8, 8, 1),
    ]
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


# --- the registry is the one place that names a backend ------------------------------------

import ast  # noqa: E402
import textwrap  # noqa: E402
from dataclasses import replace  # noqa: E402

from autotune.spec import backends  # noqa: E402
from autotune.spec.knobs import DTYPES, KNOBS  # noqa: E402
from tests.conftest import naming  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"
REGISTRY = PACKAGE / "spec" / "backends.py"


def backend_words() -> set[str]:
    """What names a backend in code: its name, MindSpore's device target, its Ray resource."""
    words = set()
    for backend in BACKENDS.values():
        said = (backend.name, backend.device_target, backend.ray_resource)
        words |= {word.lower() for word in said if word}
    return words


def test_no_module_outside_the_registry_names_a_backend():
    """A grep for `"GPU", "Ascend"` or `backend ==` anywhere in autotune/, and its AST
    form: no comparison with, dict keyed by or tuple of backend names outside
    autotune/spec/backends.py — each such rule is a field of the Backend entry instead."""
    words, found = backend_words(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY:
            continue
        text, where = path.read_text(), path.relative_to(PACKAGE.parent)
        for number, line in enumerate(text.splitlines(), 1):
            if '"GPU", "Ascend"' in line or "backend ==" in line:
                found.append(f"{where}:{number}: {line.strip()}")
        found += [f"{where}:{number}: {why}" for number, why in naming(ast.parse(text), words)]
    assert not found, "\n".join(found)


def test_the_check_sees_each_way_of_naming():
    """The check above can fail: each form it looks for, planted."""
    words = backend_words()
    planted = {
        'if backend.name == "cpu": pass': True,
        'ok = kind in ("gpu", "ascend")': True,
        'PROFILE = {"ascend": "ascend-910b"}': True,
        'pool = {} if resource != "CPU" else {"num_cpus": 2}': True,
        'choices = ("ascend", "gpu", "cpu", "simulate")': True,
        'profile = load("cpu"); flag = name == "mindspore"': False,
    }
    for source, named in planted.items():
        assert bool(naming(ast.parse(source), words)) == named, source


# --- every backend has every fact its kind needs (contract, parametrized over BACKENDS) -----


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_states_the_facts_its_kind_needs(name):
    from autotune.costmodel.profiles import CPU_BASE, PROFILES
    from autotune.train.runtime.device_smi import PARSERS

    backend = BACKENDS[name]
    assert backend.name == name and backend.kind in backends.KINDS
    assert set(backend.compute_dtypes) <= set(DTYPES)
    for knob, (values, reason) in backend.limits.items():
        assert knob in KNOBS and values and reason
    # its default device profile exists and is a device backend's (a simulated study's export
    # runs there: `autotune.export.configs.run_backend`); a device backend's is its own kind
    profiles = {**PROFILES, CPU_BASE.name: CPU_BASE}
    profile = profiles[backend.default_profile]
    assert profile.kind in [b.name for b in backends.device_backends()]
    assert backend.oom_in("MemoryError")
    if backend.runs_program:
        assert profile.kind == name
        assert backend.device_target and backend.ray_resource and backend.ray_start_flag
        assert backends.for_device_target(backend.device_target) is backend
        assert backend.resources(2)[backend.ray_resource] == 2
    if backend.accelerator:
        assert backend.device_memory and backend.visible_devices and backend.pool_increase
        assert backend.memory_tool and backend.memory_tool_format in PARSERS
        assert not backend.host_devices and not backend.pins_cores
    if backend.chips:
        assert backend.chip_refusal
    if backend.jit_cache or backend.jit_settings:
        assert backend.jit_cache
    for first, last in [backend.host_ports] if backend.host_ports else []:
        assert 0 < first <= last < 65536


# --- registering a backend from outside the package -----------------------------------------


@pytest.fixture
def registry():
    """BACKENDS as it was before the test, whatever the test registered."""
    saved = dict(BACKENDS)
    yield BACKENDS
    BACKENDS.clear()
    BACKENDS.update(saved)


def test_register_refuses_a_taken_name_and_an_incomplete_backend(registry):
    with pytest.raises(ValueError, match="backend 'gpu' is already registered"):
        backends.register(replace(BACKENDS["gpu"], environment=(("X", "1"),)))
    with pytest.raises(ValueError, match="backend 'toy': kind must be one of program, estimate"):
        backends.register(backends.Backend("toy", "measure"))
    with pytest.raises(ValueError, match="backend 'toy': a program backend needs device_target"):
        backends.register(backends.Backend("toy", "program"))
    with pytest.raises(ValueError, match="register takes a Backend"):
        backends.register({"name": "toy"})
    assert "toy" not in BACKENDS
    assert backends.register(backends.Backend("toy", "estimate")) is BACKENDS["toy"]


TOY_STUDY = """
study: toy
model: {family: transformer, num_layers: 4, hidden_size: 256, num_heads: 4, seq_length: 256,
        vocab_size: 1024, dtype: float16}
train: {global_batch_size: 16, total_steps: 100}
cluster: {backend: toysim, devices: 4, devices_per_node: 4,
          device: {base: a100-80g, kind: toydev}}
search:
  space: {tp: [1, 2], pp: 1, grad_accum: [1, 2], fusion_mb: 64, loss_scale: 65536,
          warmup_steps: 0, jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 3
  seed: 0
"""


def test_a_toy_backend_registered_from_a_test_runs_a_simulated_study_and_its_export(
    registry, tmp_path
):
    """A device backend and a simulator of it, defined here and registered through the public
    hook (nothing under autotune/ names them): `autotune search` simulates the study on the
    toy device, and `autotune export` writes the toy device's facts — its environment, device
    target and MindFormers refusal — into the launch config."""
    import json

    import yaml

    from autotune.cli import build_parser, main

    toydev = backends.register(
        replace(
            BACKENDS["gpu"],
            name="toydev",
            environment=(("TOYDEV_MODE", "fast"),),
            visible_devices="TOYDEV_VISIBLE_DEVICES",
            no_mindformers="MindFormers has no toydev build; run autotune's trainer",
        )
    )
    backends.register(replace(BACKENDS["simulate"], name="toysim"))
    assert (
        "toysim"
        in build_parser()
        .parse_args(["init", "--mindformers", "x.yaml", "--backend", "toysim"])
        .backend
    )

    (tmp_path / "model.yaml").write_text(textwrap.dedent(TOY_STUDY))
    storage = f"sqlite:///{tmp_path}/toy.db"
    assert (
        main(
            [
                "search",
                str(tmp_path / "model.yaml"),
                "--storage",
                storage,
                "--sampler",
                "grid",
                "--no-confirm",
            ]
        )
        == 0
    )
    out = tmp_path / "export"
    assert main(["export", "toy", "--out", str(out), "--storage", storage]) == 0

    launch = (out / "launch.sh").read_text()
    assert "\nexport TOYDEV_MODE=fast\n" in launch
    assert f'fail "--mindformers: {toydev.no_mindformers}"' in launch
    assert json.loads((out / "train_config.json").read_text())["backend"] == "toydev"
    assert yaml.safe_load((out / "launch.yaml").read_text())["device"] == {
        "device_target": toydev.device_target
    }
    assert not (out / "mindformers.yaml").exists()  # its MindFormers refusal


def test_a_toy_devices_facts_reach_the_cost_model(registry, tmp_path):
    """A device profile of a registered toy backend's kind is priced by that backend's facts:
    the fused attention it runs and the graph engine jit_level O2 selects (a GPU-like copy
    that states both is priced as Ascend is; the GPU itself as before)."""
    from autotune.costmodel import estimate, resolve_profile
    from autotune.costmodel.estimate import fused_attention
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import parse_spec

    backends.register(
        replace(BACKENDS["gpu"], name="toyge", fused_attention=True, graph_engine=True)
    )
    o2 = Candidate(1, 1, 1, 1, 64, 1, 2**16, 0, "O2", "none")
    for kind, has in (("toyge", True), ("gpu", False)):
        spec = parse_spec(
            {
                "model": {
                    "family": "llama",
                    "num_layers": 2,
                    "hidden_size": 64,
                    "num_heads": 4,
                    "seq_length": 32,
                    "vocab_size": 256,
                    "dtype": "float16",
                    "flash_attention": True,
                },
                "train": {"global_batch_size": 8},
                "cluster": {
                    "backend": "simulate",
                    "devices": 1,
                    "device": {"base": "a100-80g", "kind": kind},
                },
            },
            tmp_path / "m.yaml",
        )
        profile = resolve_profile(spec.cluster)
        assert fused_attention(spec.model, profile, "mindspore") is has
        assert fused_attention(spec.model, profile, "megatron")  # Megatron's, on any device
        assert estimate(spec, o2).feasible is has
