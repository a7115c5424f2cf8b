"""The MindSpore program a trial executes (``python -m autotune.train CONFIG_JSON``).

Run directly for one process (dp = 1), or under msrun for dp processes — msrun needs a script
path, `PROGRAM_PATH`::

    msrun --worker_num=DP --local_worker_num=DP --master_port=P --log_dir=D --join=True \\
          <PROGRAM_PATH> CONFIG_JSON

with PYTHONPATH set to the project root. CONFIG_JSON is the driver's trial config: ``study``,
``trial_number``, ``backend``, ``seed``, ``out_dir``, ``model`` (family or entry, sizes, dtype),
``train`` (global_batch_size, learning_rate, total_steps), ``trial`` (steps, measure_after; optional
``underflow_probe``: ``auto``, the default, or ``always``, `autotune.train.step.probe`) and
``knobs`` (dp, tp, pp, micro_batches, fusion_mb, grad_accum, loss_scale, warmup_steps,
jit_level, recompute). Outputs and exit codes: `autotune.train.program`,
`autotune.train.metrics`, and ``__main__``. The user-model contract: `autotune.train.models.entry`.

What a failed run says on stderr (read by `autotune.execution.classify`): once the launch is done — the
processes joined the cluster (``communication.init``), groups made — each rank prints one line
starting with `CANDIDATE_STARTED`; a failure ends with the one-line verdict
``autotune.train: <ExceptionType>: <message>``, which starts with `LAUNCH_FAILED` when the
launch itself failed (the candidate's own code never ran).

Inside: the program, its config and its metrics at the top (`program`, `config`, `metrics`,
`checkpoint`, `knob_hooks`, `msrun`); `models` (what a rank trains: the networks by family, a
user's entry, weights, data), `parallel` (a rank's part of the layout on explicit collectives),
`step` (the training step and what it is built from) and `runtime` (the process around it:
session, device, compile cache, warm workers).

Importing this package does not import MindSpore. The package is what runs on the training
cluster — trials and exported runs — plus the msrun command line they are launched with
(`autotune.train.msrun`); it imports of autotune only `autotune.layout`, `autotune.families`,
`autotune.procfs`, `autotune.files` and the spec's `knobs`, `backends` and `entry` (never Optuna
or Ray).
"""

import os

PROGRAM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
VERDICT = "autotune.train:"  # the program's last word on stderr
LAUNCH_FAILED = "autotune.train: LaunchError:"  # ... when the launch failed, not the candidate
# ... when the program refused the candidate at start-up, before training (a MindFormers trial:
# `autotune.mindformers`): the candidate's `infeasible`
REFUSED = "autotune.train: Refused:"
CANDIDATE_STARTED = "autotune.train running the candidate"  # launch done (not a verdict)
NODE_VARIABLE = "AUTOTUNE_NODE"  # a trial's node index, set for each node of one that spans several

__all__ = [
    "CANDIDATE_STARTED",
    "LAUNCH_FAILED",
    "NODE_VARIABLE",
    "PROGRAM_PATH",
    "REFUSED",
    "VERDICT",
]
