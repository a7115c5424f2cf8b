"""The device check: what the first real GPU/Ascend run needs, checked on the user's host in
minutes (issue 30, item 7). Run through benchmarks/device_check.sh, which installs autotune
first; docs/accelerators.md, "The device check", says what each printed line should read.

In order, one line each (``[n name] …``), then a verdict line:

1 install   the backend's packages (``Backend.packages``: the CUDA 11 libraries the GPU plugin
            links against) into this venv, or its host setup checked (Ascend's CANN environment);
2 kernels   GPU: the compute capability against the plugin's kernels (their fat binaries, read
            by `autotune.execution.warmup.kernel_targets`) — whether every fresh process
            JIT-compiles them;
3 first op  the device brought up and a first op made in a fresh process, cold (an empty JIT
            cache) then warm (the cache the cold one filled), each timed;
4 memory    one process's readings after a 1 GiB tensor: MindSpore's allocated, reserved and
            reserved peak, the vendor tool's (and whether it saw the process), the device's size;
5 fresh     two quickstart trials on the device, each in processes of its own;
6 warm      four quickstart trials of one layout in one warm pool (the first starts it);
7 hidden    a trial with the plugin's libraries hidden: must be the infrastructure's error;
8 mindformers  a 2-trial study whose trials are MindFormers runs, dp2 and tp2 (Ascend, 2 devices
            or more), and a tp2·pp2 candidate run twice, from one compile cache (4 devices or
            more); 9 that grid over an mcore Qwen3; 10 an mcore Qwen3-MoE over ep 1, 2 by tp 1, 2
            (dp2·ep2 …): benchmarks/device_check_mindformers.py; skipped with the reason on GPU.

    bash benchmarks/device_check.sh gpu|ascend [--devices N] [--dry-run]

``--dry-run`` prints what it would install and run, in order, and runs nothing (the CPU test:
tests/execution/test_first_device_run.py). ``--memory-probe BACKEND`` is step 4's process.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import device_check_mindformers  # noqa: E402  (step 8, beside this file)

from autotune.execution.warmup import kernel_targets  # noqa: E402
from autotune.spec.backends import BACKENDS  # noqa: E402

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TRIAL_TIMEOUT_S = 300


def _plugin(backend) -> Path:
    import importlib.util

    lib = Path(importlib.util.find_spec("mindspore").origin).parent / "lib" / "plugin"
    return lib / (
        "libmindspore_gpu.so.11.6" if backend.name == "gpu" else "libmindspore_ascend.so.2"
    )


def _library_folders() -> list[str]:
    """The library folders of the installed ``nvidia-*`` packages (site-packages/nvidia/*/lib)."""
    import site

    found = []
    for base in site.getsitepackages():
        found += sorted(str(p) for p in Path(base, "nvidia").glob("*/lib") if p.is_dir())
    return found


def _environment(backend, hidden: bool = False) -> dict:
    """The checks' environment: the packages' library folders first on LD_LIBRARY_PATH, or
    (``hidden``) every folder that holds the plugin's libraries removed from it."""
    env = dict(os.environ)
    current = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if hidden:
        vendor = ("nvidia", "cuda", "Ascend", "cann")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in current if not any(v in p for v in vendor)
        )
    else:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(_library_folders() + current)
    return env


def _knobs(candidate) -> str:
    return " ".join(f"{k}={v}" for k, v in candidate.as_dict().items())


def trials(spec) -> list:
    """(name, candidate) of steps 5 and 6: the quickstart's baseline layout, which a warm pool on
    an accelerator runs throughout (one layout), with knobs no layout holds varied."""
    from autotune.spec.space import build_space

    baseline = build_space(spec).baseline()
    fresh = [baseline, baseline.replace(fusion_mb=1)]
    warm = [baseline, baseline.replace(fusion_mb=1), baseline.replace(loss_scale=2**12), baseline]
    return [(f"5 fresh {n}/2", c) for n, c in enumerate(fresh, 1)] + [
        (f"6 warm {n}/4", c) for n, c in enumerate(warm, 1)
    ]


def _quickstart(backend, devices: int):
    """The quickstart's spec on ``devices`` devices of ``backend``."""
    from autotune.spec.model_yaml import load_spec

    return load_spec(
        QUICKSTART,
        {
            "cluster.backend": backend.name,
            "cluster.devices": devices,
            "cluster.devices_per_node": devices,
            "cluster.device_memory_gb": None,
            "study": "device-check",
        },
    )


def _trial(spec, candidate, folder: Path, runner, number: int):
    from autotune import costmodel
    from autotune.train.config import trial_config

    config = trial_config(
        spec,
        candidate,
        study="device-check",
        number=number,
        out_dir=folder,
        steps=spec.trial.steps,
        measure_after=spec.trial.measure_after,
        device_memory=costmodel.device_memory_cap(spec.cluster),
    )
    size_mb = costmodel.estimate(spec, candidate).memory_gb_per_device * 1024
    return runner(config, folder, size_mb)


