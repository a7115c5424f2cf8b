"""The tuned run's settings that launch.yaml and mindformers.yaml state alike.

Contract: pure functions of the spec and a candidate: the backend the run executes on
(:func:`run_backend`), the per-device batch, the parallel optimizer's keys, the loss scaler's
arguments and whether the dtype is loss-scaled, and MindSpore's integer context modes. They live
here, below both `autotune.export` (launch.yaml) and `autotune.mindformers.config`
(mindformers.yaml, which a MindFormers trial runs too: `autotune.execution` builds it).
"""

from __future__ import annotations

from autotune.costmodel import resolve_profile
from autotune.layout import OPTIMIZER_SHARD_THRESHOLD_KB
from autotune.spec.backends import Backend, backend_of
from autotune.spec.candidate import Candidate
from autotune.spec.knobs import LOSS_SCALED_DTYPES, SCALE_WINDOW, micro_steps
from autotune.spec.specs import Spec

# The dynamic loss scaler's fixed arguments (the searched knob is the initial value only; the
# window is the trial program's own, `autotune.spec.knobs.SCALE_WINDOW`).
SCALE_FACTOR = 2
# mindspore.set_context(mode=...) takes the integer: GRAPH_MODE = 0, PYNATIVE_MODE = 1.
GRAPH_MODE, PYNATIVE_MODE = 0, 1


def run_backend(spec: Spec) -> Backend:
    """The backend the exported run executes on: a simulated or replayed study targets its
    device profile's kind (``cpu``, ``gpu``, ``ascend``: `autotune.costmodel.resolve_profile`)."""
    if backend_of(spec.cluster.backend).runs_program:
        return backend_of(spec.cluster.backend)
    return backend_of(resolve_profile(spec.cluster).kind)


def micro_batch_size(spec: Spec, c: Candidate) -> int:
    """Samples per device per forward pass (per micro-batch with pipeline stages)."""
    splits = micro_steps(pp=c.pp, micro_batches=c.micro_batches, grad_accum=c.grad_accum)
    return spec.train.global_batch_size // (c.dp * splits)


def parallel_optimizer(c: Candidate) -> dict:
    """The parallel-optimizer keys of MindSpore's auto-parallel context (MindFormers' ``parallel``
    section has the same): on with the threshold the trials ran (MindSpore's default), or off."""
    keys = {"enable_parallel_optimizer": c.parallel_optimizer}
    if c.parallel_optimizer:
        keys["parallel_optimizer_config"] = {
            "parallel_optimizer_threshold": OPTIMIZER_SHARD_THRESHOLD_KB
        }
    return keys


def loss_scale_cell(c: Candidate) -> dict:
    """``DynamicLossScaleUpdateCell``'s arguments for the tuned initial scale."""
    return {
        "loss_scale_value": c.loss_scale,
        "scale_factor": SCALE_FACTOR,
        "scale_window": SCALE_WINDOW,
    }


def loss_scaled(spec: Spec) -> bool:
    """Whether the run scales its loss: only float16 can overflow (knobs.LOSS_SCALED_DTYPES)."""
    return spec.model.dtype in LOSS_SCALED_DTYPES
