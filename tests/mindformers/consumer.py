"""MindFormers itself reading configs: run in the MindFormers venv (make mindformers), not autotune's.

``python consumer.py JOBS.json`` prints one JSON object with, for each job of JOBS.json:

- ``{"read": PATH}``: ``MindFormerConfig._file2dict(PATH)`` (the base_config chain merged, nothing
  else) as ``raw``, and ``template``: null, or the error ``MindFormerConfig(PATH)`` raises when it
  applies its section templates (``ConfigTemplate.apply_template``: unexpected keys, …);
- ``{"layers": PATH}``: MindFormers' ``build_parallel_config`` and ``LayerSetting`` (the code
  every legacy llama and mcore block runs at construction) over the config — for an mcore config
  (``use_legacy: False``) its mcore branch over the ``TransformerConfig`` the model is built with
  (``num_hidden_layers`` as ``num_layers``, the parallel config handed in): ``layer_list``, the
  formatted full-recompute, select_recompute and select_comm_recompute counts per stage, the
  stage of each layer (``pp_ids``; the pipeline context set from the config's ``parallel``
  section first, as a run sets it, so an interleaved pipeline deals its chunks), or the error;
- ``{"batch": PATH}``: the global batch and per-rank batch MindFormers' trainer computes
  (``BaseTrainer._check_grad_accumulation_steps`` and ``_check_global_batch_size_for_auto_parallel``)
  with the auto-parallel context the config's ``parallel`` section sets and ``device_num`` ranks;
- ``{"ulysses": PATH}``: the Ulysses degree each of MindFormers' paths takes from the config's
  ``parallel_config``: the legacy llama's (``build_parallel_config``, then
  ``get_ulysses_cp_num``) and mcore's (``get_cp_comm_type`` of its algorithm, which the
  converter runs, then ``ulysses_degree_in_cp``, which becomes
  ``hierarchical_context_parallel_sizes``), each a number or the error MindFormers raises;
- ``{"model": PATH}``: the model config MindFormers builds for an mcore config (``use_legacy:
  False``) — ``get_model_config`` over ``model`` as the trainer hands it (``pretrained_model_dir``
  copied in, ``models/build_config.py``: its ``config.json`` under the YAML), its class, its
  attributes (``config``) and the ``TransformerConfig`` it converts to (``transformer``),
  whether the type's training model passes ``qk_layernorm=True`` (``qk_layernorm_built``), and
  the error of the stricter conversion its weight template runs once the network is built
  (``transformer_config_utils.convert_to_transformer_config``: a key it does not know is an
  error there), null when it accepts the config (``strict``).
- ``{"network": PATH}``: the training model MindFormers builds for an mcore config (its type's
  ``Training*`` class over ``get_model_config``, stand-alone on this CPU: construction runs no
  kernel), as ``class`` and ``parameters``: ``[Parameter.name, shape]`` in the network's order,
  the names its checkpoints hold; ``frozen``, those not trained (``requires_grad=False``), and
  ``whole``, those the parallel optimizer leaves whole (``parallel_optimizer=False``).

It imports autotune nothing: the test compares what MindFormers says with what autotune wrote.
"""

import json
import sys
import traceback


def _read(path):
    from mindformers.tools.register import MindFormerConfig

    raw = MindFormerConfig._file2dict(path)
    try:
        MindFormerConfig(path)
        template = None
    except Exception as exc:  # what MindFormers says is the answer
        template = f"{type(exc).__name__}: {exc}"
    return {"raw": raw, "template": template}