def _trial_line(result, folder: Path) -> str:
    if result.outcome not in ("ok", "diverged"):
        return (
            f"{result.outcome}{' (infrastructure)' if result.infrastructure else ''}: "
            f"{(result.detail.splitlines() or [''])[0][:300]}"
        )
    m = result.metrics
    rank = json.loads((folder / "metrics.rank0.json").read_text())
    device = ", ".join(
        f"{k.removeprefix('device_')}={v if isinstance(v, str) else round(v or 0)}"
        for k, v in sorted(rank.items())
        if k.startswith("device_") and k != "device_smi"  # the tool's whole output
    )
    return (
        f"ok step {m['step_time_ms']:.1f} ms, peak {m['peak_memory_mb']:.0f} MB ({device}); "
        f"launch {m['launch_s']:.1f} s, init {m['init_s']:.1f} s, first step "
        f"{m['first_step_s']:.1f} s"
    )


def plan(backend, devices: int) -> list[tuple[str, list[str], dict]]:
    """The checks in order: (name, the command (a list) or the trial it runs, extra
    environment)."""
    python = sys.executable
    steps = []
    if backend.packages:
        steps.append(("1 install", [python, "-m", "pip", "install", *backend.packages], {}))
    else:
        # the host's setup sourced, its environment taken over by the checks below
        steps.append(("1 install", ["bash", "-c", f"{backend.host_setup} >&2 && env -0"], {}))
    if backend.name == "gpu":
        steps.append(
            (
                "2 kernels",
                ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                {},
            )
        )
    warm = [python, "-m", "autotune.train", "--warm-up", backend.name]
    cache = {backend.jit_cache: "<a new empty folder>"} if backend.jit_cache else {}
    steps.append(("3 first op cold", warm, cache))
    steps.append(
        ("3 first op warm", warm, {backend.jit_cache: "<the same folder>"} if cache else {})
    )
    steps.append(
        ("4 memory", [python, str(Path(__file__).resolve()), "--memory-probe", backend.name], {})
    )
    spec = _quickstart(backend, devices)
    for name, candidate in trials(spec):
        how = "processes of its own" if name.startswith("5") else "one warm pool"
        steps.append((name, f"quickstart trial {_knobs(candidate)} ({how})", {}))
    spec1 = _quickstart(backend, 1)
    steps.append(
        (
            "7 hidden",
            f"quickstart trial {_knobs(trials(spec1)[0][1])} (processes of its own)",
            {"LD_LIBRARY_PATH": "<without the nvidia/cuda/Ascend folders>"},
        )
    )
    steps += [(name, what, {}) for name, what in device_check_mindformers.plan(backend, devices)]
    return steps


def memory_probe(name: str) -> int:
    """Step 4's process: the device up as a trial brings it up, a 1 GiB tensor, the readings."""
    import mindspore as ms
    import numpy as np

    from autotune.train.runtime.device_memory import memory_settings
    from autotune.train.runtime.device_smi import process_memory
    from autotune.train.runtime.session import numpy2_workaround

    backend = BACKENDS[name]
    ms.set_device(backend.device_target)
    settings = memory_settings({"device_memory": {"size_gb": 80, "max_size_gb": 16}}, backend)
    ms.runtime.set_memory(**settings)
    numpy2_workaround(ms)
    tensor = ms.Tensor(np.ones((256, 1024, 1024), np.float32)) + 1  # 1 GiB on the device
    tensor.asnumpy()
    reading = process_memory(backend, os.getpid())
    device = ms.get_current_device().device_id
    print(
        json.dumps(
            {
                "allocated_mb": ms.runtime.memory_allocated() / 2**20,
                "reserved_mb": ms.runtime.memory_reserved() / 2**20,
                "max_reserved_mb": ms.runtime.max_memory_reserved() / 2**20,
                "smi_mb": reading.mb,
                "smi_seen": reading.seen,
                "increase_size": settings.get("increase_size"),
                "total_gib": ms.hal.get_device_properties(device).total_memory / 2**30,
                "chip": ms._c_expression.MSContext.get_instance().get_ascend_soc_version(),
            }
        )
    )
    return 0


def _run(argv, env=None, timeout=1800) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    said = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, said[-1] if said else "", time.monotonic() - started


