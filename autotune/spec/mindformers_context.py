"""The Ulysses group of a MindFormers config's context parallelism, as its attention splits it.

Contract: :func:`ulysses_degree` is how many of a config's ``context_parallel`` ranks split the
attention heads (the knob ``ulysses``), read as MindFormers 1.9 reads it:

- the legacy llama (``TransformerOpParallelConfig.get_ulysses_cp_num``): ``colossalai_cp`` (the
  default) none, ``ulysses_cp`` all of cp, ``hybrid_cp`` (also its old spelling ``hybird_cp``)
  ``ulysses_degree_in_cp``;
- an mcore model (``use_legacy: False``): ``ulysses_degree_in_cp`` whatever the algorithm — its
  converter maps the degree to ``hierarchical_context_parallel_sizes``, which its attention
  splits the heads by (``parallel_core/transformer_config_utils.py``,
  ``training_graph/transformer/attention.py``).

With cp 1 there is no group (1).
"""

from __future__ import annotations

from autotune.spec.mindformers_file import is_mcore

HYBRID = ("hybrid_cp", "hybird_cp")


def ulysses_degree(config: dict, cp: int) -> int:
    """The Ulysses degree of ``config`` (a merged MindFormers config) at ``cp`` ranks."""
    parallel = config.get("parallel_config") or {}
    degree = parallel.get("ulysses_degree_in_cp") or 1
    if cp == 1:
        return 1
    if is_mcore(config):
        return degree
    algo = parallel.get("context_parallel_algo") or "colossalai_cp"
    return cp if algo == "ulysses_cp" else degree if algo in HYBRID else 1
