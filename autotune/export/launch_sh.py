"""launch.sh: the command that trains with the exported knobs, with autotune's trainer or MindFormers.

Contract: :func:`launch_script` returns the script text. The script
- ``bash launch.sh [--steps N] [--out DIR] [--resume]`` runs ``python -m autotune.train`` (through
  ``msrun`` when the layout has more than one worker). ``--steps N`` (or ``AUTOTUNE_STEPS=N``)
  stops after step N, ``--out DIR`` (default ``run/`` beside it) is where metrics, logs and
  checkpoints go, ``--resume`` continues from the latest checkpoint in
  ``DIR/checkpoint/rank_<r>/`` (weights, optimizer state, loss scale and step). It writes
  ``DIR/train_config.json`` (the export's ``train_config.json`` with ``out_dir`` = DIR,
  checkpoints in ``DIR/checkpoint``, the step count when given, and — unless resuming — the
  export's own ``checkpoint/`` as the starting weights when that folder exists, e.g. from
  ``export --reshard``);
- ``bash launch.sh --mindformers MF_DIR [--out DIR] [--load-checkpoint CKPT] [-- ARGS…]`` runs
  MindFormers' ``run_mindformer.py`` from its checkout MF_DIR under ``msrun`` (always: MindFormers
  initialises communication with ``use_parallel``) with ``--config`` this folder's
  ``mindformers.yaml``, ``--run_mode train`` and ``--output_dir DIR``, and ARGS passed through.
  A CPU export passes its folder as ``--register_path`` (autotune's CPU training step is there),
  and one MindFormers cannot run on CPU (tp/pp > 1, the parallel optimizer) refuses to start.
  ``--load-checkpoint CKPT`` adds ``--load_checkpoint CKPT --src_strategy_path_or_dir
  <this folder>/strategy.ckpt --auto_trans_ckpt True``: MindFormers reshards CKPT, laid out as
  this export, into its own layout. It refuses to start while ``mindformers.yaml`` still names no
  ``base_config``. Every path is made absolute where the script runs, so the folder can be copied
  anywhere (e.g. to a cluster);
- reads ``MASTER_ADDR`` (node 0's address: required when the job spans several nodes, else
  127.0.0.1), ``MASTER_PORT`` (default 8118), ``NODE_RANK`` (0..nodes-1, required on several
  nodes) and ``LOG_DIR`` (default ``DIR/logs``); bad arguments or environment exit 2 before
  anything is written;
- expects ``python`` on PATH to import MindSpore and ``autotune`` (or MindFormers): msrun starts
  its workers with the literal ``python``.

The msrun options come from :func:`autotune.train.msrun.msrun_args`, as the trials' do. The
header says how the study's trials ran where their program has a line for it
(`autotune.spec.programs.TrialProgram.launch_note`: MindFormers' runs, the line that runs
``mindformers.yaml`` as they ran).
"""

from __future__ import annotations

import json

from autotune.mindformers.config import UNSET_BASE
from autotune.mindformers.cpu_form import on_cpu
from autotune.mindformers.run_settings import run_backend
from autotune.spec.candidate import Candidate
from autotune.spec.mindformers_trial import cpu_refusals
from autotune.spec.programs import program_of
from autotune.spec.specs import Spec
from autotune.train.msrun import MSRUN_DEFAULT_CLUSTER_TIME_OUT_S, msrun_args, node_count