def _layers(path):
    import mindspore as ms
    from mindformers.core.parallel_config import build_parallel_config
    from mindformers.parallel_core.training_graph.transformer import utils
    from mindformers.tools.register import MindFormerConfig

    cfg = MindFormerConfig(path)
    build_parallel_config(cfg)
    # LayerSetting asks MindSpore's context whether the pipeline interleaves: set it from the
    # config's parallel section, as the run's ParallelOperator does
    ms.reset_auto_parallel_context()
    pipeline = (cfg.parallel or {}).get("pipeline_config")
    if pipeline:
        ms.set_auto_parallel_context(pipeline_config=dict(pipeline))
    # without a run's context MindFormers takes every model for legacy; an mcore one takes
    # LayerSetting's other branch, as its run does
    mcore = cfg.use_legacy is False
    utils.is_legacy_model = lambda: not mcore
    try:
        if mcore:  # TransformerBlock's call, over the TransformerConfig the trainer builds
            t = _transformer(cfg)
            setting = utils.LayerSetting(t.num_layers, t.offset, t,
                                         t.virtual_pipeline_model_parallel_size)
        else:  # the legacy llama's (models/llama/llama.py)
            mc = cfg.model.model_config
            setting = utils.LayerSetting(mc.num_layers, mc.offset or 0, cfg.parallel_config,
                                         mc.pp_interleave_num or 1)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"layer_list": setting.layer_list.tolist(),
            "pp_ids": [int(stage) for stage in setting.pp_ids],
            "recompute": [list(map(int, row)) for row in setting.layer_recompute],
            "select_recompute": {k: [list(map(int, row)) for row in v]
                                 for k, v in setting.select_recompute.items()},
            "select_comm_recompute": {k: [list(map(int, row)) for row in v]
                                      for k, v in setting.select_comm_recompute.items()}}


def _ulysses(path):
    from mindformers.core.parallel_config import build_parallel_config
    from mindformers.parallel_core.transformer_config_utils import get_cp_comm_type
    from mindformers.tools.register import MindFormerConfig

    parallel = MindFormerConfig._file2dict(path).get("parallel_config") or {}
    out = {}
    try:
        cfg = MindFormerConfig(path)
        build_parallel_config(cfg)
        out["legacy"] = cfg.parallel_config.get_ulysses_cp_num()
    except Exception as exc:  # what MindFormers says is the answer
        out["legacy"] = f"{type(exc).__name__}: {exc}"
    try:
        get_cp_comm_type(parallel.get("context_parallel_algo", "colossalai_cp"))
        out["mcore"] = parallel.get("ulysses_degree_in_cp", 1)
    except Exception as exc:
        out["mcore"] = f"{type(exc).__name__}: {exc}"
    return out


def _transformer(cfg):
    """The TransformerConfig an mcore model is built with: its model config with the built
    parallel config handed in, as the trainer's create_network(default_args=...) does."""
    from mindformers.models.build_config import get_model_config
    from mindformers.tools.register import register

    register.is_legacy_model = lambda: False
    import mindformers  # noqa: F401  (registers every model type)

    if cfg.get("pretrained_model_dir"):
        cfg.model.pretrained_model_dir = cfg.pretrained_model_dir
    cfg.model.model_config.parallel_config = cfg.parallel_config
    return get_model_config(cfg.model).convert_to_transformer_config()


class _Trainer:
    """The attributes BaseTrainer's two batch checks read, around a real MindFormerConfig."""

    def __init__(self, config, stages):
        self.config, self.stages = config, stages

    def get_pipeline_stages(self):
        return self.stages

    def _reset_wrapper_for_pipeline_parallel(self):
        pass


def _batch(path, device_num):
    import mindspore as ms
    from mindformers.core.parallel_config import build_parallel_config
    from mindformers.tools.register import MindFormerConfig
    from mindformers.trainer.base_trainer import BaseTrainer
    from mindformers.trainer import base_trainer

    cfg = MindFormerConfig(path)
    build_parallel_config(cfg)
    modes = {0: "data_parallel", 1: "semi_auto_parallel", 2: "auto_parallel"}
    mode = modes[cfg.parallel.parallel_mode] if cfg.use_parallel else "stand_alone"
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode=mode, full_batch=bool(cfg.parallel.full_batch))
    base_trainer.get_real_group_size = lambda: device_num if cfg.use_parallel else 1
    trainer = _Trainer(cfg, cfg.parallel_config.pipeline_stage if mode != "data_parallel" else 1)
    BaseTrainer._check_grad_accumulation_steps(trainer)
    BaseTrainer._check_global_batch_size_for_auto_parallel(trainer)
    return {"global_batch_size": int(trainer.global_batch_size),
            "batch_size": int(cfg.runner_config.batch_size),
            "gradient_accumulation_steps": int(cfg.runner_config.gradient_accumulation_steps)}