def check(backend, devices: int) -> int:
    """Run the plan (see the module doc); the verdict's exit code: 0 every check as it should."""
    from autotune.execution.runner import run_trial
    from autotune.execution.warm import WarmPool

    failed = []

    def say(name: str, line: str, good: bool = True) -> None:
        print(f"[{name}] {line}", flush=True)
        if not good:
            failed.append(name)

    steps = dict((name, (argv, extra)) for name, argv, extra in plan(backend, devices))
    started = time.monotonic()
    done = subprocess.run(steps["1 install"][0], capture_output=True, text=True, cwd=ROOT)
    if backend.host_setup and done.returncode == 0:  # the toolkit's environment, for what follows
        os.environ.update(
            dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
        )
    said = (done.stderr if backend.host_setup else done.stdout + done.stderr).strip().splitlines()
    say(
        "1 install",
        f"{'done' if done.returncode == 0 else 'FAILED'} in "
        f"{time.monotonic() - started:.0f} s: {(said or [''])[-1][:300]}",
        done.returncode == 0,
    )
    os.environ.update(_environment(backend))  # the trials below inherit it
    if backend.name == "gpu":
        modules, targets = kernel_targets(_plugin(backend).parent / "gpu" / "libcuda_ops.so.11")
        code, gpu, _ = _run(steps["2 kernels"][0])
        capability = int(float(gpu.rsplit(",", 1)[-1]) * 10) if code == 0 else 0
        jit = capability // 10 > max(targets["sass"]) // 10
        say(
            "2 kernels",
            f"{gpu or 'nvidia-smi failed'}: the plugin's {modules} modules carry SASS "
            f"sm_{targets['sass']} and PTX compute_{targets['ptx']}: "
            f"{'every fresh process JIT-compiles them (the cache below keeps them)' if jit else 'no JIT'}",
            code == 0,
        )
    work = Path(tempfile.mkdtemp(prefix="autotune-device-check-"))
    env = dict(os.environ)
    if backend.jit_cache:
        env[backend.jit_cache] = str(work / "jit")
    cold = _run(steps["3 first op cold"][0], env)
    warm = _run(steps["3 first op warm"][0], env)
    say(
        "3 first op",
        f"cold {cold[2]:.1f} s ({cold[1]}); warm {warm[2]:.1f} s ({warm[1]}); "
        f"cold ÷ warm {cold[2] / max(warm[2], 1e-9):.1f}",
        cold[0] == warm[0] == 0,
    )
    code, last, _ = _run(steps["4 memory"][0])
    if code == 0:
        m = json.loads(last)
        grown = m["reserved_mb"] - m["allocated_mb"]
        say(
            "4 memory",
            f"allocated {m['allocated_mb']:.0f} MiB, reserved {m['reserved_mb']:.0f} "
            f"(peak {m['max_reserved_mb']:.0f}), reserved − allocated {grown:.0f} MiB against the "
            f"{m['increase_size']} increase; {backend.memory_tool[0]} {m['smi_mb']} MiB "
            f"({m['smi_seen']}); device {m['total_gib']:.1f} GiB; chip {m['chip'] or '-'}",
            m["smi_seen"] == "read",
        )
    else:
        say("4 memory", f"FAILED: {last}", False)
    spec = _quickstart(backend, devices)
    peaks, pool = [], WarmPool(work / "pool", devices)
    try:
        for number, (name, candidate) in enumerate(trials(spec)):
            folder = work / name.split()[1] / str(number)
            if name.startswith("5"):
                result = _trial(
                    spec,
                    candidate,
                    folder,
                    lambda c, f, _: run_trial(c, f, TRIAL_TIMEOUT_S, None, devices),
                    number,
                )
                peaks.append(result.metrics.get("peak_memory_mb"))
                against = ""
            else:
                result = _trial(
                    spec,
                    candidate,
                    folder,
                    lambda c, f, size: pool.run(c, f, TRIAL_TIMEOUT_S, None, size),
                    number,
                )
                peak = result.metrics.get("peak_memory_mb")
                against = f"; peak ÷ fresh 1's {peak / peaks[0]:.3f}" if peak and peaks[0] else ""
            say(name, _trial_line(result, folder) + against, result.outcome == "ok")
    finally:
        pool.close()
    hidden_env = _environment(backend, hidden=True)
    code, loaded, _ = _run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(_plugin(backend))!r})"], hidden_env
    )
    if code == 0:
        say(
            "7 hidden",
            "skipped: the plugin's libraries load from outside LD_LIBRARY_PATH "
            "(its RPATH /usr/local/cuda/lib64, or the system's folders): nothing to hide",
        )
    else:
        spec1 = _quickstart(backend, 1)
        baseline1 = trials(spec1)[0][1]
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(hidden_env)
        try:
            folder = work / "hidden"
            result = _trial(
                spec1,
                baseline1,
                folder,
                lambda c, f, _: run_trial(c, f, TRIAL_TIMEOUT_S, None, 1),
                99,
            )
        finally:
            os.environ.clear()
            os.environ.update(saved)
        say(
            "7 hidden",
            f"{result.outcome}, infrastructure {str(result.infrastructure).lower()}: "
            f"{(result.detail.splitlines() or [''])[0][:300]}",
            result.outcome == "error" and result.infrastructure,
        )
    device_check_mindformers.check(backend, devices, work, say, _trial_line)
    print(
        f"[verdict] {'every check as it should be' if not failed else 'FAILED: ' + ', '.join(failed)}"
        f" (work folder {work})",
        flush=True,
    )
    return 0 if not failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=[n for n, b in BACKENDS.items() if b.accelerator])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true")
    if sys.argv[1:2] == ["--memory-probe"]:
        return memory_probe(sys.argv[2])
    args = parser.parse_args()
    backend = BACKENDS[args.backend]
    if args.dry_run:
        for name, argv, extra in plan(backend, args.devices):
            given = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
            what = argv if isinstance(argv, str) else shlex.join(argv)
            print(f"[{name}] {given + ' ' if given else ''}{what}")
        return 0
    return check(backend, args.devices)


if __name__ == "__main__":
    sys.exit(main())
