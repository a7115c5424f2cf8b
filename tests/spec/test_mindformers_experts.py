"""autotune init reads MindFormers' mixtures of experts as MindFormers builds them: Qwen3-MoE and
DeepSeek-V3 from mcore configs over their Hugging Face config.json, Mixtral and DeepSeek-V3
from legacy ``moe_config`` configs, with expert and context parallelism as the baseline."""

import pytest

from autotune.families.summary import counts
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.spec.test_mindformers_init import FIXTURES, init
from tests.spec.test_mindformers_mcore import DENSE_TEMPLATE, HF, layered, with_folder

QWEN3_MOE = FIXTURES / "pretrain_qwen3_30b_a3b_4k.yaml"
MIXTRAL = FIXTURES / "pretrain_mixtral-8x7b.yaml"
DEEPSEEK_LEGACY = FIXTURES / "pretrain_deepseek3_671b.yaml"
DEEPSEEK_TEST = FIXTURES / "deepseekv3_train.yaml"


def read(tmp_path, capsys, config, *flags):
    code, data = init(tmp_path, config, *flags)
    err = capsys.readouterr().err
    assert code == 0, err
    spec = load_spec(tmp_path / "model.yaml")
    build_space(spec)
    return data, spec, err


def test_qwen3_30b_a3b_with_its_expert_parallel_baseline(tmp_path, capsys):
    data, spec, _ = read(tmp_path, capsys, QWEN3_MOE, "--devices", "64")
    model = data["model"]
    assert (model["num_experts"], model["experts_per_token"], model["moe_ffn_hidden_size"]) == (
        128,
        8,
        768,
    )
    assert model["qk_norm"] is True and model["head_dim"] == 128
    assert "moe_capacity_factor" not in model  # moe_token_drop_policy probs, no capacity: dropless
    base = data["baseline"]
    assert (base["dp"], base["tp"], base["pp"], base["ep"]) == (4, 4, 4, 4)
    main_count, active, _ = counts(spec.model.as_config())
    assert main_count / 30.5e9 == pytest.approx(1, abs=0.01)
    assert active / 3.3e9 == pytest.approx(1, abs=0.02)  # Qwen's 3.3 B: 3.35 B rounded down
    assert build_space(spec).domains["ep"] == (1, 2, 4, 8, 16, 32, 64)  # all divide 128


def test_qwen3_moe_and_deepseek_v3_from_their_hugging_face_folders(tmp_path, capsys):
    """MindFormers' mcore template over each model's config.json: the model is the file's."""
    data, spec, _ = read(tmp_path, capsys, with_folder(tmp_path, DENSE_TEMPLATE, "Qwen3-30B-A3B"))
    assert data["model"]["num_experts"] == 128 and data["model"]["num_layers"] == 48
    deepseek = with_folder(tmp_path, DENSE_TEMPLATE, "DeepSeek-V3")
    # its MTP module: autotune's trainer builds none, so on the config's own backend (ascend)
    # every trial would fail — init refuses that when asked for it, naming the key …
    code, _ = init(tmp_path, deepseek, "--force", "--backend", "ascend")
    assert code == 2 and "model.mtp_layers: 1: " in capsys.readouterr().err
    # … and unasked writes a simulation of it, saying why and how to run it for real
    data, spec, _ = read(tmp_path, capsys, deepseek, "--force")
    assert data["cluster"]["backend"] == "simulate"
    text = (tmp_path / "model.yaml").read_text()
    assert "does not build model.mtp_layers; add --run-mindformer" in text
    assert "# NOTE: trials are the cost model's estimates (cluster.backend simulate)" in text
    model = data["model"]
    assert model["kv_lora_rank"] == 512 and model["q_lora_rank"] == 1536
    assert model["dense_layers"] == 3 and model["mtp_layers"] == 1
    assert model["shared_ffn_hidden_size"] == 2048  # n_shared_experts 1 × 2048
    main_count, active, mtp = counts(spec.model.as_config())
    assert main_count / 671e9 == pytest.approx(1, abs=0.01)
    assert (active - 129280 * 7168) / 36.6e9 == pytest.approx(1, abs=0.01)
    text = (tmp_path / "model.yaml").read_text()
    assert f"{HF / 'DeepSeek-V3' / 'config.json'}: kv_lora_rank" in text


def test_mindformers_deepseek_v3_test_config_over_the_hugging_face_file(tmp_path, capsys):
    """MindFormers' own 4-layer mcore DeepSeek-V3 test: its YAML wins key by key over
    config.json, which gives what it leaves out (the query and latent ranks, MTP)."""
    config = layered(tmp_path, DEEPSEEK_TEST, f"pretrained_model_dir: {HF / 'DeepSeek-V3'}\n")
    data, _, _ = read(tmp_path, capsys, config, "--total-steps", "10")
    model = data["model"]
    assert (model["num_layers"], model["hidden_size"], model["num_experts"]) == (4, 256, 16)
    assert (model["q_lora_rank"], model["v_head_dim"], model["dense_layers"]) == (1536, 192, 1)
    assert data["baseline"]["ep"] == 2 and data["baseline"]["pp"] == 2


def test_mixtral_from_its_legacy_moe_config(tmp_path, capsys):
    data, spec, err = read(tmp_path, capsys, MIXTRAL, "--total-steps", "1000")
    model = data["model"]
    assert (model["num_experts"], model["experts_per_token"], model["moe_ffn_hidden_size"]) == (
        8,
        2,
        14336,
    )
    assert model["moe_capacity_factor"] == 1.1 and data["baseline"]["ep"] == 8
    main_count, active, _ = counts(spec.model.as_config())
    # Mistral AI: 46.7 B parameters, 12.9 B used per token
    assert main_count / 46.7e9 == pytest.approx(1, abs=0.01)
    assert active / 12.9e9 == pytest.approx(1, abs=0.01)
    assert "65535: not a power of two" in err and data["baseline"]["loss_scale"] == 65536


def test_deepseek_v3_671b_pretraining_from_its_legacy_config(tmp_path, capsys):
    """MindFormers' r1.5.0 DeepSeek-V3 pre-training on 1,024 NPUs: 61 layers on 16 stages
    (the first 13 one layer more), ep 8, a capacity factor of 1.5."""
    data, spec, err = read(tmp_path, capsys, DEEPSEEK_LEGACY, "--total-steps", "1000")
    model, base = data["model"], data["baseline"]
    assert (base["dp"], base["tp"], base["pp"], base["ep"]) == (16, 4, 16, 8)
    assert model["moe_capacity_factor"] == 1.5 and model["mtp_layers"] == 1
    main_count, _, _ = counts(spec.model.as_config())
    assert main_count / 671e9 == pytest.approx(1, abs=0.01)
    assert "offset" in err


@pytest.mark.parametrize(
    "body, named",
    [
        (
            "model:\n  model_config:\n    first_k_dense_replace: 0\n"
            "    moe_layer_freq: [1, 0, 1, 1]\n",
            "moe_layer_freq: [1, 0, 1, 1]: MoE layers that are not the last ones",
        ),
        (
            "model:\n  model_config:\n    multi_latent_attention: false\n",
            "multi_latent_attention: False: kv_lora_rank is given",
        ),
    ],
)
def test_expert_and_latent_patterns_autotune_cannot_represent_are_refused(
    tmp_path, capsys, body, named
):
    config = layered(tmp_path, DEEPSEEK_TEST, f"pretrained_model_dir: {HF / 'DeepSeek-V3'}\n{body}")
    code, _ = init(tmp_path, config, "--total-steps", "10")
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
