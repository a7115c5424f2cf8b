"""The loss MindFormers means: which rank holds it, and what the training cell's output is divided by.

Contract: pure functions of a trial's merged MindFormers config (``trial.yaml`` as a dict),
read as MindFormers 1.9.0 reads it (its source, site-packages/mindformers/):

- :func:`loss_divisor`: the training cell returns the *sum* of its micro-batches' losses —
  MindSpore's ``PipelineCell``, ``GradAccumulationCell`` and ``MicroBatchInterleaved`` add
  their outputs (``nn/wrap/cell_wrapper.py``) — and MindFormers' own loss monitor divides it
  back (``core/callback/callback.py``, ``MFLossMonitor._fix_loss_for_parallel``): by
  ``parallel_config.micro_batch_num`` with pipeline stages, by ``micro_batch_interleave_num``,
  and by ``runner_config.gradient_accumulation_steps``; the first and the last not under
  ``calculate_per_token_loss`` (the cell divides by the token count itself). The counts are
  those MindFormers runs with: accumulation only under semi-auto or auto parallel and without
  pipeline stages (``trainer/base_trainer.py``, ``_check_grad_accumulation_steps`` resets it to
  1 otherwise), micro-batches only with pipeline stages (the cell is a ``PipelineCell`` then).
- :func:`loss_rank`: the rank whose loss that is. Under data parallelism (``parallel_mode`` 0)
  every rank's is its own shard's (None: the mean of all); under semi-auto parallel the last
  rank's ("pipeline stages: N > 1, the loss on the last card is valid", the same monitor; with
  one stage every rank holds the global loss) — rank 0's under ``pipeline_scheduler:
  zero_bubble_v`` ("When zero_bubble_v is enabled, loss is valid only on rank 0").
"""

from __future__ import annotations

SEMI_AUTO_MODES = (1, 2)  # MindFormers' parallel_mode codes: 0 data, 1 semi-auto, 2 auto
ZERO_BUBBLE_V = "zero_bubble_v"


def _get(config: dict, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _semi_auto(config: dict) -> bool:
    return _get(config, "parallel.parallel_mode", 0) in SEMI_AUTO_MODES


def loss_divisor(config: dict) -> int:
    """What MindFormers divides the training cell's loss by (see the module doc)."""
    per_token = bool(config.get("calculate_per_token_loss"))
    stages = _get(config, "parallel_config.pipeline_stage", 1) if _semi_auto(config) else 1
    divisor = _get(config, "micro_batch_interleave_num", 1)
    if stages > 1 and not per_token:
        divisor *= _get(config, "parallel_config.micro_batch_num", 1)
    accumulation = _get(config, "runner_config.gradient_accumulation_steps", 1)
    if _semi_auto(config) and stages == 1 and accumulation > 1 and not per_token:
        divisor *= accumulation
    return divisor


def loss_rank(config: dict, ranks: int) -> int | None:
    """The rank of ``ranks`` whose loss MindFormers names the global batch's (see the module
    doc); None: every rank's, averaged."""
    if not _semi_auto(config):
        return None
    if _get(config, "parallel.pipeline_config.pipeline_scheduler") == ZERO_BUBBLE_V:
        return 0
    return ranks - 1