def _plain(value):
    """A JSON value of a config attribute (MindSpore dtypes by their lower-case names)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value).lower()


def _model(path):
    import importlib
    import inspect

    from mindformers.models.build_config import get_model_config
    from mindformers.tools.register import MindFormerConfig
    from mindformers.tools.register import register

    cfg = MindFormerConfig(path)
    # the registry asks the run's context whether it is legacy; there is no run here
    register.is_legacy_model = lambda: cfg.use_legacy is not False
    import mindformers  # noqa: F401  (registers every model type)

    if cfg.get("pretrained_model_dir"):  # BaseTrainer does this before building the network
        cfg.model.pretrained_model_dir = cfg.pretrained_model_dir
    config = get_model_config(cfg.model)
    transformer = config.convert_to_transformer_config()
    # the type's training model: models/<type>/modeling_<type>_train.py, its Training* class
    package, module = type(config).__module__.rsplit(".", 1)
    train = importlib.import_module(f"{package}.modeling_{module.removeprefix('configuration_')}_train")
    built = any("qk_layernorm=True" in inspect.getsource(cls.__init__)
                for name, cls in inspect.getmembers(train, inspect.isclass)
                if name.startswith("Training") and cls.__module__ == train.__name__)
    from mindformers.parallel_core.transformer_config_utils import convert_to_transformer_config
    try:
        convert_to_transformer_config(config)
        strict = None
    except Exception as exc:  # what MindFormers says is the answer
        strict = f"{type(exc).__name__}: {exc}"
    fields = [f for f in vars(transformer) if not f.startswith("_")]
    return {"class": type(config).__name__, "strict": strict,
            "config": {k: _plain(v) for k, v in config.to_dict().items()},
            "transformer": {k: _plain(getattr(transformer, k)) for k in fields},
            "qk_layernorm_built": built}


def _network(path):
    import importlib
    import inspect

    import mindspore as ms
    from mindformers.models.build_config import get_model_config
    from mindformers.tools.register import MindFormerConfig

    cfg = MindFormerConfig(path)
    import mindformers  # noqa: F401  (registers every model type)

    # the layers ask the run's context whether the model is legacy (is_legacy_model, imported by
    # name into each module); MindFormers' build_context would also start communication, which
    # a stand-alone build on this CPU has none of
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("mindformers") and callable(
                getattr(module, "is_legacy_model", None)):
            module.is_legacy_model = lambda: cfg.use_legacy is not False
    ms.set_device("CPU")
    if cfg.get("pretrained_model_dir"):
        cfg.model.pretrained_model_dir = cfg.pretrained_model_dir
    config = get_model_config(cfg.model)
    package, module = type(config).__module__.rsplit(".", 1)
    train = importlib.import_module(f"{package}.modeling_{module.removeprefix('configuration_')}_train")
    (cls,) = [c for name, c in inspect.getmembers(train, inspect.isclass)
              if name.startswith("Training") and c.__module__ == train.__name__]
    network = cls(config)
    parameters = list(network.get_parameters())
    return {"class": cls.__name__,
            "parameters": [[p.name, list(p.shape)] for p in parameters],
            # what the optimizer leaves out (it takes trainable_params()) and what the parallel
            # optimizer leaves whole (created with parallel_optimizer=False)
            "frozen": [p.name for p in parameters if not p.requires_grad],
            "whole": [p.name for p in parameters if not p.parallel_optimizer]}


def main(jobs_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        try:
            if "read" in job:
                results.append(_read(job["read"]))
            elif "layers" in job:
                results.append(_layers(job["layers"]))
            elif "model" in job:
                results.append(_model(job["model"]))
            elif "network" in job:
                results.append(_network(job["network"]))
            elif "ulysses" in job:
                results.append(_ulysses(job["ulysses"]))
            else:
                results.append(_batch(job["batch"], job["device_num"]))
        except Exception:
            results.append({"crash": traceback.format_exc()})
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
