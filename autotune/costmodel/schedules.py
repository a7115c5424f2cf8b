"""The pipeline schedules beside 1F1B, as the cost model prices them: DualPipe, the
bidirectional schedule of DeepSeek-V3's pre-training (DeepSeek-V3 technical report §3.2.1,
Table 2), and the interleaved 1F1B of Megatron's virtual pipeline (Narayanan et al. 2021 §2.2.2).

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

:func:`chunks` says how many chunks of layers each stage runs interleaved — v, where the model
states ``model.pipeline_interleave: v`` > 1, the engine is ``"megatron"`` and pp > 1, else 1
(MindFormers' ``pp_interleave_num`` is dropped by init: its trial runs plain stages). Each stage
then holds v chunks of L / (pp·v) layers, chunk j on stage j mod pp, and a micro-batch goes
round the pipeline v times:

- the bubble is (pp − 1)·T / v instead of (pp − 1)·T (Narayanan et al. 2021 §2.2.2: each
  warm-up and drain slot is one chunk's forward and backward, T / v);
- each micro-batch crosses v times as many stage boundaries, the last stage's to the first
  among them (the pipeline messages × v), sent while the chunks compute: Megatron overlaps
  them under the interleaved schedule by default (``overlap_p2p_comm``, which
  ``--no-overlap-p2p-communication`` turns off), so only what outlasts a micro-batch's
  kernels is exposed (:func:`exposed_sends`);
- rank r keeps (pp − r − 1)·2 + (v − 1)·pp + 1 chunks' activations in flight, Megatron-Core's
  warm-up count of its interleaved schedule plus the one in its backward, at most all of the
  step's (:func:`in_flight`; rank 0: pp·(1 + (pp − 1)/(pp·v)) micro-batches' worth of a stage,
  Korthikanti et al. 2022 §4.2.3's factor).
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


def in_flight(pp: int, stage: int = 0, v: int = 1, n_micro: int = 0) -> float:
    """Micro-batches' worth of its stage's activations a rank keeps: under DualPipe (v = 1) of
    each of its two stages; interleaved (v chunks) rank ``stage``'s, of ``n_micro``."""
    if v == 1:
        return (pp + 1) / 2
    chunks = (pp - stage - 1) * 2 + (v - 1) * pp + 1
    return min(chunks, n_micro * v) / v


def chunks(work, c, engine: str) -> int:
    """The chunks each stage of ``c`` runs interleaved (see the module doc)."""
    return work.interleave if engine == "megatron" and c.pp > 1 else 1


def exposed_sends(sends: float, busy: float) -> float:
    """Seconds of a micro-batch's pipeline sends left over after ``busy`` seconds of its
    chunks' kernels, which they overlap."""
    return max(0.0, sends - busy)


def bubble_1f1b(pp: int, pace: float, v: int = 1) -> float:
    """1F1B's bubble, interleaved over ``v`` chunks: (pp − 1)·T / v."""
    return (pp - 1) * pace / v


def rank_memory(first: dict, second: dict) -> dict:
    """A rank's memory (GiB by part) from the two stages it runs: everything of both but the
    runtime overhead, once."""
    return {
        part: max(first[part], second[part]) if part == "overhead" else first[part] + second[part]
        for part in first
    }
