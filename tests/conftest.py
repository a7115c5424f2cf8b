"""What the test packages share: where things are (`ROOT`, `FIXTURES`), the model.yaml texts many
tests start from, the trial program run as the driver runs it (`make_config`, `run`, `train`; a
free port: `autotune.execution.nodes.free_port`), and the check that a registry's names appear in
no rule outside it (`naming`). A package's own fixtures live in its folder's conftest.py
(`tests/storage/conftest.py`: a PostgreSQL server).

The texts are the ``model:`` and ``train:`` sections of a model.yaml (with ``cluster:`` where
every user of the text runs the same one); a test completes one with its own study name, cluster
and search: ``"study: s\\n" + SIM8_MODEL + "cluster: ...\\nsearch: ..."``.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# The 8-layer, 1024-wide GPT of the simulate and replay studies: big enough that the layouts of 8
# A100s differ in time and memory, never run on this CPU.
SIM8_MODEL = """\
model: {family: transformer, num_layers: 8, hidden_size: 1024, num_heads: 16, seq_length: 1024,
        vocab_size: 32000, dtype: bfloat16}
train: {global_batch_size: 64}
"""

# The tiny GPT a real CPU study trains: a trial of 8 steps takes seconds.
TINY_GPT_MODEL = """\
model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 2, seq_length: 16,
        vocab_size: 64, dtype: float16}
train: {global_batch_size: 8, learning_rate: 5.0e-3, total_steps: 200}
"""

# A small GPT simulated on two CPU devices: studies that need the whole loop, instantly.
SMALL_CPU_SIMULATE = """\
model: {family: transformer, num_layers: 2, hidden_size: 64, num_heads: 4, seq_length: 32,
        vocab_size: 256, dtype: float16}
train: {global_batch_size: 16}
cluster: {backend: simulate, devices: 2, devices_per_node: 2, device: cpu}
"""

# The smallest model a spec validates (no dtype: the default), for the spec's own checks.
MINI_MODEL = """\
model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,
        vocab_size: 64}
"""


def interruptible() -> None:
    """A ``preexec_fn`` giving the child Ctrl-C as a terminal's foreground job gets it: a shell
    starts a background job (``make test &``, ``bash -c '… & wait'``) with SIGINT ignored, which
    Python then keeps, so a child inheriting it never sees the signal (measured: the Ctrl-C tests
    of tests/study/test_trial_is_a_run.py and tests/execution/test_processes.py then fail, the
    latter after its 180 s bound)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def naming(tree: ast.AST, words: set[str]) -> list[tuple[int, str]]:
    """Where ``tree`` compares with one of ``words`` (a registry's names: backends', trial
    programs'), keys a dict by one, or lists several: a per-name rule or fact kept outside its
    registry. (Other strings that happen to be such a word — the cpu device profile's name, a
    call's argument, a config's section — are not rules.)"""

    def named(node) -> bool:
        return (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower() in words
        )

    def holds(node) -> bool:
        return named(node) or (
            isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)
        )

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(holds(n) for n in [node.left, *node.comparators]):
            hits.append((node.lineno, "compares with a registered name"))
        elif isinstance(node, ast.Dict) and any(named(k) for k in node.keys if k is not None):
            hits.append((node.lineno, "a dict keyed by a registered name"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(map(named, node.elts)) >= 2:
            hits.append((node.lineno, "a collection of registered names"))
    return hits


# --- the trial program, run as the driver runs it ---------------------------------------------

BIN = Path(sys.executable).parent


def make_config(out_dir, *, model=None, knobs=None, steps=30, lr=0.01, batch=16, trial=None):
    """A tiny trial config in the driver's format, written to out_dir/config.json."""
    cfg = {
        "study": "test",
        "trial_number": 0,
        "backend": "cpu",
        "seed": 0,
        "out_dir": str(out_dir),
        "model": {
            "family": "transformer",
            "entry": None,
            "num_layers": 1,
            "hidden_size": 32,
            "num_heads": 4,
            "ffn_hidden_size": 64,
            "seq_length": 16,
            "vocab_size": 64,
            "dtype": "float16",
            **(model or {}),
        },
        "train": {"global_batch_size": batch, "learning_rate": lr, "total_steps": 10000},
        "trial": {"steps": steps, "measure_after": 2, **(trial or {})},
        "knobs": {
            "dp": 1,
            "tp": 1,
            "pp": 1,
            "micro_batches": 1,
            "fusion_mb": 64,
            "grad_accum": 1,
            "loss_scale": 1024,
            "warmup_steps": 100,
            "jit_level": "O1",
            "recompute": "none",
            **(knobs or {}),
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def run(cmd, timeout=180, env=None):
    """Run in a new session (this venv's python and msrun first on PATH, the project importable);
    on timeout kill the whole group so no worker outlives the test."""
    env = {
        **(env or os.environ),
        "PYTHONPATH": str(ROOT),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def train(tmp_path, name, **kwargs):
    out = tmp_path / name
    code, _, err = run([sys.executable, "-m", "autotune.train", make_config(out, **kwargs)])
    assert code == 0, err[-3000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return json.loads((out / "metrics.json").read_text()), steps


# --- Ray clusters a test starts -----------------------------------------------------------


def stop_cluster(temp: str) -> None:
    """End the Ray cluster started with ``--temp-dir=temp``: its raylet and GCS name that folder,
    and the agents and workers they start (which rename themselves ``ray::…``) descend from them.
    (`ray stop` would end every Ray on the machine, other users' studies included.)"""
    import signal
    import time

    def members():
        parent, named = {}, set()
        for entry in os.scandir("/proc"):
            try:
                if not entry.name.isdigit():
                    continue
                stat = Path(entry.path, "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                if temp in Path(entry.path, "cmdline").read_bytes().decode(errors="replace"):
                    named.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        found, grew = set(named), True
        while grew:
            more = {pid for pid, ppid in parent.items() if ppid in found} - found
            found |= more
            grew = bool(more)
        return sorted(found)

    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        for pid in members():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while members() and time.monotonic() < deadline:
            time.sleep(0.1)