_HEADER = """\
#!/usr/bin/env bash
# autotune export: study {study}, trial {number}: dp={dp} tp={tp} pp={pp} ({workers} workers{nodes_note}).
# Usage: bash launch.sh [--steps N] [--out DIR] [--resume]            autotune's trainer
#        bash launch.sh --mindformers MF_DIR [--out DIR] [--load-checkpoint CKPT] [-- ARGS...]
#   --steps N    stop after step N instead of train.total_steps (or AUTOTUNE_STEPS=N)
#   --out DIR    where the run writes metrics, logs and checkpoints (default: run/ beside this file)
#   --resume     continue from the latest checkpoint in DIR/checkpoint/rank_<r>/
#   --mindformers MF_DIR   run MindFormers' run_mindformer.py (from its checkout MF_DIR) on
#                mindformers.yaml instead; ARGS after -- go to run_mindformer.py
#   --load-checkpoint CKPT (MindFormers) start from CKPT, a checkpoint laid out as this export
#                (rank_<r>/ folders) or a whole one: MindFormers reshards it (auto_trans_ckpt)
# Checkpoints: DIR/checkpoint/rank_<r>/step_<N>.ckpt every train.save_every steps and at the end;
# strategy.ckpt beside this file describes them (mindspore.parallel.transform_checkpoints). A new
# run starts from checkpoint/rank_<r>/ beside this file when that folder exists.
# Environment: MASTER_ADDR ({addr_note}), MASTER_PORT (default 8118),
# NODE_RANK ({rank_note}), LOG_DIR (default DIR/logs).
{trials_ran}set -euo pipefail
{environment}
fail() {{ echo "launch.sh: $*" >&2; exit 2; }}
absolute() {{ if [[ "$1" = /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }}
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
STEPS="${{AUTOTUNE_STEPS:-}}"
OUT="$HERE/run"
RESUME=""
MINDFORMERS=""
LOAD=""
PASS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS="${{2:-}}"; [[ -n "$STEPS" ]] || fail "--steps needs a value"; shift 2 ;;
    --out) [[ -n "${{2:-}}" ]] || fail "--out needs a value"; OUT="$2"; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --mindformers) [[ -n "${{2:-}}" ]] || fail "--mindformers needs MindFormers' folder"; MINDFORMERS="$(absolute "$2")"; shift 2 ;;
    --load-checkpoint) [[ -n "${{2:-}}" ]] || fail "--load-checkpoint needs a path"; LOAD="$(absolute "$2")"; shift 2 ;;
    --) shift; PASS=("$@"); break ;;
    *) fail "unknown argument '$1' (see the usage at the top of this file)" ;;
  esac
done
if [[ -n "$STEPS" && ! "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
  fail "--steps must be a positive integer, got '$STEPS'"
fi
if [[ -n "$MINDFORMERS" ]]; then
{no_mindformers}  [[ -z "$STEPS$RESUME" ]] || fail "--steps and --resume are for autotune's trainer, not --mindformers"
  [[ -f "$MINDFORMERS/run_mindformer.py" ]] || fail "--mindformers $MINDFORMERS: no run_mindformer.py there"
  [[ -z "$LOAD" || -e "$LOAD" ]] || fail "--load-checkpoint $LOAD: no such file or folder"
  if grep -q "{unset_base}" "$HERE/mindformers.yaml"; then
    fail "mindformers.yaml names no base_config yet: set it to your model's MindFormers config, or export with --mindformers-base"
  fi
else
  [[ -z "$LOAD${{PASS[*]}}" ]] || fail "--load-checkpoint and -- ARGS need --mindformers"
fi
{cluster}MASTER_PORT="${{MASTER_PORT:-8118}}"
[[ "$MASTER_PORT" =~ ^[0-9]+$ ]] || fail "MASTER_PORT must be a port number, got '$MASTER_PORT'"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG_DIR="${{LOG_DIR:-$OUT/logs}}"

if [[ -n "$MINDFORMERS" ]]; then
  ARGS=(run_mindformer.py --config "$HERE/mindformers.yaml" --run_mode train --output_dir "$OUT")
{register}  if [[ -n "$LOAD" ]]; then
    # strategy.ckpt describes a checkpoint laid out as this export: MindFormers reshards it.
    ARGS+=(--load_checkpoint "$LOAD" --src_strategy_path_or_dir "$HERE/strategy.ckpt" --auto_trans_ckpt True)
  fi
  # MindFormers' own configs name files relative to its checkout.
  cd "$MINDFORMERS"
  exec msrun \\
{msrun}    "${{ARGS[@]}}" "${{PASS[@]}}"
fi

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

_SINGLE_NODE = """\
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
NODE_RANK="${NODE_RANK:-0}"
[[ "$NODE_RANK" == 0 ]] || fail "NODE_RANK must be 0 on this one-node job, got '$NODE_RANK'"
"""

# Several nodes: each must reach node 0's scheduler. A default of 127.0.0.1 would make every
# node start its own scheduler and wait out the cluster timeout (docs/export.md, "msrun").
_MULTI_NODE = """\
[[ -n "${{MASTER_ADDR:-}}" ]] || fail "set MASTER_ADDR to node 0's address on every node of this {nodes}-node job"
[[ "${{NODE_RANK:-}}" =~ ^[0-9]+$ && "${{NODE_RANK}}" -lt {nodes} ]] || fail "set NODE_RANK to this node's number (0..{last}) on every node"
"""


def _shell_words(args: list[str]) -> str:
    """msrun's options as script lines, each one double-quoted word (``$VAR`` expands in it)."""
    for arg in args:
        if any(ch in arg for ch in '"`\\'):
            raise ValueError(f"launch.sh: cannot quote {arg!r}")
    return "".join(f'    "{arg}" \\\n' for arg in args)


def launch_script(spec: Spec, c: Candidate, trial: dict) -> str:
    workers = c.devices
    local = min(spec.cluster.devices_per_node, workers)
    nodes = node_count(workers, local)
    cluster = _SINGLE_NODE if nodes == 1 else _MULTI_NODE.format(nodes=nodes, last=nodes - 1)
    # Pinning each worker to its cores keeps CPU step times steady (docs/export.md, "msrun");
    # worker 0's log goes to the console of node 0; nodes started minutes apart still join
    # (msrun's own cluster timeout, not the trials' shorter one).
    backend = run_backend(spec)
    options = msrun_args(
        workers,
        local,
        master_addr="$MASTER_ADDR",
        master_port="$MASTER_PORT",
        node_rank="$NODE_RANK",
        log_dir="$LOG_DIR",
        cluster_time_out=MSRUN_DEFAULT_CLUSTER_TIME_OUT_S,
        bind_core=backend.pins_cores,
        tail_worker=0,
    )
    msrun = _shell_words(options)
    refusal = backend.no_mindformers
    if backend.mindformers_cpu_form and cpu_refusals(c):
        refusal = "MindFormers cannot run this export on CPU: " + "; ".join(cpu_refusals(c))
    script = _HEADER.format(
        study=json.dumps(str(trial["study"])),
        number=trial["number"],
        dp=c.dp,
        tp=c.tp,
        pp=c.pp,
        workers=workers,
        nodes_note=f" on {nodes} nodes" if nodes > 1 else "",
        addr_note="node 0's address, required" if nodes > 1 else "default 127.0.0.1",
        rank_note=f"0..{nodes - 1}, required" if nodes > 1 else "0",
        unset_base=UNSET_BASE,
        cluster=cluster,
        msrun=msrun,
        environment="".join(f"export {name}={value}\n" for name, value in backend.environment),
        trials_ran=program_of(spec).launch_note(spec),
        no_mindformers=f'  fail "--mindformers: {refusal}"\n' if refusal else "",
        # autotune's CPU training step, beside mindformers.yaml (autotune.mindformers.cpu_form)
        register='  ARGS+=(--register_path "$HERE")\n' if on_cpu(spec, c) else "",
    )
    if workers == 1:
        return script + 'exec python -m autotune.train "$CONFIG"\n'
    return script + "exec msrun \\\n" + msrun + '    python -m autotune.train "$CONFIG"\n'
