"""DualPipe, the bidirectional pipeline schedule of DeepSeek-V3's pre-training (DeepSeek-V3
technical report §3.2.1, Table 2), as the cost model prices it.

Contract: :func:`dualpipe` says whether a candidate runs it — the model states it
(``model.pipeline_schedule: dualpipe``), the engine is ``"megatron"`` (the one that prices
published GPU runs; neither autotune's trainer nor MindSpore runs it: the estimate's "not
modelled" says so) and pp is even. Then rank r runs stage r for half the micro-batches (one
direction) and stage pp − 1 − r for the other half, so:

- its pace is the mean of the two stages' micro-batch times (:func:`paired`): a heavy last
  stage (the head, an MTP module) shares its rank with the first;
- the bubble is (pp/2 − 1)·(F&B + B − 3W) (Table 2) instead of 1F1B's (pp − 1)·(F + B): with a
  micro-batch's time T = F + B, B = 2F (backward twice the forward), W = B/2 (the weights'
  half of it) and F&B = F + B (a forward and a backward chunk overlapped take both), that is
  (pp/2 − 1)·(2/3)·T — an assumption on top of the report's formula;
- a rank holds both stages' parameters, gradients and optimizer states (the report's "two
  copies of the parameters") and (pp + 1)/2 in-flight micro-batches of each stage's activations
  (Table 2: pp + 1 micro-batches' activations, half in each direction).
"""

from __future__ import annotations

# (F&B + B − 3W) over (F + B) with F = T/3, B = 2T/3, W = T/3, F&B = T: see the module doc
BUBBLE_SHARE = 2 / 3


def dualpipe(work, c, engine: str) -> bool:
    """Whether ``c`` runs DualPipe (see the module doc)."""
    return work.dualpipe and engine == "megatron" and c.pp > 1 and c.pp % 2 == 0


def paired(first: dict, second: dict) -> dict:
    """A rank's mean of two stages' parts (seconds per micro-batch)."""
    return {part: (first[part] + second[part]) / 2 for part in first}


def bubble(pp: int, pace: float) -> float:
    """The bubble of a step whose micro-batch takes ``pace`` seconds on the slowest rank."""
    return (pp / 2 - 1) * BUBBLE_SHARE * pace


def in_flight(pp: int) -> float:
    """Micro-batches of each of its two stages a rank keeps activations of."""
    return (pp + 1) / 2


def rank_memory(first: dict, second: dict) -> dict:
    """A rank's memory (GiB by part) from the two stages it runs: everything of both but the
    runtime overhead, once."""
    return {
        part: max(first[part], second[part]) if part == "overhead" else first[part] + second[part]
        for part in first
    }
