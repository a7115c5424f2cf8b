"""strategy.ckpt of a study whose MindFormers base is an mcore config (use_legacy: False): the
parameters MindFormers 1.9 builds — their names, shapes and the split each rank holds — for a
tiny Qwen3 (q/k norms, grouped-query attention), a tiny Qwen3-MoE (grouped-GEMM experts over
ep) and a tiny DeepSeek-V3 (multi-latent attention, a dense first layer, shared experts, the
router's expert bias, an MTP module); the refusals where no strategy could say what a rank holds;
a legacy base keeps the legacy llama's names. The slow test compares the names, shapes and
untrained parameters with the network MindFormers builds from the same configs on this CPU."""

import fnmatch
import json
from types import SimpleNamespace

import pytest
import yaml

pytest.importorskip("mindspore")

from mindspore.parallel import build_searched_strategy  # noqa: E402
from mindspore.train.node_strategy_pb2 import ParallelStrategyMap  # noqa: E402

from autotune.cli import main  # noqa: E402
from autotune.export import write_export  # noqa: E402
from autotune.export.params import mcore_base  # noqa: E402
from autotune.families.mcore import (  # noqa: E402
    MCORE_FROZEN,
    MCORE_WHOLE,
    mcore_reasons,
    mcore_shapes,
)
from autotune.spec.errors import SpecError  # noqa: E402
from autotune.spec.model_yaml import parse_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.export.test_export import TRIAL  # noqa: E402

HERE = ROOT / "tests" / "mindformers"
TINY_QWEN3 = HERE / "tiny_qwen3_cpu.yaml"
TINY_QWEN3_MOE = HERE / "tiny_qwen3_moe_cpu.yaml"
TINY_DEEPSEEK3 = HERE / "tiny_deepseek3_cpu.yaml"
COLUMN, ROW = 0, 1


def _layer(i: int, mlp: dict) -> dict:
    b = f"decoder.layers.{i}"
    return {
        f"{b}.input_layernorm.weight": ((32,), None),
        # RowParallelLinear (h, heads·d): weight layout ("None", "tp")
        f"{b}.self_attention.linear_proj.weight": ((32, 64), ROW),
        # ColumnParallelLinear (heads·d + 2·groups·d, h), stored group by group
        f"{b}.self_attention.linear_qkv.weight": ((128, 32), COLUMN),
        f"{b}.self_attention.q_layernorm.weight": ((16,), None),
        f"{b}.self_attention.k_layernorm.weight": ((16,), None),
        f"{b}.pre_mlp_layernorm.weight": ((32,), None),
        **{f"{b}.{name}": value for name, value in mlp.items()},
    }


# Parameter.name → (shape, dim split over tp), as MindFormers 1.9 builds them (mindformers/
# parallel_core/training_graph: GPTModel in base_models/gpt/gpt_model.py, SelfAttention in
# transformer/attention.py, MLPInterleaved in transformer/mlp.py, TopKRouter in
# transformer/moe/router.py, FFNGroupedGEMM in transformer/moe/ffn.py, ColumnParallelLinear /
# RowParallelLinear / VocabParallelEmbedding in tensor_parallel/layers.py), and as the network it
# builds from tests/mindformers/tiny_qwen3_cpu.yaml and tiny_qwen3_moe_cpu.yaml lists them (the
# slow test below): hidden 32, 4 heads and 2 key/value groups of 16, ffn 48, 4 experts of 24.
DENSE_MLP = {
    "mlp.linear_fc1.weight": ((96, 32), COLUMN),  # gate and up, row by row (MLPInterleaved)
    "mlp.linear_fc2.weight": ((32, 48), ROW),
}
EXPERTS = {
    "mlp.router.weight": ((4, 32), None),
    "mlp.router.fi_accu": ((4,), None),  # requires_grad=False: no Adam moments
    "mlp.experts.weight1": ((128, 48), "ep"),  # (E·h, 2·F), layout_moe ("ep", None)
    "mlp.experts.weight2": ((96, 32), "ep"),  # (E·F, h)
}


def _model(mlp: dict) -> dict:
    return {
        "embedding.word_embeddings.weight": ((64, 32), COLUMN),
        **_layer(0, mlp),
        **_layer(1, mlp),
        "decoder.final_layernorm.weight": ((32,), None),
        "output_layer.weight": ((64, 32), COLUMN),
    }


