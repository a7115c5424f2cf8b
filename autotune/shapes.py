"""Parameter names and shapes of the built-in model families, without importing MindSpore.

`parameter_shapes(model_cfg)` returns ``{name: shape}`` in the order MindSpore's
``Cell.parameters_and_names()`` yields them for the network `autotune.train.models.build_network`
builds from the same ``model`` section. The export module uses it to write strategy files and
summaries, and the cost model to count parameters, without MindSpore; a test checks it against
the real network. It imports nothing of autotune (`autotune.layout` builds on it).

Dense weights are (out, in), as MindSpore stores them.

The ``llama`` family's names and shapes are those of MindFormers' legacy ``LlamaForCausalLM``
(``mindformers/models/llama``, docs/mindformers.md "Parameter names"): no biases, grouped-query
``wk``/``wv`` of ``num_kv_heads`` heads, a three-matrix SwiGLU feed-forward, RMSNorm weights,
an untied ``lm_head``.
"""

FAMILIES = ("transformer", "mlp", "llama")
# Families whose sample is a sequence of token ids (the rest: one row of features).
TOKEN_FAMILIES = ("transformer", "llama")


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


def llama_ffn(hidden: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The feed-forward width MindFormers' llama derives when ``intermediate_size`` is not given
    (``LlamaFeedForward``, docs/mindformers.md): 4·hidden, times ``ffn_dim_multiplier`` + 0.01
    when given, two thirds of it, rounded up to ``multiple_of``. 4096 → 11008, 5120 → 13824,
    8192 with 1.3 → 28672."""
    width = 4 * hidden
    if ffn_dim_multiplier is not None:
        width = int((ffn_dim_multiplier + 0.01) * width)
    width = int(2 * width / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def kv_heads(model_cfg: dict) -> int:
    """Key/value heads of a llama model (grouped-query attention; all heads when not given)."""
    return model_cfg.get("num_kv_heads") or model_cfg["num_heads"]


def _llama(cfg):
    h, ffn, vocab = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"]
    kv_dim = kv_heads(cfg) * (h // cfg["num_heads"])
    shapes = {"model.tok_embeddings.embedding_weight": (vocab, h)}
    for i in range(cfg["num_layers"]):
        b = f"model.layers.{i}"
        shapes[f"{b}.attention_norm.weight"] = (h,)
        shapes[f"{b}.attention.wq.weight"] = (h, h)
        shapes[f"{b}.attention.wk.weight"] = (kv_dim, h)
        shapes[f"{b}.attention.wv.weight"] = (kv_dim, h)
        shapes[f"{b}.attention.wo.weight"] = (h, h)
        shapes[f"{b}.ffn_norm.weight"] = (h,)
        shapes[f"{b}.feed_forward.w1.weight"] = (ffn, h)   # gate
        shapes[f"{b}.feed_forward.w2.weight"] = (h, ffn)   # down
        shapes[f"{b}.feed_forward.w3.weight"] = (ffn, h)   # up
    shapes["model.norm_out.weight"] = (h,)
    shapes["lm_head.weight"] = (vocab, h)
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
    if family == "llama":
        return _llama(model_cfg)
    raise ValueError(f"model.family: unknown built-in family {family!r} (expected one of {', '.join(FAMILIES)})")
