"""launch.sh: the ``msrun`` command that trains with the exported knobs.

Contract: :func:`launch_script` returns the script text. The script
- takes ``--steps N`` (or ``AUTOTUNE_STEPS=N``) to stop after step N, ``--out DIR`` (default
  ``run/`` beside it) and ``--resume`` (continue from the latest checkpoint in
  ``DIR/checkpoint/rank_<r>/``: weights, optimizer state, loss scale and step), writes
  ``DIR/train_config.json`` (the export's ``train_config.json`` with ``out_dir`` = DIR,
  checkpoints in ``DIR/checkpoint``, the step count when given, and — unless resuming — the
  export's own ``checkpoint/`` as the starting weights when that folder exists, e.g. from
  ``export --reshard``), and runs ``python -m autotune.train`` on it — through ``msrun`` when the
  layout has more than one worker;
- reads ``MASTER_ADDR`` (default 127.0.0.1), ``MASTER_PORT`` (default 8118), ``NODE_RANK``
  (required when the job spans several nodes) and ``LOG_DIR`` (default ``DIR/logs``);
- expects the environment with MindSpore and ``autotune`` importable as ``python`` on PATH
  (msrun only accepts the literal names ``python``/``python3`` in front of ``-m``).
"""

from __future__ import annotations

import json

from autotune.space import Candidate
from autotune.spec import Spec

_HEADER = """\
#!/usr/bin/env bash
# autotune export: study {study}, trial {number}: dp={dp} tp={tp} pp={pp} ({workers} workers{nodes_note}).
# Usage: bash launch.sh [--steps N] [--out DIR] [--resume]
#   --steps N  stop after step N instead of train.total_steps (or AUTOTUNE_STEPS=N)
#   --out DIR  where the run writes metrics, logs and checkpoints (default: run/ beside this file)
#   --resume   continue from the latest checkpoint in DIR/checkpoint/rank_<r>/
# Checkpoints: DIR/checkpoint/rank_<r>/step_<N>.ckpt every train.save_every steps and at the end;
# strategy.ckpt beside this file describes them (mindspore.parallel.transform_checkpoints). A new
# run starts from checkpoint/rank_<r>/ beside this file when that folder exists.
# Environment: MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 8118), NODE_RANK
# (0..nodes-1, required on multi-node jobs), LOG_DIR.
set -euo pipefail

HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
STEPS="${{AUTOTUNE_STEPS:-}}"
OUT="$HERE/run"
RESUME=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS="${{2:?--steps needs a value}}"; shift 2 ;;
    --out) OUT="${{2:?--out needs a value}}"; shift 2 ;;
    --resume) RESUME=1; shift ;;
    *) echo "launch.sh: unknown argument '$1' (use --steps N, --out DIR, --resume)" >&2; exit 2 ;;
  esac
done
if [[ -n "$STEPS" && ! "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch.sh: --steps must be a positive integer, got '$STEPS'" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
CONFIG="$OUT/train_config.json"

# The trainer reads everything from its config: write this run's copy.
python - "$HERE" "$CONFIG" "$OUT" "$STEPS" "$RESUME" <<'PY'
import json
import os
import sys

here, target, out_dir, steps, resume = sys.argv[1:]
with open(os.path.join(here, "train_config.json")) as f:
    config = json.load(f)
config["out_dir"] = out_dir
if steps:
    config["trial"]["steps"] = int(steps)
    config["trial"]["measure_after"] = min(config["trial"]["measure_after"], int(steps) - 1)
given = os.path.join(here, "checkpoint")
config["checkpoint"].update(dir=os.path.join(out_dir, "checkpoint"), resume=bool(resume),
                            init_from=given if os.path.isdir(given) and not resume else None)
with open(target, "w") as f:
    json.dump(config, f, indent=2)
PY
"""

_SINGLE = """\
exec python -m autotune.train "$CONFIG"
"""

_MSRUN = """\
exec msrun \\
  --worker_num={workers} \\
  --local_worker_num={local} \\
  --master_addr="${{MASTER_ADDR:-127.0.0.1}}" \\
  --master_port="${{MASTER_PORT:-8118}}" \\
  --node_rank="{node_rank}" \\
  --log_dir="${{LOG_DIR:-$OUT/logs}}" \\
  --join=True \\
  python -m autotune.train "$CONFIG"
"""


def launch_script(spec: Spec, c: Candidate, trial: dict) -> str:
    workers = c.devices
    local = min(spec.cluster.devices_per_node, workers)
    nodes = -(-workers // local)
    header = _HEADER.format(study=json.dumps(str(trial["study"])), number=trial["number"],
                            dp=c.dp, tp=c.tp, pp=c.pp, workers=workers,
                            nodes_note=f" on {nodes} nodes" if nodes > 1 else "")
    if workers == 1:
        return header + _SINGLE
    # One node: rank 0 is the only choice; several: each node must say which it is.
    node_rank = "${NODE_RANK:-0}" if nodes == 1 else "${NODE_RANK:?set NODE_RANK (0..%d) on each node}" % (nodes - 1)
    return header + _MSRUN.format(workers=workers, local=local, node_rank=node_rank)