QWEN3 = _model(DENSE_MLP)
QWEN3_TIED = {n: v for n, v in QWEN3.items() if n != "output_layer.weight"}
QWEN3_MOE = _model(EXPERTS)

# tests/mindformers/tiny_deepseek3_cpu.yaml: hidden 32, 4 heads, q_lora_rank 24, kv_lora_rank 16,
# per head 8 + 8 query/key and 8 value; layer 0 dense (ffn 48), layers 1-2 MoE (4 experts of 24,
# a shared one of 24, the router's expert bias: DeepseekV3Config's default). Multi-latent
# attention as MLASelfAttentionConcatenated builds it (transformer/multi_latent_attention.py),
# the shared experts as SharedExpertMLPInterleaved (transformer/moe/shared_experts.py).
MLA = {
    "self_attention.linear_proj.weight": ((32, 32), ROW),  # (h, heads·v)
    "self_attention.q_layernorm.weight": ((24,), None),  # qk_layernorm: True in the base
    "self_attention.linear_qb.weight": ((64, 24), COLUMN),  # heads·(8 + 8), q_lora_rank
    # SequenceParallelLinear, layout("None", "None"): q_lora_rank + kv_lora_rank + rope, whole
    "self_attention.linear_qkv.weight": ((48, 32), None),
    "self_attention.k_layernorm.weight": ((16,), None),
    "self_attention.linear_kvb.weight": ((64, 16), COLUMN),  # heads·(8 + 8), kv_lora_rank
}
SHARED_EXPERTS = {
    "mlp.router.weight": ((4, 32), None),
    "mlp.router.expert_bias": ((4,), None),  # requires_grad=False, parallel_optimizer=False
    "mlp.router.expert_load": ((4,), None),  # the same
    "mlp.router.fi_accu": ((4,), None),
    "mlp.experts.weight1": ((128, 48), "ep"),
    "mlp.experts.weight2": ((96, 32), "ep"),
    # SequenceParallelLinear: whole on every rank (the tokens are split over tp, not the weights)
    "mlp.shared_experts.linear_fc1.weight": ((48, 32), None),
    "mlp.shared_experts.linear_fc2.weight": ((32, 24), None),
}


# mla_qkv_concat: False (MLASelfAttention: Megatron's names, norms last)
MLA_MEGATRON = {
    "self_attention.linear_proj.weight": ((32, 32), ROW),
    "self_attention.linear_q_down_proj.weight": ((24, 32), None),
    "self_attention.linear_q_up_proj.weight": ((64, 24), COLUMN),
    "self_attention.linear_kv_down_proj.weight": ((24, 32), None),  # kv_lora_rank + rope
    "self_attention.linear_kv_up_proj.weight": ((64, 16), COLUMN),
    "self_attention.q_layernorm.weight": ((24,), None),
    "self_attention.kv_layernorm.weight": ((16,), None),
}
# qk_layernorm: False (TransformerConfig's default; DeepseekV3Config sets none, nor does
# DeepSeek-V3's config.json): the latent norms are IdentityOp, no parameter
MLA_NO_NORMS = {n: v for n, v in MLA.items() if "layernorm" not in n}


def _deepseek_layer(b: str, mlp: dict, attention: dict) -> dict:
    norm = {"input_layernorm.weight": ((32,), None)}
    post = {"pre_mlp_layernorm.weight": ((32,), None)}
    return {f"{b}.{n}": v for n, v in {**norm, **attention, **post, **mlp}.items()}


def _deepseek(attention: dict = MLA, mtp: bool = False) -> dict:
    """The tiny DeepSeek-V3's parameters; ``mtp``: with one MTP module (num_nextn_predict_layers:
    1; transformer/multi_token_prediction.py) after the final norm: its norms, its whole eh_proj
    (SequenceParallelLinear) and an MoE layer."""
    out = {"embedding.word_embeddings.weight": ((64, 32), COLUMN)}
    for i, mlp in enumerate((DENSE_MLP, SHARED_EXPERTS, SHARED_EXPERTS)):
        out.update(_deepseek_layer(f"decoder.layers.{i}", mlp, attention))
    out["decoder.final_layernorm.weight"] = ((32,), None)
    if mtp:
        out["mtp.layers.0.enorm.weight"] = out["mtp.layers.0.hnorm.weight"] = ((32,), None)
        out["mtp.layers.0.eh_proj.weight"] = ((32, 64), None)
        b = "mtp.layers.0.transformer_layer"
        out.update(_deepseek_layer(b, SHARED_EXPERTS, attention))
        out["mtp.layers.0.final_layernorm.weight"] = ((32,), None)
    out["output_layer.weight"] = ((64, 32), COLUMN)
    return out


