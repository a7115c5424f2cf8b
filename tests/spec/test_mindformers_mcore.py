"""mcore MindFormers configs (``use_legacy: False``) read as MindFormers builds them: the shape
from ``pretrained_model_dir``'s Hugging Face ``config.json`` under the YAML's ``model_config``,
every unstated key MindFormers' default for its ``model_type``, Qwen3 as it is (docs/mindformers.md,
"mcore configs").

The configs are MindFormers' own (tests/fixtures/mindformers/, verbatim); a config whose
``pretrained_model_dir`` is a placeholder is pointed at a fixture folder
(tests/fixtures/huggingface/) by a file layered over it through ``base_config``, as MindFormers
chains configs. The slow tier builds MindFormers' own model config from the same files
(tests/mindformers/test_mcore_config.py).
"""

import json

import pytest
import yaml

from autotune.cli import main
from tests.spec.test_mindformers_init import FIXTURES, init

HF = FIXTURES.parent / "huggingface"
QWEN3_FINETUNE = FIXTURES / "finetune_qwen3.yaml"  # pretrained_model_dir: "/path/to/Qwen3-32B"
QWEN3_32B = FIXTURES / "pretrain_qwen3_32b_4k.yaml"  # its shape in model_config
DENSE_TEMPLATE = FIXTURES / "llm_pretrain_dense_template.yaml"  # "path/to/model_dir"
QWEN3_MOE = FIXTURES / "pretrain_qwen3_30b_a3b_4k.yaml"
# Qwen3-32B as MindFormers builds it from finetune_qwen3.yaml over Hugging Face's config.json
QWEN3_32B_MODEL = {
    "family": "llama",
    "num_layers": 64,
    "hidden_size": 5120,
    "num_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "qk_norm": True,
    "ffn_hidden_size": 25600,
    "seq_length": 4096,
    "vocab_size": 151936,
    "dtype": "bfloat16",
    "param_dtype": "float32",
    "optimizer_dtype": "float32",
    "flash_attention": True,
}


def layered(tmp_path, config, body: str, name="layered.yaml"):
    """A config over ``config`` through base_config (MindFormers' chain), ``body`` on top."""
    path = tmp_path / name
    path.write_text(f"base_config: {config}\n{body}")
    return path


def with_folder(tmp_path, config, model="Qwen3-32B", body=""):
    """``config`` pointed at the fixture folder ``model``: ``<config>-<model>.yaml``."""
    name = f"{config.stem}-{model}.yaml"
    return layered(tmp_path, config, f"pretrained_model_dir: {HF / model}\n{body}", name)


def test_qwen3_32b_is_read_from_its_hugging_face_folder(tmp_path, capsys):
    config = with_folder(tmp_path, QWEN3_FINETUNE)
    code, data = init(tmp_path, config, "--backend", "simulate", "--total-steps", "1000")
    assert code == 0, capsys.readouterr().err
    model = {k: v for k, v in data["model"].items() if k not in ("sequence_parallel",)}
    assert {k: model[k] for k in QWEN3_32B_MODEL} == QWEN3_32B_MODEL
    text = (tmp_path / "model.yaml").read_text()
    folder = HF / "Qwen3-32B" / "config.json"
    # each value names where MindFormers takes it: config.json, the YAML, its class defaults
    assert f"# model.model_config.num_hidden_layers (from {folder}: num_hidden_layers)" in text
    assert "# model.model_config.seq_length (from MindFormers' Qwen3Config default)" in text
    assert "modeling_qwen3_train.py" in text  # qk_norm: what the training model builds
    out = capsys.readouterr().out
    assert "model: llama, 32.76 B parameters (64 layers, hidden 5120, 64 heads of 128" in out
    # the same model as MindFormers' config that states the shape in its YAML
    code, stated = init(
        tmp_path, QWEN3_32B, "--backend", "simulate", "--total-steps", "1000", out="b.yaml"
    )
    assert code == 0 and {k: stated["model"][k] for k in QWEN3_32B_MODEL} == QWEN3_32B_MODEL


