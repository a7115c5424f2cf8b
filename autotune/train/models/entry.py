"""What a trial trains: a built-in family or the user's ``model.entry`` function.

User model contract
-------------------
``model.entry`` names a function as ``"pkg.module:build"`` or ``"path/file.py:build"``, imported
by `autotune.spec.entry`'s one rule: model.yaml's folder and a file entry's own folder come first
on ``sys.path``, so a module beside model.yaml, or a file that imports its neighbours, loads as it
did when model.yaml was validated. autotune calls it once per process as ``build(config)`` with the
trial's whole resolved config (``model``, ``train``, ``trial``, ``knobs``, ``seed``, …; the
``model`` section carries any extra keys of model.yaml) and expects ``(network, loss_fn, dataset)``:

``network``
    A ``mindspore.nn.Cell`` called as ``network(inputs)`` that returns logits. Float32
    parameters; do not cast it to float16 yourself — autotune applies ``model.dtype`` (LayerNorm /
    BatchNorm stay float32). Build it deterministically: autotune calls
    ``mindspore.set_seed(config["seed"])`` first, and every data-parallel rank builds its own copy,
    which must start identical (no unseeded randomness in the weights). To support the
    ``recompute`` knob, give it a method ``apply_recompute(mode)`` for ``mode`` in
    ``"selective"``/``"full"`` (typically ``block.recompute()`` per block for full, and a smaller
    sub-cell per block for selective); without that method a candidate with recompute ≠ none fails.
``loss_fn``
    ``loss_fn(logits, labels)`` → scalar: an ``nn.Cell`` or a function of MindSpore ops (it is
    compiled into the training graph). It gets the logits cast to float32. It must be a *mean*
    over the samples, so that averaging micro-batch gradients equals the full-batch gradient.
``dataset``
    ``dataset(step, shard, num_shards)`` → ``(inputs, labels)``: numpy arrays whose first axis is
    the sample axis, holding shard ``shard`` (0 ≤ shard < num_shards) of the global batch of
    optimizer step ``step`` — ``train.global_batch_size / num_shards`` samples. autotune calls it
    with ``shard = the rank's dp index``, ``num_shards = dp`` and splits the result into
    ``grad_accum`` micro-batches along the first axis. Return the same shapes and dtypes every call (graphs
    compile once). Recommended: derive the global batch from (seed, step) and slice it, as the
    built-in data does, so candidates with different dp train on the same samples.

Layout: a user network runs with tp = pp = 1 (the search space fixes both, with a note, and the
trial program refuses anything else); ``dp`` applies as above. What a network would have to
provide to be split over tensor and pipeline ranks — what the built-in families do — is a build
*per rank*: given the rank's `autotune.train.parallel.groups.Placement`, only the layers of its pipeline
stage, each from `autotune.train.parallel.tp_layers` (or equivalent explicit collectives in the
placement's tp group), parameters named as in the whole model with the local shapes
`autotune.layout` derives from ``model.tp_rules``, weights filled layout-independently
(`autotune.train.models.weights`), a stage input/output of one fixed shape, and a loss for a
vocabulary-split head. The entry interface does not pass a placement yet.

Underflow bound: a float16 run's bound subtracts the rows of a token table that no input id
selects (they are zero in float32 too) only for tables declared read by the input ids alone —
``VocabParallelEmbedding(..., ids_only=True)``, or a cell whose ``token_table`` is ``(table,
start)``. A table tied to the head, or looked up by positions, must not be declared: its
unselected rows get gradients. Undeclared, nothing is subtracted (a larger bound: the probe runs
more often, never wrongly skipped).

Built-in families (``model.family`` = ``transformer`` | ``mlp`` | ``llama``, ``entry`` null) come from
`autotune.train.models`, built for one rank of the layout, with synthetic data from
`autotune.train.models.data`.
"""

from mindspore import nn

from autotune.families import takes_tokens
from autotune.spec import entry as entry_loader
from autotune.spec.entry import EntryError
from autotune.train import models
from autotune.train.models import SINGLE, data, weights
from autotune.train.parallel import tp_layers
from autotune.train.parallel.groups import Placement


def build_builtin(config: dict, placement: Placement = SINGLE):
    """``(network, loss_fn, dataset)`` of a built-in family for one rank of a layout: the rank's
    stage and tensor-parallel block, initialised layout-independently (`autotune.train.models.weights`),
    and the loss of a head split over tp."""
    model, seed = config["model"], config.get("seed", 0)
    batch = config["train"]["global_batch_size"]
    network = models.build_network(model, placement)
    weights.initialize(network, model, placement, seed)
    loss_fn = tp_layers.cross_entropy(
        model["vocab_size"], placement.tp, placement.tp_index, placement.tp_group
    )
    if takes_tokens(model["family"]):
        dataset = data.TokenChains(batch, model["seq_length"], model["vocab_size"], seed=seed)
    else:
        dataset = data.TeacherClasses(batch, model["hidden_size"], model["vocab_size"], seed=seed)
    return network, loss_fn, dataset


def build(config: dict, placement: Placement = SINGLE):
    """``(network, loss_fn, dataset)`` for one rank of the trial's config: the user's entry (one
    stage, no tensor parallelism) or a built-in family."""
    spec = config["model"].get("entry")
    if not spec:
        name = config["model"].get("family")
        if name not in models.NETWORKS:
            raise EntryError(
                f"model.family: {name!r} is not a built-in family ({', '.join(models.NETWORKS)}) "
                "and model.entry is not set"
            )
        return build_builtin(config, placement)
    result = entry_loader.load(spec, config.get("model_dir"))(config)
    if not isinstance(result, tuple) or len(result) != 3:
        raise EntryError(
            f"model.entry: {spec} must return (network, loss_fn, dataset), got {type(result).__name__}"
        )
    network, loss_fn, dataset = result
    if not isinstance(network, nn.Cell):
        raise EntryError(
            f"model.entry: network must be a mindspore.nn.Cell, got {type(network).__name__}"
        )
    if not callable(loss_fn) or not callable(dataset):
        raise EntryError("model.entry: loss_fn and dataset must be callable")
    return result