DEEPSEEK3 = _deepseek()
DEEPSEEK3_MTP = _deepseek(mtp=True)
DEEPSEEK3_MEGATRON = _deepseek(MLA_MEGATRON)
DEEPSEEK3_NO_NORMS = _deepseek(MLA_NO_NORMS)


def _layered(tmp_path, name: str, base, model_config: dict):
    """A config over ``base`` (MindFormers' base_config rule) that sets ``model_config`` keys."""
    path = tmp_path / f"{name}.yaml"
    body = {"base_config": str(base), "model": {"model_config": model_config}}
    path.write_text(yaml.safe_dump(body))
    return path


def _spec(tmp_path, config, devices=4, backend="cpu"):
    """The model.yaml ``autotune init --mindformers`` writes for ``config``, on ``devices``."""
    path = tmp_path / "model.yaml"
    args = ["init", "--mindformers", str(config), "--backend", backend, "--out", str(path)]
    assert main(args) == 0
    data = yaml.safe_load(path.read_text())
    data["cluster"].update(devices=devices, devices_per_node=devices)
    del data["baseline"]  # the config's own 1-device layout; each test picks its candidate
    return parse_spec(data, path), str(tmp_path / data["export"]["mindformers_base"])


def _strategy(out) -> dict:
    """``{name: (split per dimension, device matrix, tensor map)}`` of an export's strategy."""
    stored = ParallelStrategyMap()
    stored.ParseFromString((out / "strategy.ckpt").read_bytes())
    splits = {i.node_name: list(i.parallel_strategys.parallel_strategy[0].dim) for i in
              stored.parallel_strategy_item}  # fmt: skip
    return {
        item.param_name: (
            splits[item.param_name],
            list(item.parallel_layouts.dev_matrix[0].dim),
            list(item.parallel_layouts.tensor_map[0].dim),
        )
        for item in stored.parallel_layout_item
    }


def _exported(out) -> list:
    """``[(name, shape)]`` of the export's parameters, in the network's order (summary.json)."""
    parameters = json.loads((out / "summary.json").read_text())["parameters"]
    return [(name, tuple(p["shape"])) for name, p in parameters.items()]


def _export(tmp_path, config, **knobs):
    spec, base = _spec(tmp_path, config, backend=knobs.pop("backend", "cpu"))
    c = build_space(spec).baseline().replace(**knobs)
    out = tmp_path / "out"
    write_export(spec, c, TRIAL, out, mindformers_base=base)
    return out


def test_an_mcore_qwen3_strategy_has_mindformers_names_shapes_and_splits(tmp_path, capsys):
    out = _export(tmp_path, TINY_QWEN3, dp=2, tp=2)
    # init's warning on the config's (legacy, ignored) qkv_concat names what the export writes
    assert "exported parameter names are MindFormers' mcore ones" in capsys.readouterr().err
    held = _strategy(out)
    moments = {f"{p}.{n}" for p in ("adam_m", "adam_v") for n in QWEN3}
    assert set(held) == set(QWEN3) | moments
    assert _exported(out) == [(n, shape) for n, (shape, _) in QWEN3.items()]
    for name, (shape, dim) in QWEN3.items():
        split = [2 if i == dim else 1 for i in range(len(shape))]
        for key in (name, f"adam_m.{name}", f"adam_v.{name}"):
            assert held[key][0] == split and held[key][1] == [2, 2], key


def test_a_tied_mcore_qwen3_has_no_output_layer_weight(tmp_path):
    """tie_word_embeddings (Qwen3-0.6B/1.7B/4B): the head multiplies by the token table."""
    tied = _layered(tmp_path, "tied", TINY_QWEN3, {"tie_word_embeddings": True})
    held = _strategy(_export(tmp_path, tied, dp=2, tp=2))
    assert set(held) == {f"{p}{n}" for p in ("", "adam_m.", "adam_v.") for n in QWEN3_TIED}
    assert held["embedding.word_embeddings.weight"][0] == [2, 1]  # rows over tp


