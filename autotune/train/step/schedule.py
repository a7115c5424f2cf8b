"""Learning rate: linear warmup, then cosine decay (MindFormers' ``CosineWithWarmUpLR`` shape).

``lr(s) = lr_max · (s+1) / warmup``                                   for s < warmup
``lr(s) = lr_end + (lr_max − lr_end) · ½ (1 + cos(π · min(1, (s − warmup) / (total − warmup))))``  after

``s`` is the optimizer's step count (steps skipped by the loss scaler do not advance it). The
first warmup step already has a non-zero rate, so no step is wasted.

A trial runs only ``trial.steps`` of a ``train.total_steps`` run, so it trains on the real
schedule *compressed* onto the trial: warmup = round(warmup_steps · steps / total_steps) trial
steps, then cosine to the end of the trial (`trial_schedule`). The same class with the full-length
values is what an exported training job uses.
"""

import math

import mindspore as ms
from mindspore import ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from autotune.spec.knobs import trial_warmup


def warmup_cosine(step, learning_rate, warmup_steps, total_steps, end_learning_rate=0.0):
    """The schedule's value at ``step`` in plain Python (reference for tests and reports)."""
    if step < warmup_steps:
        return learning_rate * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return end_learning_rate + (learning_rate - end_learning_rate) * 0.5 * (
        1.0 + math.cos(math.pi * progress)
    )


def trial_schedule(warmup_steps, total_steps, trial_steps):
    """``(warmup, total)`` of the run's schedule compressed onto a ``trial_steps`` trial."""
    return trial_warmup(warmup_steps, total_steps, trial_steps), trial_steps


class WarmupCosineLR(LearningRateSchedule):
    """`warmup_cosine` as a MindSpore schedule for an optimizer's ``learning_rate``.

    Its numbers are Parameters (``lr_schedule.*``, not trained, not checkpointed), not
    constants of the graph: candidates that differ only in the warmup, the learning rate or the
    run's length compile the same graph, which the compile cache may then reuse
    (`autotune.train.runtime.compile_cache`)."""

    def __init__(self, learning_rate, warmup_steps, total_steps, end_learning_rate=0.0):
        super().__init__()
        if learning_rate <= 0 or warmup_steps < 0 or total_steps < 1:
            raise ValueError(
                "WarmupCosineLR: need learning_rate > 0, warmup_steps >= 0, total_steps >= 1"
            )

        def number(name, value):
            return ms.Parameter(
                ms.Tensor(float(value), ms.float32), name=f"lr_schedule.{name}", requires_grad=False
            )

        self.lr_max = number("lr_max", learning_rate)
        self.lr_end = number("lr_end", end_learning_rate)
        self.warmup = number("warmup", warmup_steps)
        self.decay = number("decay", max(1, total_steps - warmup_steps))

    def construct(self, global_step):
        step = ops.cast(global_step, ms.float32).reshape(())
        warm = self.lr_max * (step + 1.0) / ops.maximum(self.warmup, 1.0)
        progress = ops.clamp((step - self.warmup) / self.decay, 0.0, 1.0)
        cosine = self.lr_end + (self.lr_max - self.lr_end) * 0.5 * (
            1.0 + ops.cos(progress * math.pi)
        )
        return ops.select(step < self.warmup, warm, cosine)
