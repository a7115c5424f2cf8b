"""MindFormers itself builds the mcore model init read (slow tier): ``tests/mindformers/consumer.py``
in MindFormers' venv runs its ``get_model_config`` over the same config and Hugging Face folder
and converts it to its ``TransformerConfig``; every model field init wrote must be what
MindFormers builds, and every default autotune transcribed (``MCORE_TYPES``) MindFormers' own.
"""

import pytest
import yaml

from autotune.spec.mindformers_mcore import MCORE_TYPES
from tests.export.test_mindformers_consumer import consumer
from tests.spec.test_mindformers_init import init
from tests.spec.test_mindformers_mcore import (
    DENSE_TEMPLATE,
    QWEN3_32B,
    QWEN3_FINETUNE,
    with_folder,
)

pytestmark = pytest.mark.slow


def _expected(model: dict) -> dict:
    """The TransformerConfig fields a model.yaml's model section stands for."""
    heads = model["num_heads"]
    return {
        "num_layers": model["num_layers"],
        "hidden_size": model["hidden_size"],
        "num_attention_heads": heads,
        "num_query_groups": model.get("num_kv_heads", heads),
        "kv_channels": model.get("head_dim", model["hidden_size"] // heads),
        "ffn_hidden_size": model["ffn_hidden_size"],
        "seq_length": model["seq_length"],
        "vocab_size": model["vocab_size"],
        "compute_dtype": model["dtype"],
        "params_dtype": model["param_dtype"],
        "use_flash_attention": model["flash_attention"],
        # the llama family's layer
        "normalization": "rmsnorm",
        "gated_linear_unit": True,
        "position_embedding_type": "rope",
    }


def test_mindformers_builds_every_field_init_wrote(tmp_path):
    configs = {
        "qwen3-32b-folder": with_folder(tmp_path, QWEN3_FINETUNE),
        "qwen3-32b-yaml": QWEN3_32B,
        "qwen3-8b-template": with_folder(tmp_path, DENSE_TEMPLATE, "Qwen3-8B"),
    }
    models = {}
    for name, config in configs.items():
        code, data = init(tmp_path, config, "--backend", "simulate", out=f"{name}.yaml")
        assert code == 0, name
        models[name] = data["model"]
    results = consumer(tmp_path, [{"model": str(c)} for c in configs.values()])
    for (name, model), built in zip(models.items(), results, strict=True):
        assert built["class"] == "Qwen3Config" and built["strict"] is None, name
        got = {k: built["transformer"][k] for k in _expected(model)}
        got["normalization"] = str(got["normalization"]).lower()
        assert got == _expected(model), name
        assert built["transformer"]["hidden_act"] in ("silu", "swiglu"), name
        # q/k norms: the training model's, whatever the config's qk_layernorm
        assert model["qk_norm"] is True and built["qk_layernorm_built"] is True, name
        assert not built["transformer"]["add_bias_linear"], name
        assert not built["transformer"]["add_qkv_bias"], name
        assert not built["transformer"]["tie_word_embeddings"], name


def test_the_qwen3_defaults_autotune_takes_are_mindformers_own(tmp_path):
    """A qwen3 config stating its shape only: every other key is MindFormers' default."""
    shape = {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 512,
    }
    config = tmp_path / "bare.yaml"
    config.write_text(
        yaml.safe_dump(
            {"use_legacy": False, "model": {"model_config": {"model_type": "qwen3", **shape}}}
        )
    )
    (built,) = consumer(tmp_path, [{"model": str(config)}])
    facts = MCORE_TYPES["qwen3"]
    assert built["class"] == facts.config_class
    for key, value in facts.defaults.items():
        where = built["config"] if key in built["config"] else built["transformer"]
        assert where[key] == value, (key, where.get(key), value)
    assert built["qk_layernorm_built"] is facts.fixed["qk_layernorm"][0]
