"""Parameter names and shapes of the built-in model families, without importing MindSpore.

`parameter_shapes(model_cfg)` returns ``{name: shape}`` in the order MindSpore's
``Cell.parameters_and_names()`` yields them for the network `autotune.train.models.build_network`
builds from the same ``model`` section. The export module uses it to write strategy files and
summaries, and the cost model to count parameters, without MindSpore; a test checks it against
the real network. It imports nothing of autotune (`autotune.layout` builds on it).

Dense weights are (out, in), as MindSpore stores them.
"""

FAMILIES = ("transformer", "mlp")


def _dense(prefix, out_dim, in_dim):
    return {f"{prefix}.weight": (out_dim, in_dim), f"{prefix}.bias": (out_dim,)}


def _norm(prefix, dim):
    return {f"{prefix}.gamma": (dim,), f"{prefix}.beta": (dim,)}


def _transformer(cfg):
    h, ffn, vocab = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"]
    shapes = {"embed.tok.embedding_table": (vocab, h), "embed.pos.embedding_table": (cfg["seq_length"], h)}
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}"
        shapes.update(_norm(f"{b}.ln1", h))
        shapes.update(_dense(f"{b}.attn.qkv", 3 * h, h))
        shapes.update(_dense(f"{b}.attn.proj", h, h))
        shapes.update(_norm(f"{b}.ln2", h))
        shapes.update(_dense(f"{b}.mlp.fc_in", ffn, h))
        shapes.update(_dense(f"{b}.mlp.fc_out", h, ffn))
    shapes.update(_norm("ln_f", h))
    shapes.update(_dense("head", vocab, h))
    return shapes


def _mlp(cfg):
    h, ffn = cfg["hidden_size"], cfg["ffn_hidden_size"]
    shapes = _dense("inp", h, h)
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}"
        shapes.update(_norm(f"{b}.norm", h))
        shapes.update(_dense(f"{b}.fc_in", ffn, h))
        shapes.update(_dense(f"{b}.fc_out", h, ffn))
    shapes.update(_dense("head", cfg["vocab_size"], h))
    return shapes


def parameter_shapes(model_cfg: dict) -> dict:
    """``{parameter name: shape tuple}`` of a built-in family (``model_cfg["family"]``).

    Raises ValueError for a family that is not built in (a user ``entry`` model has to be built
    to know its parameters).
    """
    family = model_cfg.get("family")
    if family == "transformer":
        return _transformer(model_cfg)
    if family == "mlp":
        return _mlp(model_cfg)
    raise ValueError(f"model.family: unknown built-in family {family!r} (expected one of {', '.join(FAMILIES)})")
