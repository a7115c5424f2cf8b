"""The cost model's workload of a spec's model: its family's per-sample costs.

Contract: :func:`workload_for` turns a spec's ``model`` section into its family's
`autotune.families.workload.Workload` (the formulas are there), or returns ``None`` when the
section lacks the dimensions to price it (an ``entry`` model that gives none). An ``entry``
model that gives the transformer dimensions is priced as the built-in transformer.
"""

from __future__ import annotations

from autotune.families import family
from autotune.families.workload import Workload, dimensions


def workload_for(
    model, fused_attention: bool = False, sequence_parallel: bool = False
) -> Workload | None:
    """The :class:`Workload` of a spec's ``model`` section, or ``None`` if it has no dimensions.
    ``fused_attention``: the device runs the model's attention fused; ``sequence_parallel``: the
    run splits the llama's norms over the sequence (`autotune.families.workload`)."""
    if any(d is None for d in dimensions(model)):
        return None
    return family(model.family or "transformer").workload.of(
        model, fused_attention, sequence_parallel
    )
