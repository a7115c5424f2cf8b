"""The device check's steps 8 and 9: trials that are MindFormers runs, on the device (docs/accelerators.md,
"The device check"). What the CPU cannot run — MindFormers' semi-auto parallel (tp, pp), its fused
kernels, device memory, HCCL — studies of the tiny llama of tests/mindformers/tiny_llama_cpu.yaml
(2 layers of width 64) run here, each trial MindFormers' run_mindformer.py (the vendored r1.8.0
one) in MindFormers' venv (``make mindformers``) on a synthetic MindRecord, through ``autotune
search`` as a user runs it:

- with 2 devices or more, the grid of tp 1 and 2 (dp 2, then dp 1 · tp 2), every other knob at
  the config's own value: one line per trial;
- with 4 devices or more, one tp2 · pp2 candidate (4 micro-batches) twice, as two studies of one
  artifacts folder, so the second run loads the graphs the first compiled (MindSpore's compile
  cache, one folder per candidate): per run, what to compare (:func:`comparison`) — the last
  rank's loss as autotune reads it against the loss MindFormers' own monitor printed on that
  rank, rank 0's (stage 0: no loss), the peak against the vendor tool's reading, the first
  step's time and the cache's files.

Step 9: the same tp grid over MindFormers' mcore Qwen3 (tests/mindformers/tiny_qwen3_mindformers.yaml:
2 layers, 4 heads of 16 over a hidden size of 32, q/k norms, sliced rows), which MindFormers 1.9
cannot train on a CPU (tests/mindformers/test_mcore_trial_cpu.py): one line per trial.

Step 10: experts split over the devices — the grid of ep 1 and 2 by tp 1 and 2 (dp2, dp2·ep2,
tp2, tp2·ep2: MindFormers' rule is ep dividing dp·tp, `autotune.spec.constraints.expert_reasons`)
over MindFormers' mcore Qwen3-MoE (tests/mindformers/tiny_qwen3_moe_mindformers.yaml: 4 experts
of which a token takes 2, the all-to-all dispatch), which no CPU runs (semi-auto parallel): per
trial its line, its goodput against the same tp's ep1 trial, and the router's load-balancing loss
MindFormers printed (:func:`moe_line`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from autotune.spec.errors import SpecError
from autotune.train.runtime.device_smi import parse_npu_smi

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "mindformers" / "tiny_llama_cpu.yaml"
TINY_QWEN3 = ROOT / "tests" / "mindformers" / "tiny_qwen3_mindformers.yaml"
TINY_QWEN3_MOE = ROOT / "tests" / "mindformers" / "tiny_qwen3_moe_mindformers.yaml"
RUN_MINDFORMER = ROOT / "tests" / "mindformers" / "run_mindformer.py"
MF_PYTHON = ROOT / ".venv-mindformers" / "bin" / "python"
FIXED = {  # the tiny config's own values; tp (and pp) is what the studies search
    "pp": 1,
    "micro_batches": 1,
    "grad_accum": 2,
    "fusion_mb": 64,
    "loss_scale": 65536,
    "warmup_steps": 0,
    "jit_level": "O1",
    "recompute": "none",
    "parallel_optimizer": False,
}
PIPELINE = {"tp": 2, "pp": 2, "micro_batches": 4}  # dp 1: the 4 devices, 4 micro-batches of 2
FIXED_QWEN3 = {**FIXED, "grad_accum": 1, "jit_level": "O0"}  # the Qwen3 config's own
STUDY = "device-check-mindformers"
# MFLossMonitor's line (core/callback/callback.py): "step:[    1/   21], loss:[4.854959/…"
MONITOR_LOSS = re.compile(r"step:\[\s*(\d+)/\s*\d+\], loss:\[\s*([^/\]]+)/")
# MFLossMonitor's separate losses of an MoE model (print_separate_loss): "load_balancing_loss: 0.0123, "
BALANCING_LOSS = re.compile(r"load_balancing_loss: ([-+0-9.eE]+)")
MOE_SKIP = ("10 mindformers moe", "skipped: a dp2·ep2 trial needs --devices 2 or more")


def plan(backend, devices: int) -> list[tuple[str, str]]:
    """Step 8 as the dry run says it: (name, what runs)."""
    if backend.no_mindformers:
        return [
            ("8 mindformers", f"skipped: {backend.no_mindformers}"),
            ("9 mindformers mcore", f"skipped: {backend.no_mindformers}"),
            ("10 mindformers moe", f"skipped: {backend.no_mindformers}"),
        ]
    if devices < 2:
        return [
            ("8 mindformers", "skipped: a dp2 and a tp2 trial need --devices 2 or more"),
            ("9 mindformers mcore", "skipped: a dp2 and a tp2 trial need --devices 2 or more"),
            MOE_SKIP,
        ]
    steps = [] if MF_PYTHON.exists() else [("8 mindformers venv", f"make -C {ROOT} mindformers")]
    for tp in (1, 2):
        steps.append(
            (
                f"8 mindformers tp{tp}",
                f"MindFormers trial of the tiny llama, dp={2 // tp} tp={tp} (autotune search, "
                "trial.program mindformers, a synthetic MindRecord)",
            )
        )
    if devices < 4:
        steps.append(("8 mindformers tp2·pp2", "skipped: a tp2·pp2 trial needs --devices 4"))
    else:
        for run in (1, 2):
            steps.append(
                (
                    f"8 mindformers tp2·pp2 {run}/2",
                    "MindFormers trial of the tiny llama, dp=1 tp=2 pp=2 micro_batches=4 "
                    + ("(fills its compile cache)" if run == 1 else "(loads the first's graphs)"),
                )
            )
    for tp in (1, 2):
        steps.append(
            (
                f"9 mindformers mcore tp{tp}",
                f"MindFormers trial of the tiny mcore Qwen3, dp={2 // tp} tp={tp} (autotune "
                "search, trial.program mindformers, a synthetic MindRecord of sliced rows)",
            )
        )
    for tp, ep in MOE_GRID:
        steps.append(
            (
                f"10 mindformers moe {_moe_label(tp, ep)}",
                f"MindFormers trial of the tiny mcore Qwen3-MoE (4 experts, 2 per token), "
                f"dp={2 // tp} tp={tp} ep={ep} (autotune search, trial.program mindformers, a "
                "synthetic MindRecord of sliced rows)",
            )
        )
    return steps


MOE_GRID = ((1, 1), (1, 2), (2, 1), (2, 2))  # (tp, ep) on 2 devices: ep divides dp·tp = 2


def _moe_label(tp: int, ep: int) -> str:
    return "·".join(
        ([f"dp{2 // tp}"] if tp == 1 else []) + [f"tp{tp}"] * (tp > 1) + [f"ep{ep}"] * (ep > 1)
    )


def moe_line(result, folder: Path, ranks: int, against: float | None, trial_line) -> str:
    """Step 10's line for one trial in ``folder``: ``trial_line``'s, then its goodput against
    ``against`` (the same tp's ep1 trial's), and the load-balancing loss MindFormers' monitor
    printed at step 1 on the last rank (the router's only reading a MindFormers run gives)."""
    line = trial_line(result, folder)
    if result.outcome != "ok":
        return line
    goodput = result.metrics.get("goodput")
    ratio = f" (÷ ep1's {goodput / against:.2f})" if goodput and against else ""
    log = folder / "logs" / f"worker_{ranks - 1}.log"
    found = BALANCING_LOSS.search(log.read_text(errors="replace")) if log.exists() else None
    balancing = found.group(1) if found else "not printed"
    return f"{line}; goodput {goodput or 0:.1f} samples/s{ratio}; load_balancing_loss {balancing}"


def monitor_losses(log: Path) -> dict[int, float]:
    """The losses MindFormers' MFLossMonitor printed in ``log``, by its step (from 1)."""
    said = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        found = MONITOR_LOSS.search(line)
        if found:
            said.setdefault(int(found.group(1)), float(found.group(2)))
    return said


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def comparison(folder: Path, ranks: int, metrics: dict, cache: Path | None) -> str:
    """What to compare for one MindFormers trial in ``folder`` of ``ranks`` ranks (see the
    module doc): ``metrics`` autotune's, ``cache`` its compile cache folder."""
    mf = json.loads((folder / "config.json").read_text())["mindformers"]
    last = ranks - 1
    recorded = _records(folder / f"steps.rank{last}.jsonl")
    printed = monitor_losses(folder / "logs" / f"worker_{last}.log").get(1)
    stage0 = _records(folder / "steps.rank0.jsonl")
    summary = json.loads((folder / f"metrics.rank{last}.json").read_text())
    allocated = summary.get("device_allocated_mb") or 0.0
    reserved = summary.get("device_reserved_now_mb") or 0.0
    text = summary.get("device_smi")
    smi = parse_npu_smi(text, summary["pid"]) if text else None
    tool = "no npu-smi" if not text else "not listed" if smi is None else f"{smi:.0f} MB"
    files = sum(1 for p in cache.rglob("*") if p.is_file()) if cache and cache.is_dir() else 0
    return (
        f"loss: rank {last} {recorded[0]['loss'] if recorded else None} ÷ "
        f"{mf['loss_divisor']} = {metrics['loss_first']:.6f}, MindFormers printed "
        f"{printed if printed is not None else 'nothing'}; rank 0 (stage 0) "
        f"{stage0[0]['loss'] if stage0 else None}; peak {metrics['peak_memory_mb']:.0f} MB = "
        f"allocated {allocated:.0f} + overhead {metrics['peak_memory_mb'] - allocated:.0f}, "
        f"npu-smi {tool} (pool reserved {reserved:.0f}); first step "
        f"{metrics['first_step_s']:.1f} s; compile cache {files} files"
    )


def _model(folder: Path, backend, devices: int, space: dict, base: Path = TINY) -> Path:
    from autotune.spec.mindformers_init import init_text

    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.yaml"
    text, _ = init_text(
        base,
        model,
        devices=devices,
        devices_per_node=devices,
        backend=backend.name,
        run_mindformer=str(RUN_MINDFORMER),
        python=str(MF_PYTHON),
        synthetic=True,
    )
    data = yaml.safe_load(text)
    data["study"] = STUDY
    data["search"]["space"] = space
    data.pop("baseline", None)  # the candidates are the space's only
    data["trial"].update(steps=10, measure_after=2)
    model.write_text(yaml.safe_dump(data, sort_keys=False))
    return model


def _search(model: Path, study: str, folder: Path) -> str:
    """``autotune search`` of ``model`` as ``study`` in ``folder``; "" when it ran, else why not."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            str(model),
            "--study",
            study,
            "--sampler",
            "grid",
            "--no-confirm",
            "--storage",
            f"sqlite:///{folder / 'study.db'}",
            "--artifacts",
            str(folder / "trials"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return "" if done.returncode == 0 else f"FAILED: autotune search: {done.stderr.strip()[-300:]}"


def _trials(study: str, folder: Path):
    from autotune.jobs import Result
    from autotune.storage.connection import load_study
    from autotune.storage.schema import knobs_of, metrics_of, outcome_of

    for trial in load_study(study, f"sqlite:///{folder / 'study.db'}").get_trials(deepcopy=False):
        yield (
            trial.number,
            knobs_of(trial),
            Result(
                outcome_of(trial),
                metrics_of(trial),
                trial.user_attrs.get("detail", ""),
                bool(trial.user_attrs.get("infrastructure")),
            ),
        )


def check(backend, devices: int, work: Path, say, trial_line) -> None:
    """Run steps 8 and 9, ``say``-ing one line per trial (``trial_line(result, folder)`` for the
    tp grids, :func:`comparison` for the pipeline's two runs)."""
    planned = plan(backend, devices)
    if planned[0][1].startswith("skipped"):
        for step in planned:
            say(*step)
        return
    if not MF_PYTHON.exists():
        done = subprocess.run(["make", "-C", str(ROOT), "mindformers"], capture_output=True)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            say("8 mindformers venv", f"FAILED: {tail}", False)
            return
        say("8 mindformers venv", f"made {MF_PYTHON}")
    _tp_grid("8 mindformers", TINY, FIXED, work / "mindformers", backend, say, trial_line)
    if devices < 4:
        say("8 mindformers tp2·pp2", "skipped: a tp2·pp2 trial needs --devices 4")
    else:
        _pipeline(backend, work, say, trial_line)
    folder = work / "mindformers-mcore"
    base = bfloat16(TINY_QWEN3, folder) if backend.name == "ascend" else TINY_QWEN3
    _tp_grid("9 mindformers mcore", base, FIXED_QWEN3, folder, backend, say, trial_line)
    _moe_grid(backend, work / "mindformers-moe", say, trial_line)


def bfloat16(base: Path, folder: Path) -> Path:
    """``base`` (a float32 CPU config) computing in bfloat16, through a config of its own in
    ``folder``: Ascend's flash attention runs no float32 (step 10's config computes so too)."""
    folder.mkdir(parents=True, exist_ok=True)
    layered = folder / f"{base.stem}_bf16.yaml"
    layered.write_text(
        f"base_config: {base}\nmodel:\n  model_config:\n    compute_dtype: bfloat16\n"
    )
    return layered


def _tp_grid(name: str, base: Path, fixed: dict, folder: Path, backend, say, trial_line) -> None:
    """A study of ``base`` over tp 1 and 2 on 2 devices, a line per trial."""
    space = {"tp": [1, 2], **{k: [v] for k, v in fixed.items()}}
    try:
        model = _model(folder, backend, 2, space, base)
    except SpecError as exc:  # the step's own config: a line, and the check goes on
        say(name, f"FAILED: its model.yaml: {exc}", False)
        return
    failed = _search(model, STUDY, folder)
    if failed:
        say(name, failed, False)
        return
    for number, knobs, result in _trials(STUDY, folder):
        line = trial_line(result, folder / "trials" / STUDY / str(number))
        say(f"{name} tp{knobs['tp']}", line, result.outcome == "ok")


def _pipeline(backend, work: Path, say, trial_line) -> None:
    """The tp2 · pp2 candidate twice, the second from the first's compile cache."""
    folder = work / "mindformers-pipeline"
    space = {**{k: [v] for k, v in FIXED.items()}, **{k: [v] for k, v in PIPELINE.items()}}
    model = _model(folder, backend, 4, space)
    cache = folder / "trials" / ".mindformers-cache"
    for run in (1, 2):
        name, study = f"8 mindformers tp2·pp2 {run}/2", f"{STUDY}-pipeline-{run}"
        failed = _search(model, study, folder)
        if failed:
            say(name, failed, False)
            return
        for number, _, result in _trials(study, folder):
            trial = folder / "trials" / study / str(number)
            good = result.outcome == "ok"
            line = (
                comparison(trial, 4, result.metrics, cache) if good else trial_line(result, trial)
            )
            say(name, line, good)


def _moe_grid(backend, folder: Path, say, trial_line) -> None:
    """Step 10: the tiny Qwen3-MoE over ep 1, 2 by tp 1, 2 on 2 devices, a line per trial."""
    space = {"tp": [1, 2], "ep": [1, 2], **{k: [v] for k, v in FIXED_QWEN3.items()}}
    try:
        model = _model(folder, backend, 2, space, TINY_QWEN3_MOE)
    except SpecError as exc:
        say("10 mindformers moe", f"FAILED: its model.yaml: {exc}", False)
        return
    failed = _search(model, STUDY, folder)
    if failed:
        say("10 mindformers moe", failed, False)
        return
    ran = {(k["tp"], k["ep"]): (n, r) for n, k, r in _trials(STUDY, folder)}
    for tp, ep in sorted(ran):
        number, result = ran[tp, ep]
        plain = ran.get((tp, 1), (None, None))[1]
        against = plain.metrics.get("goodput") if plain and ep > 1 else None
        line = moe_line(result, folder / "trials" / STUDY / str(number), 2, against, trial_line)
        say(f"10 mindformers moe {_moe_label(tp, ep)}", line, result.outcome == "ok")