def test_mcore_layers_go_to_their_pipeline_stages(tmp_path):
    out = _export(tmp_path, TINY_QWEN3, dp=2, pp=2, micro_batches=2)
    # the merged file's keys, "<stage>-<name>", as MindSpore reads them
    held = set(build_searched_strategy(str(out / "strategy.ckpt")))
    assert {n.split("-", 1)[0] for n in held if "decoder.layers.0." in n} == {"0"}
    assert {n.split("-", 1)[0] for n in held if "decoder.layers.1." in n} == {"1"}
    assert "0-embedding.word_embeddings.weight" in held and "1-output_layer.weight" in held
    assert "1-decoder.final_layernorm.weight" in held


def test_an_mcore_qwen3_moe_strategy_lays_the_grouped_experts_over_ep(tmp_path):
    out = _export(tmp_path, TINY_QWEN3_MOE, dp=2, tp=2, ep=2)
    held = _strategy(out)
    trained = [n for n in QWEN3_MOE if not n.endswith("fi_accu")]
    moments = {f"{p}.{n}" for p in ("adam_m", "adam_v") for n in trained}
    assert set(held) == set(QWEN3_MOE) | moments
    for name, (shape, dim) in QWEN3_MOE.items():
        if dim == "ep":  # the experts' own device matrix (dp·tp / ep, ep), dim 0 on ep
            assert held[name] == ([2, 1], [2, 2], [0, -1]), name
        else:
            split = [2 if i == dim else 1 for i in range(len(shape))]
            assert held[name][0] == split and held[name][1] == [2, 2], name


def _held_as_pinned(held: dict, pinned: dict):
    """Each parameter of ``pinned`` (and its Adam moments, unless frozen) split as pinned: dim
    ``dim`` over tp, or its experts over ep (the device matrix (dp·tp / ep, ep) of dp 2, tp 2)."""
    trained = [n for n in pinned if not any(fnmatch.fnmatch(n, g) for g in MCORE_FROZEN)]
    moments = {f"{p}.{n}" for p in ("adam_m", "adam_v") for n in trained}
    assert set(held) == set(pinned) | moments
    for name, (shape, dim) in pinned.items():
        if dim == "ep":
            assert held[name] == ([2, 1], [2, 2], [0, -1]), name
        else:
            split = [2 if i == dim else 1 for i in range(len(shape))]
            assert held[name][0] == split and held[name][1] == [2, 2], name


def test_an_mcore_deepseek_v3_strategy_has_latent_attention_dense_and_shared_experts(tmp_path):
    out = _export(tmp_path, TINY_DEEPSEEK3, dp=2, tp=2, ep=2)
    assert _exported(out) == [(n, shape) for n, (shape, _) in DEEPSEEK3.items()]
    _held_as_pinned(_strategy(out), DEEPSEEK3)


def test_an_mcore_deepseek_v3_mtp_module_follows_the_final_norm(tmp_path):
    config = _layered(tmp_path, "mtp", TINY_DEEPSEEK3, {"num_nextn_predict_layers": 1})
    # autotune's trainer builds no MTP module: a simulated study's export
    out = _export(tmp_path, config, dp=2, tp=2, ep=2, backend="simulate")
    assert _exported(out) == [(n, shape) for n, (shape, _) in DEEPSEEK3_MTP.items()]
    _held_as_pinned(_strategy(out), DEEPSEEK3_MTP)


def test_an_mcore_mtp_module_goes_to_the_last_stage_with_the_head(tmp_path):
    # MindFormers' GPTModel: mtp.pipeline_stage = pipeline_stage - 1; its transformer layer is
    # not decoder layer 0, whatever its name's "layers.0."
    config = _layered(tmp_path, "mtp", TINY_DEEPSEEK3, {"num_nextn_predict_layers": 1})
    out = _export(tmp_path, config, dp=1, tp=2, pp=2, micro_batches=2, backend="simulate")
    held = set(build_searched_strategy(str(out / "strategy.ckpt")))
    stages = {n.split("-", 1)[0] for n in held if n.split("-", 1)[1].startswith("mtp.")}
    assert stages == {"1"}
    assert {n.split("-", 1)[0] for n in held if "decoder.layers.0." in n} == {"0"}
    assert "1-output_layer.weight" in held and "0-embedding.word_embeddings.weight" in held


