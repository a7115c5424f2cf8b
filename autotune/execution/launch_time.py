"""Where a trial's time went: the parts the trial program measured, and the two only its
launcher sees.

Contract: :func:`with_launch_and_teardown` turns the program's metrics (``started_at`` and
``finished_at``, epoch seconds of rank 0: `autotune.train.metrics`) into ``launch_s`` (the
launcher handed the trial over → the trial started in its process: a process started, msrun's
workers spawned, or a worker that stays up took it) and ``teardown_s`` (outputs written → the
launcher saw the trial end: the processes gone, or every rank done and ready for the next
trial). Both clocks are the same host's: rank 0 runs on the node that launches it.
The parts in order: `autotune.jobs.TIME_PARTS`.
"""

from __future__ import annotations


def with_launch_and_teardown(metrics: dict, handed_over: float, ended: float) -> dict:
    """``metrics`` with ``started_at``/``finished_at`` replaced by ``launch_s``/``teardown_s``
    (epoch seconds ``handed_over`` and ``ended`` are the launcher's); unchanged without them."""
    metrics = dict(metrics)
    started, finished = metrics.pop("started_at", None), metrics.pop("finished_at", None)
    if started is not None:
        metrics["launch_s"] = max(0.0, started - handed_over)
    if finished is not None:
        metrics["teardown_s"] = max(0.0, ended - finished)
    return metrics
