"""Experts, latent attention and multi-token prediction in model.yaml: counted as their
publishers count them, laid out by name, and refused by field where they do not fit."""

from pathlib import Path

import pytest

from autotune.families.base import parameter_shapes
from autotune.families.summary import counts, model_line
from autotune.layout import builtin_layout
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import parse_spec
from tests.train.test_moe import MOE

# Qwen/Qwen3-30B-A3B's config.json (tests/fixtures/huggingface/Qwen3-30B-A3B) as model.yaml rows
QWEN3_30B_A3B = {
    "family": "llama",
    "num_layers": 48,
    "hidden_size": 2048,
    "num_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "qk_norm": True,
    "ffn_hidden_size": 6144,
    "vocab_size": 151936,
    "seq_length": 4096,
    "num_experts": 128,
    "experts_per_token": 8,
    "moe_ffn_hidden_size": 768,
}
# deepseek-ai/DeepSeek-V3's config.json (tests/fixtures/huggingface/DeepSeek-V3)
DEEPSEEK_V3 = {
    "family": "llama",
    "num_layers": 61,
    "hidden_size": 7168,
    "num_heads": 128,
    "ffn_hidden_size": 18432,
    "vocab_size": 129280,
    "seq_length": 4096,
    "num_experts": 256,
    "experts_per_token": 8,
    "moe_ffn_hidden_size": 2048,
    "shared_ffn_hidden_size": 2048,
    "dense_layers": 3,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mtp_layers": 1,
}


def spec_of(model: dict, **cluster):
    data = {
        "model": model,
        "train": {"global_batch_size": 64},
        "cluster": {"backend": "simulate", "devices": 8, **cluster},
    }
    return parse_spec(data, Path("model.yaml"))


def test_qwen3_30b_a3b_counts_as_qwen_publishes_it():
    """Qwen's model card: 30.5 B parameters, 3.3 B activated, 29.9 B without the embeddings.
    Qwen counts the token table and the head as activated (Qwen1.5-MoE-A2.7B's card: 2.7 B
    activated, 2.0 B without them); its 3.3 B is 3.35 B rounded down, so the active count is
    held to 2 %, the totals to 1 %."""
    main, active, mtp = counts(spec_of(QWEN3_30B_A3B).model.as_config())
    embeddings = 2 * 151936 * 2048
    assert main / 30.5e9 == pytest.approx(1, abs=0.01)
    assert (main - embeddings) / 29.9e9 == pytest.approx(1, abs=0.01)
    assert active / 3.3e9 == pytest.approx(1, abs=0.02)
    assert mtp == 0


def test_deepseek_v3_counts_as_deepseek_publishes_it():
    """DeepSeek-V3's README_WEIGHTS.md: 671 B main-model parameters, 36.6 B activated
    including the 0.9 B output head (the token table left out), and 11.5 B unique parameters in
    its MTP module; its report's abstract rounds the activated count to 37 B."""
    main, active, mtp = counts(spec_of(DEEPSEEK_V3).model.as_config())
    table = 129280 * 7168
    assert main / 671e9 == pytest.approx(1, abs=0.01)
    assert (active - table) / 36.6e9 == pytest.approx(1, abs=0.01)
    assert active / 37e9 == pytest.approx(1, abs=0.02)
    assert mtp / 11.5e9 == pytest.approx(1, abs=0.02)


def test_the_model_line_names_experts_latent_attention_and_mtp():
    line = model_line(spec_of(DEEPSEEK_V3).model.as_config())
    assert line.startswith("model: llama, 671.03 B parameters, 37.55 B active per token, + 11.61 B")
    for words in ("latent attention (128 heads of 192/128", "256 experts of 2048, 8 per token"):
        assert words in line


def test_experts_split_over_ep_and_the_latent_projections_over_tp():
    layouts, reasons = builtin_layout(spec_of(DEEPSEEK_V3).model.as_config(), tp=8, pp=1)
    assert not reasons
    split = {name: p.split_dim for name, p in layouts.items()}
    assert split["model.layers.3.attention.wq_b.weight"] == 0
    assert split["model.layers.3.attention.wkv_b.weight"] == 0
    assert split["model.layers.3.attention.wo.weight"] == 1
    assert split["model.layers.3.attention.wq_a.weight"] is None  # a down-projection: whole
    assert split["model.layers.3.feed_forward.shared.w2.weight"] == 1
    assert split["model.layers.3.feed_forward.experts.w1.weight"] is None  # not over tp
    assert layouts["model.layers.3.feed_forward.experts.w1.weight"].ep_split
    assert "model.layers.2.feed_forward.w1.weight" in layouts  # a dense first layer
    assert layouts["model.mtp.0.eh_proj.weight"].stage == 0