def test_mla_qkv_concat_false_has_megatron_s_latent_names():
    model = {"num_layers": 1, "hidden_size": 32, "num_heads": 4, "vocab_size": 64}
    model |= {"ffn_hidden_size": 48, "kv_lora_rank": 16, "q_lora_rank": 24}
    model |= {"qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
    base = {"mla_qkv_concat": False, "qk_layernorm": True}
    names = [n for n in mcore_shapes(model, base) if ".self_attention." in n]
    assert names == [f"decoder.layers.0.{n}" for n in MLA_MEGATRON]
    # without q_lora_rank the whole query projection, split over tp by heads like the up ones
    del model["q_lora_rank"]
    shapes = mcore_shapes(model, {**base, "qk_layernorm": False})
    assert shapes["decoder.layers.0.self_attention.linear_q_proj.weight"] == (64, 32)
    assert not any("layernorm" in n and "self_attention" in n for n in shapes)


# a llama model section of DeepSeek-V3's shape (autotune init's rows)
MOE_MLA = {
    "num_layers": 3,
    "hidden_size": 32,
    "num_heads": 4,
    "ffn_hidden_size": 48,
    "num_experts": 4,
    "moe_ffn_hidden_size": 24,
    "shared_ffn_hidden_size": 24,
    "dense_layers": 1,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
}


@pytest.mark.parametrize(
    "base, bias",
    [
        ({"model_type": "deepseek_v3"}, True),  # DeepseekV3Config's @register_mf_model_parameter
        ({"model_type": "deepseek_v3", "moe_router_enable_expert_bias": False}, False),
        ({"model_type": "qwen3_moe"}, False),  # TransformerConfig's default
        ({"balance_via_topk_bias": True}, True),  # the older name MindFormers' converter maps
    ],
)
def test_the_router_s_expert_bias_is_the_base_s(base, bias):
    model = {**MOE_MLA, "vocab_size": 64}
    assert ("decoder.layers.1.mlp.router.expert_bias" in mcore_shapes(model, base)) is bias


def test_the_base_s_config_json_is_read_under_its_model_config(tmp_path):
    """MindFormers reads pretrained_model_dir's config.json under the YAML's model_config: its
    model_type (DeepSeek-V3's: the router's expert bias on) counts where the YAML says none."""
    base = tmp_path / "base.yaml"
    folder = ROOT / "tests" / "fixtures" / "huggingface" / "DeepSeek-V3"
    body = {"use_legacy": False, "pretrained_model_dir": str(folder)}
    base.write_text(yaml.safe_dump({**body, "model": {"model_config": {"qk_layernorm": True}}}))
    llama = SimpleNamespace(model=SimpleNamespace(family="llama"))
    merged = mcore_base(llama, str(base))
    assert (merged["model_type"], merged["qk_layernorm"], merged["first_k_dense_replace"]) == (
        "deepseek_v3",
        True,
        3,
    )


@pytest.mark.parametrize(
    "key, value, knobs, message",
    [
        (
            "use_contiguous_weight_layout_attention",
            True,
            {"dp": 2, "tp": 2},
            "the fused QKV is [Q; K; V]",
        ),
        (
            "use_interleaved_weight_layout_mlp",
            False,
            {"dp": 2, "tp": 2},
            "linear_fc1 is [gate; up]",
        ),
        ("tie_word_embeddings", True, {"dp": 2, "pp": 2, "micro_batches": 2}, "tied embeddings"),
    ],
)
def test_what_no_strategy_describes_is_refused(tmp_path, key, value, knobs, message):
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump({"base_config": str(TINY_QWEN3), "model": {"model_config": {key: value}}})
    )
    spec, _ = _spec(tmp_path, TINY_QWEN3)
    c = build_space(spec).baseline().replace(**knobs)
    with pytest.raises(SpecError, match="mcore base: .*" + message.replace("[", r"\[")):
        write_export(spec, c, TRIAL, tmp_path / "out", mindformers_base=str(base))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change, base, tp, what",
    [
        ({"experts_tensor_parallel": True}, {}, 2, "experts split over tp"),
        ({}, {"use_shared_expert_gating": True}, 2, "the shared experts' gate"),
        ({"mtp_layers": 1}, {"tie_word_embeddings": True}, 2, "beside an MTP module"),
        # the dense first layer's linear_fc1 is [gate; up]; the experts have no such row order
        ({}, {"use_interleaved_weight_layout_mlp": False}, 2, "linear_fc1 is [gate; up]"),
        ({"num_heads": 6}, {}, 4, "tp = 4 does not divide the 6 heads"),
        ({"ffn_hidden_size": 50}, {}, 4, "tp = 4 does not divide ffn 50"),
    ],
)
def test_what_is_not_established_is_refused(change, base, tp, what):
    assert mcore_reasons(MOE_MLA, {}, 2) == []
    (reason,) = mcore_reasons({**MOE_MLA, **change}, base, tp)
    assert what in reason


