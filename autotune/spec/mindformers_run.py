"""How MindFormers runs a config's llama: sequence parallelism, the token table under the parallel
optimizer, and recompute layer by layer (``autotune init --mindformers``, docs/mindformers.md).

Contract: :func:`read_run` appends to ``reading.model`` the rows ``sequence_parallel``,
``embedding_parallel_optimizer`` and ``recompute_layers`` (each only when it is not the default)
and returns the ``recompute`` knob of the baseline. Every value is what MindFormers runs:

- ``parallel_config.use_seq_parallel`` (legacy llama and mcore layers split the norms over the
  sequence under model parallelism); on a backend that runs autotune's trial, one warning: the
  trial does not;
- the token table joins the parallel optimizer's sharding when the legacy llama's
  ``model_config.parallel_optimizer`` says so (``LlamaEmbedding(parallel_optimizer=…)``, default
  False; MindSpore's ``SplitParam`` skips a parameter created with ``parallel_optimizer=False``);
  the mcore ``VocabParallelEmbedding`` sets no such flag, so it always does;
- ``recompute_config.recompute``, ``select_recompute`` and ``select_comm_recompute`` by layer
  (`autotune.spec.mindformers_layers`, under the layout MindFormers runs: its pipeline stages,
  ``pp_interleave_num``, ``offset``): the knob is ``full`` when some layer is recomputed whole,
  else ``selective`` when some layer gets the selective patterns, else ``none``; the layers are
  written where the lists mark some only (`autotune.layout.layer_recompute` reads them). A
  pattern other than MindFormers' defaults is one warning (priced as the defaults); the exclude
  lists are not represented (a warning: the export keeps them).
"""

from __future__ import annotations

from autotune.spec.backends import backend_of
from autotune.spec.mindformers_layers import chunks, layer_marks

MC = "model.model_config"
# MindFormers' LayerSetting default patterns (mindformers/models/utils.py at 15218ea4), as a
# config spells them or without the escapes
DEFAULT_PATTERNS = {
    "select_recompute": (r"feed_forward\.mul", r"feed_forward\.w1\.activation\.silu"),
    "select_comm_recompute": (r".*\.norm",),
}


def _is_default(key: str, patterns) -> bool:
    if patterns is None:
        return True
    wanted = DEFAULT_PATTERNS.get(key, ())
    return sorted(p.replace("\\", "") for p in patterns) == sorted(
        p.replace("\\", "") for p in wanted
    )


def read_run(cfg, r, pp: int) -> str:
    """Append the run's model rows to ``r`` and return the baseline's recompute knob (see the
    module doc); ``pp``: the pipeline stages MindFormers runs the config with."""
    if cfg.get("parallel_config.use_seq_parallel") is True:
        r.model.append(("sequence_parallel", True, "parallel_config.use_seq_parallel"))
        backend = next(v for k, v, _ in r.cluster if k == "backend")
        if backend_of(backend).kind != "estimate":
            r.warnings.append(
                "parallel_config.use_seq_parallel: True: model.sequence_parallel; "
                "autotune's trial keeps activations whole between layers, and its "
                "estimate says so (a simulate study prices MindSpore's run)"
            )
    if cfg.get("use_legacy", True) is False:
        r.model.append(
            (
                "embedding_parallel_optimizer",
                True,
                "mcore VocabParallelEmbedding: sharded by the parallel optimizer like any weight",
            )
        )
    elif cfg.get(f"{MC}.parallel_optimizer") is True:
        r.model.append(("embedding_parallel_optimizer", True, f"{MC}.parallel_optimizer"))
    keys = ("recompute", "select_recompute", "select_comm_recompute")
    values = {key: cfg.get(f"recompute_config.{key}") for key in keys}
    layout = None
    if any(isinstance(v, (list, dict)) for v in values.values()):  # per-stage: the run's layout
        layers = next(v for k, v, _ in r.model if k == "num_layers")
        layout = chunks(
            layers, pp, cfg.get(f"{MC}.pp_interleave_num", 1) or 1, cfg.get(f"{MC}.offset", 0)
        )
    marks, sources = {}, []
    for key, value in values.items():
        marked, patterns = layer_marks(value, layout, f"recompute_config.{key}")
        if not _is_default(key, patterns):
            r.warnings.append(
                f"recompute_config.{key}: {value}: patterns other than MindFormers' "
                f"defaults ({', '.join(DEFAULT_PATTERNS.get(key, ()))}) are priced "
                "and run as the defaults"
            )
        if marked is not None:
            layers = next(v for k, v, _ in r.model if k == "num_layers")
            marks[key] = True if marked is True or len(marked) == layers else marked
            sources.append(f"recompute_config.{key}")
    for key in ("select_recompute_exclude", "select_comm_recompute_exclude"):
        if cfg.get(f"recompute_config.{key}"):
            r.warnings.append(
                f"recompute_config.{key}: {cfg.get(f'recompute_config.{key}')}: not "
                "represented (priced and run without it); the export keeps it, "
                "re-derived for the tuned pipeline stages"
            )
    knob = (
        "full"
        if marks.get("recompute")
        else "selective"
        if marks.get("select_recompute")
        else "none"
    )
    # the knob says "every layer"; keep what refines it (layout.layer_recompute)
    if marks.get("recompute") is True:
        marks.pop("recompute")
        marks.pop("select_recompute", None)  # every layer is recomputed whole
    if knob == "selective" and marks.get("select_recompute") is True:
        marks.pop("select_recompute")
    if marks:
        r.model.append(
            (
                "recompute_layers",
                marks,
                ", ".join(sources) + " (layers marked under "
                f"pipeline_stage {pp}; the recompute knob applies to these)",
            )
        )
    return knob