def test_the_mtp_module_sits_on_the_last_stage():
    model = {**DEEPSEEK_V3, "num_layers": 4, "dense_layers": 1}
    layouts, reasons = builtin_layout(spec_of(model).model.as_config(), tp=1, pp=2)
    assert not reasons
    assert layouts["model.mtp.0.feed_forward.experts.w2.weight"].stage == 1
    assert layouts["model.layers.1.attention.wo.weight"].stage == 0
    assert "model.mtp.0.feed_forward.router.weight" in parameter_shapes(
        spec_of(model).model.as_config()
    )


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"experts_per_token": None}, "experts_per_token", "is required with model.num_experts"),
        ({"experts_per_token": 200}, "experts_per_token", "200 > model.num_experts = 128"),
        ({"dense_layers": 48}, "dense_layers", "leaves no MoE layer"),
        ({"moe_capacity_factor": 0}, "moe_capacity_factor", "must be > 0"),
        ({"num_experts": None}, "experts_per_token", "give model.num_experts too"),
        ({"qk_rope_head_dim": 64}, "qk_rope_head_dim", "give model.kv_lora_rank too"),
        ({"kv_lora_rank": 512}, "qk_nope_head_dim", "is required with model.kv_lora_rank"),
    ],
)
def test_what_does_not_fit_is_refused_by_field(change, field, words):
    model = {k: v for k, v in {**QWEN3_30B_A3B, **change}.items() if v is not None}
    with pytest.raises(SpecError, match=rf"model\.{field}: .*{words}"):
        spec_of(model)


def test_latent_attention_takes_no_head_dim_nor_grouped_heads():
    for change, field in (({"head_dim": 128}, "head_dim"), ({"num_kv_heads": 8}, "num_kv_heads")):
        with pytest.raises(SpecError, match=rf"model\.{field}: .*multi-latent attention"):
            spec_of({**DEEPSEEK_V3, **change})


def test_another_family_takes_no_experts():
    model = {
        "family": "transformer",
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "seq_length": 16,
        "vocab_size": 128,
        "num_experts": 4,
    }
    with pytest.raises(SpecError, match=r"model\.num_experts: is the llama family's option"):
        spec_of(model)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("mtp_layers", 1, "builds no multi-token prediction modules"),
        ("moe_capacity_factor", 1.25, "dropless"),
        ("experts_tensor_parallel", True, "over ep only"),
        ("fp8_linear", True, "no FP8 GEMMs"),
    ],
)
def test_what_the_trainer_does_not_build_is_refused_before_any_trial(tmp_path, key, value, says):
    """A property of the model, not of a candidate: where the trainer runs the trials (cpu here;
    gpu and ascend alike) the spec is refused at validation, naming the field and the file,
    instead of every trial failing as an error; a simulate or replay study prices it."""
    path = tmp_path / "model.yaml"
    model = {**MOE, key: value}  # the trainer builds all the rest: tests/train/test_moe.py
    cluster = {"devices": 2, "devices_per_node": 2}
    for backend in ("cpu", "gpu", "ascend"):
        with pytest.raises(SpecError, match=rf"^{path}: model\.{key}: {value}: .*{says}"):
            parse_spec(
                {
                    "model": {**model, "dtype": "float16" if backend != "cpu" else "float32"},
                    "train": {"global_batch_size": 16},
                    "cluster": {"backend": backend, **cluster},
                },
                path,
            )
    (tmp_path / "table.csv").write_text("tp,goodput,outcome\n1,10.0,ok\n")
    for extra in ({"backend": "simulate"}, {"backend": "replay", "replay": "table.csv"}):
        data = {"model": model, "train": {"global_batch_size": 16}, "cluster": cluster | extra}
        assert getattr(parse_spec(data, path).model, key) == value


def test_the_trainers_refusal_is_the_bad_input_exit_and_the_examples_stay_valid(tmp_path, capsys):
    from autotune.cli import main
    from tests.conftest import ROOT

    path = tmp_path / "model.yaml"
    path.write_text(
        "model: {family: llama, num_layers: 2, hidden_size: 32, num_heads: 4, ffn_hidden_size: 48,"
        " seq_length: 8, vocab_size: 64, num_experts: 4, experts_per_token: 2,"
        " moe_ffn_hidden_size: 16, mtp_layers: 1, dtype: float32}\n"
        "train: {global_batch_size: 16}\n"
        "cluster: {backend: cpu, devices: 2, devices_per_node: 2}\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: model.mtp_layers: 1: " in err and "cluster.backend simulate" in err
    # DeepSeek-V3 with its MTP module, priced by the cost model
    assert main(["validate", str(ROOT / "examples" / "deepseek_v3_2048dev_simulate.yaml")]) == 0