def test_reshard_is_refused_for_an_mcore_base(tmp_path):
    spec, base = _spec(tmp_path, TINY_QWEN3)
    c = build_space(spec).baseline().replace(dp=4)
    with pytest.raises(SpecError, match="--reshard: the strategy holds MindFormers' mcore names"):
        write_export(
            spec, c, TRIAL, tmp_path / "out", tmp_path / "full.ckpt", mindformers_base=base
        )
    assert not (tmp_path / "out").exists()


def test_a_legacy_base_keeps_the_legacy_llama_names(tmp_path):
    spec, _ = _spec(tmp_path, TINY_QWEN3)
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump({"base_config": str(TINY_QWEN3), "use_legacy": True}))
    c = build_space(spec).baseline().replace(dp=2, tp=2)
    write_export(spec, c, TRIAL, tmp_path / "out", mindformers_base=str(legacy))
    held = _strategy(tmp_path / "out")
    assert "model.layers.0.attention.wq.weight" in held
    assert not any(n.startswith("decoder.") for n in held)


@pytest.mark.slow
def test_the_mcore_names_are_those_of_the_network_mindformers_builds(tmp_path):
    """MindFormers 1.9 builds the training model of each tiny config on this CPU (stand-alone:
    construction runs no kernel; consumer job 'network'): the export's names and shapes, in
    order, are its ``Parameter.name``s and shapes, and those pinned above; the parameters it
    does not train (``requires_grad=False``) and those the parallel optimizer leaves whole
    (``parallel_optimizer=False``) are the export's ``MCORE_FROZEN`` and ``MCORE_WHOLE``."""
    from tests.export.test_mindformers_consumer import consumer

    mtp = _layered(tmp_path, "mtp", TINY_DEEPSEEK3, {"num_nextn_predict_layers": 1})
    megatron = _layered(tmp_path, "megatron", TINY_DEEPSEEK3, {"mla_qkv_concat": False})
    no_norms = _layered(tmp_path, "no_norms", TINY_DEEPSEEK3, {"qk_layernorm": False})
    tied = _layered(tmp_path, "tied", TINY_QWEN3, {"tie_word_embeddings": True})
    # autotune's trainer builds no MTP module: that study is a simulated one
    experts, simulated = {"ep": 2}, {"ep": 2, "backend": "simulate"}
    cases = (  # config, the class MindFormers builds, the names pinned above, the export's knobs
        (TINY_QWEN3, "TrainingQwen3ForCausalLM", QWEN3, {}),
        (TINY_QWEN3_MOE, "TrainingQwen3MoeForCausalLM", QWEN3_MOE, experts),
        (TINY_DEEPSEEK3, "TrainingDeepseekV3ForCausalLM", DEEPSEEK3, experts),
        (mtp, "TrainingDeepseekV3ForCausalLM", DEEPSEEK3_MTP, simulated),
        (megatron, "TrainingDeepseekV3ForCausalLM", DEEPSEEK3_MEGATRON, experts),
        (no_norms, "TrainingDeepseekV3ForCausalLM", DEEPSEEK3_NO_NORMS, experts),
        (tied, "TrainingQwen3ForCausalLM", QWEN3_TIED, {}),
    )
    networks = consumer(tmp_path, [{"network": str(config)} for config, *_ in cases])
    for (config, cls, pinned, knobs), built in zip(cases, networks):
        assert built["class"] == cls
        folder = tmp_path / f"export-{config.stem}"
        folder.mkdir()
        parameters = [(name, tuple(shape)) for name, shape in built["parameters"]]
        exported = _export(folder, config, dp=2, tp=2, **knobs)
        assert _exported(exported) == parameters, config.stem
        assert parameters == [(n, shape) for n, (shape, _) in pinned.items()], config.stem
        for listed, globs in ((built["frozen"], MCORE_FROZEN), (built["whole"], MCORE_WHOLE)):
            matched = [n for n, _ in parameters if any(fnmatch.fnmatch(n, g) for g in globs)]
            assert listed == matched, config.stem