def test_estimate_prints_qwen3_32b_as_hugging_face_counts_it(tmp_path, capsys):
    init(tmp_path, with_folder(tmp_path, QWEN3_FINETUNE), "--backend", "simulate")
    capsys.readouterr()
    assert main(["estimate", str(tmp_path / "model.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] / 32.8e9 == pytest.approx(1, abs=0.01)  # Hugging Face's "32.8B"
    assert main(["estimate", str(tmp_path / "model.yaml")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("model: llama, 32.76 B parameters (") and "q/k norm" in first
    assert "heads of 128" in first and "flash attention" in first


def test_the_dense_template_over_qwen3_8b(tmp_path, capsys):
    code, data = init(tmp_path, with_folder(tmp_path, DENSE_TEMPLATE, "Qwen3-8B"))
    assert code == 0, capsys.readouterr().err
    m = data["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_heads"], m["num_kv_heads"]) == (
        36,
        4096,
        32,
        8,
    )
    assert "head_dim" not in m  # 32 heads of 128 = 4096: hidden / heads
    assert m["qk_norm"] is True and m["ffn_hidden_size"] == 12288
    assert "model: llama, 8.19 B parameters" in capsys.readouterr().out


def test_the_yaml_wins_over_config_json_key_by_key(tmp_path, capsys):
    body = "model:\n  model_config:\n    num_hidden_layers: 8\n    use_flash_attention: false\n"
    code, data = init(
        tmp_path, with_folder(tmp_path, QWEN3_FINETUNE, body=body), "--total-steps", "10"
    )
    assert code == 0, capsys.readouterr().err
    assert data["model"]["num_layers"] == 8 and data["model"]["hidden_size"] == 5120
    assert data["model"]["flash_attention"] is False
    text = (tmp_path / "model.yaml").read_text()
    assert "num_layers: 8" in text and "# model.model_config.num_hidden_layers\n" in text


def test_a_repeated_key_keeps_its_last_value_with_a_warning(tmp_path, capsys):
    # MindFormers loads a config with yaml.safe_load: the last of a repeated key wins
    body = "model:\n  model_config:\n    num_hidden_layers: 8\n    num_hidden_layers: 4\n"
    code, data = init(
        tmp_path, with_folder(tmp_path, QWEN3_FINETUNE, body=body), "--total-steps", "10"
    )
    assert code == 0 and data["model"]["num_layers"] == 4
    err = capsys.readouterr().err
    assert "model.model_config.num_hidden_layers: given more than once in one mapping" in err
    assert "the last value is kept" in err and "finetune_qwen3-Qwen3-32B.yaml" in err


@pytest.mark.parametrize(
    "config, body, named",
    [
        # as published: the folder is a placeholder
        (
            QWEN3_FINETUNE,
            "",
            "pretrained_model_dir: '/path/to/Qwen3-32B': /path/to/Qwen3-32B/config.json",
        ),
        (DENSE_TEMPLATE, "", "pretrained_model_dir: 'path/to/model_dir': "),
        # a folder without config.json, a model_type in the YAML: the shape is missing
        (
            QWEN3_FINETUNE,
            "model:\n  model_config:\n    model_type: qwen3\n",
            "config.json is not there and model.model_config does not state num_hidden_layers",
        ),
        (
            QWEN3_MOE,
            "model:\n  model_config:\n    moe_layer_freq: 2\n",
            "model.model_config.moe_layer_freq: 2: an MoE layer every 2 layers",
        ),
        (
            QWEN3_32B,
            "model:\n  model_config:\n    model_type: qwen2\n",
            "model_type: 'qwen2': autotune's llama family represents the mcore models qwen3, "
            "qwen3_moe, deepseek_v3; "
            "MindFormers' mcore Qwen2 does not train",
        ),
        (
            QWEN3_32B,
            "model:\n  model_config:\n    hidden_act: gelu\n",
            "model.model_config.hidden_act: 'gelu': autotune's llama family has SiLU",
        ),
        (
            QWEN3_32B,
            "model:\n  model_config:\n    kv_channels: 128\n",
            "model.model_config.kv_channels: MindFormers' converter maps head_dim",
        ),
    ],
)
def test_what_mindformers_would_not_build_as_a_llama_is_refused(
    tmp_path, capsys, config, body, named
):
    path = layered(tmp_path, config, body) if body else config
    code, _ = init(tmp_path, path, "--total-steps", "10")
    err = capsys.readouterr().err
    assert code == 2 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "model.yaml").exists()


def test_config_json_names_itself_in_its_errors(tmp_path, capsys):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    config = layered(tmp_path, QWEN3_FINETUNE, f"pretrained_model_dir: {folder}\n")
    assert init(tmp_path, config, "--total-steps", "10")[0] == 2
    assert f"{folder / 'config.json'}: not a JSON file" in capsys.readouterr().err
    data = json.loads((HF / "Qwen3-32B" / "config.json").read_text()) | {"num_key_value_heads": 7}
    (folder / "config.json").write_text(json.dumps(data))
    assert init(tmp_path, config, "--total-steps", "10")[0] == 2
    err = capsys.readouterr().err
    assert "model.num_kv_heads: 7 does not divide model.num_heads = 64" in err, err


def test_qwen3s_q_k_norm_is_its_training_models_whatever_the_config_says(tmp_path, capsys):
    body = "model:\n  model_config:\n    qk_layernorm: false\n"
    code, data = init(tmp_path, layered(tmp_path, QWEN3_32B, body), "--total-steps", "10")
    assert code == 0 and data["model"]["qk_norm"] is True
    assert "model.model_config.qk_layernorm: False: ignored: MindFormers' Qwen3 training model" in (
        capsys.readouterr().err
    )


def test_the_model_yaml_written_loads_as_written(tmp_path):
    init(tmp_path, with_folder(tmp_path, QWEN3_FINETUNE), "--total-steps", "10")
    data = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert main(["validate", str(tmp_path / "model.yaml")]) == 0
    assert data["export"]["mindformers_base"].endswith("finetune_qwen3-Qwen3-32B.yaml")


def test_total_steps_minus_one_is_counted_from_a_megatron_dataset(tmp_path, capsys):
    # the template: 1000 samples (sizes[0]), 2 epochs, global batch 1 × dp 2 × 2 micro-batches
    code, data = init(tmp_path, with_folder(tmp_path, DENSE_TEMPLATE, "Qwen3-8B"))
    assert code == 0 and data["train"]["global_batch_size"] == 4
    assert data["train"]["total_steps"] == 2 * (1000 // 4)
    assert (
        "lr_schedule.total_steps: -1: 500 steps, as MindFormers derives them: runner_config.epochs "
        "2 × (train_dataset.data_loader.sizes[0] 1000 // global batch 4)"
    ) in capsys.readouterr().err
    # --total-steps still wins
    assert (
        init(
            tmp_path,
            with_folder(tmp_path, DENSE_TEMPLATE, "Qwen3-8B"),
            "--total-steps",
            "7",
            out="b.yaml",
        )[1]["train"]["total_steps"]
        == 7
    )


def test_total_steps_minus_one_is_counted_from_mindrecord_files(tmp_path, capsys):
    """A MindDataset's samples are the rows of its MindRecord index files (MindSpore writes one
    SQLite ``.db`` per data file, a row per sample): a folder of 37 + 11, or one file of 37."""
    import numpy as np
    from mindspore.mindrecord import FileWriter

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name, rows in (("wiki.mindrecord", 37), ("more.mindrecord", 11)):
        writer = FileWriter(str(data_dir / name), shard_num=1)
        writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
        writer.write_raw_data([{"input_ids": np.arange(9, dtype=np.int32)} for _ in range(rows)])
        writer.commit()
    # Qwen2.5-7B at a global batch of 1 × dp 2 × 2 micro-batches, 2 epochs
    layout = (
        "runner_config:\n  batch_size: 1\nparallel_config:\n  micro_batch_num: 2\n"
        "  data_parallel: 2\n  pipeline_stage: 2\n  model_parallel: 1\n"
    )
    for i, (where, samples) in enumerate(((data_dir, 48), (data_dir / "wiki.mindrecord", 37))):
        body = f"train_dataset:\n  data_loader:\n    dataset_dir: {where}\n{layout}"
        config = layered(tmp_path, FIXTURES / "finetune_qwen2_5_7b_8k.yaml", body, f"c{i}.yaml")
        code, data = init(tmp_path, config, "--backend", "simulate", out=f"m{i}.yaml")
        assert code == 0 and data["train"]["global_batch_size"] == 4
        assert data["train"]["total_steps"] == 2 * (samples // 4)
        assert (
            f"the {samples} samples of train_dataset.data_loader.dataset_dir's MindRecord "
            "// global batch 4" in capsys.readouterr().err
        )
