"""``autotune init --mindformers``: MindFormers' published configs in (docs/mindformers.md,
"autotune init --mindformers").

The fixtures are MindFormers' own files, verbatim under a header naming the repository's commit
(tests/fixtures/mindformers/, benchmarks/mindformers_configs/). Every one is read into a
model.yaml whose fields are checked here against the value MindFormers' own rule gives (its
trainer's global batch, its LlamaFeedForward width, its stand-alone and data-parallel resets), or
refused with exit 2 naming the key or the architecture, never a traceback. Dropped settings are
warned about. End to end: init → a simulate search → export merging into the fixture. The slow
tier checks the same fixtures with MindFormers itself (tests/export/test_mindformers_consumer.py).
"""

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.costmodel import estimate
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mindformers"
LLAMA7, LLAMA13, LLAMA70 = (FIXTURES / f"pretrain_llama2_{s}.yaml" for s in ("7b", "13b", "70b"))
QWEN25 = FIXTURES / "finetune_qwen2_5_7b_8k.yaml"
QWEN3 = FIXTURES / "pretrain_qwen3_bf16.yaml"  # a handwritten mcore qwen3 chain, 8 layers
BENCHMARK_CONFIGS = FIXTURES.parents[2] / "benchmarks" / "mindformers_configs"
TINY = FIXTURES.parents[1] / "mindformers" / "tiny_llama_cpu.yaml"
# Fixtures autotune's llama family does not represent: what the refusal names.
REFUSED = {
    "run_gpt2.yaml": "model.arch.type: GPT2LMHeadModel: autotune's llama family represents "
    "LlamaForCausalLM",
    "run_bloom_7.1b.yaml": "model.arch.type: BloomLMHeadModel",
    "run_t5_small_on_wmt16.yaml": "model.arch.type: T5ForConditionalGeneration",
    "finetune_glm4_9b.yaml": "model.arch.type: ChatGLM2ForConditionalGeneration",
    "finetune_baichuan2_13b.yaml": "Baichuan13BV2ForCausalLM would need ALiBi positions",
    "lora_llama2_7b.yaml": "model.model_config.pet_config: parameter-efficient fine-tuning (lora)",
    "finetune_qwen3.yaml": "pretrained_model_dir: '/path/to/Qwen3-32B': "
    "/path/to/Qwen3-32B/config.json is not there",
    "llm_pretrain_dense_template.yaml": "pretrained_model_dir: 'path/to/model_dir': ",
    # r1.3.0's layout: MindFormers 1.9 refuses MoE with tp and no sequence parallelism
    "finetune_deepseek2_236B.yaml": "tp = 8 in a model with experts needs model.sequence_parallel",
    # MindFormers' own mcore DeepSeek-V3 test states no model_type (its runner adds one)
    "deepseekv3_train.yaml": "model.model_config.model_type: is required for an mcore config",
}
EVERY = sorted(FIXTURES.glob("*.yaml")) + sorted(BENCHMARK_CONFIGS.glob("*.yaml")) + [TINY]


def init(tmp_path, config, *flags, out="model.yaml"):
    """Run ``autotune init``; returns (exit code, the written mapping or None)."""
    path = tmp_path / out
    code = main(["init", "--mindformers", str(config), "--out", str(path), *flags])
    return code, (yaml.safe_load(path.read_text()) if code == 0 else None)


def spec_and_space(tmp_path, out="model.yaml"):
    spec = load_spec(tmp_path / out)
    return spec, build_space(spec)


def test_llama2_7b(tmp_path, capsys):
    code, data = init(tmp_path, LLAMA7, "--backend", "simulate", "--total-steps", "1000")
    assert code == 0
    assert data["model"] == {
        "family": "llama",
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "ffn_hidden_size": 11008,
        "seq_length": 4096,
        "vocab_size": 32000,
        "dtype": "float16",
        "param_dtype": "float16",
        "optimizer_dtype": "float32",
        "flash_attention": True,
    }
    # batch_size 1 × dp 8 × gradient_accumulation_steps 8; warmup_ratio 0.03 × 1000
    assert data["train"] == {
        "global_batch_size": 64,
        "learning_rate": 5e-5,
        "total_steps": 1000,
        "save_every": 100,
    }
    assert data["cluster"] == {
        "backend": "simulate",
        "devices": 8,
        "devices_per_node": 8,
        "device": "ascend-910b",
        "max_device_memory_gb": 58.0,
    }
    assert data["baseline"] == {
        "dp": 8,
        "tp": 1,
        "pp": 1,
        "grad_accum": 8,
        "recompute": "none",
        "parallel_optimizer": True,
        "loss_scale": 65536,
        "warmup_steps": 30,
    }
    assert data["export"] == {"mindformers_base": str(LLAMA7)}
    spec, space = spec_and_space(tmp_path)
    base = space.baseline()
    assert {k: getattr(base, k) for k in data["baseline"]} == data["baseline"]
    assert space.contains(base)
    text = (tmp_path / "model.yaml").read_text()
    assert "# runner_config.batch_size 1 × data_parallel 8 × gradient_accumulation_steps 8" in text


def test_llama2_13b_recompute_and_a_loss_scale_of_2_to_the_32(tmp_path):
    code, data = init(tmp_path, LLAMA13, "--backend", "simulate", "--total-steps", "500")
    assert code == 0
    assert data["model"]["ffn_hidden_size"] == 13824 and data["model"]["num_layers"] == 40
    assert data["train"]["global_batch_size"] == 16  # batch_size 2 × dp 8, no accumulation
    assert data["baseline"]["recompute"] == "full" and data["baseline"]["loss_scale"] == 2**32
    assert data["search"]["space"]["loss_scale"] == {"pow2": [8, 32]}
    # simulate fixes the loss scale (the cost model cannot tell scales apart): at the baseline's
    _, space = spec_and_space(tmp_path)
    assert space.domains["loss_scale"] == (2**32,) and space.baseline().loss_scale == 2**32


def test_llama2_70b_gqa_pipeline_and_warnings(tmp_path, capsys):
    code, data = init(tmp_path, LLAMA70, "--backend", "simulate", "--total-steps", "1000")
    assert code == 0
    model = data["model"]
    assert (model["num_heads"], model["num_kv_heads"], model["ffn_hidden_size"]) == (64, 8, 28672)
    assert data["train"]["global_batch_size"] == 256  # 1 × dp 2 × 128 micro-batches
    assert data["cluster"]["devices"] == 64 and data["cluster"]["max_device_memory_gb"] == 56.0
    assert data["baseline"] == {
        "dp": 2,
        "tp": 4,
        "pp": 8,
        "micro_batches": 128,
        "recompute": "none",
        "parallel_optimizer": True,
        "loss_scale": 65536,
        "jit_level": "O1",
        "warmup_steps": 30,
    }
    assert 128 in data["search"]["space"]["micro_batches"] and 8 in data["search"]["space"]["pp"]
    err = capsys.readouterr().err
    # sequence parallelism is the model.yaml's and a simulate study prices it: no warning there
    assert "fine_grain_interleave: 2" in err and "use_seq_parallel" not in err
    assert model["sequence_parallel"] is True
    text = (tmp_path / "model.yaml").read_text()
    assert "# WARNING: model.model_config.fine_grain_interleave" in text
    _, space = spec_and_space(tmp_path)
    assert space.baseline().micro_batches == 128
    # a study that runs autotune's trial does not split activations: init says so
    assert (
        init(tmp_path, LLAMA70, "--backend", "ascend", "--total-steps", "1000", out="a.yaml")[0]
        == 0
    )
    assert "use_seq_parallel: True" in capsys.readouterr().err


def test_more_devices_keep_the_global_batch_and_scale_dp(tmp_path):
    code, data = init(
        tmp_path, LLAMA70, "--total-steps", "10", "--devices", "128", "--backend", "simulate"
    )
    assert code == 0
    assert data["cluster"]["devices"] == 128 and data["train"]["global_batch_size"] == 256
    assert (data["baseline"]["dp"], data["baseline"]["micro_batches"]) == (4, 64)
    assert "# NOTE: --devices 128, not the config's 64" in (tmp_path / "model.yaml").read_text()
    assert init(tmp_path, LLAMA70, "--total-steps", "10", "--devices", "96", out="b.yaml")[0] == 2


def test_total_steps_init_cannot_count_is_priced_as_the_default_and_exported_as_minus_one(
    tmp_path, capsys
):
    """-1 over a MindDataset whose files are not here: model.yaml leaves it null (said in one
    line), the study prices autotune's default, and mindformers.yaml keeps the config's -1 for
    MindFormers to derive — never the default as if it were the dataset's length. A length the
    user gives (--total-steps) is written, over the base and in an overlay alike."""
    from autotune.mindformers.config import UNSTATED_LENGTH, document

    code, data = init(tmp_path, QWEN25, "--backend", "simulate", out="a.yaml")
    assert code == 0 and data["train"]["total_steps"] is None
    assert (
        "lr_schedule.total_steps: -1 (the dataset's length) cannot be counted from the config "
        "here: train.total_steps is left null, a study prices autotune's default 10000 and the "
        "export keeps -1 (MindFormers counts it); pass --total-steps T" in capsys.readouterr().err
    )
    assert init(tmp_path, QWEN25, "--backend", "simulate", "--total-steps", "2000")[0] == 0
    trial = {"study": "q", "number": 0}
    for out, steps in (("a.yaml", None), ("model.yaml", 2000)):
        spec, space = spec_and_space(tmp_path, out)
        assert spec.train.total_steps == (steps or 10000)  # what the study prices
        c = space.baseline()
        merged, changes = document(spec, c, trial, spec.mindformers_base)
        overlay, _ = document(spec, c, trial)
        assert yaml.safe_load(merged)["lr_schedule"]["total_steps"] == (steps or -1)
        assert yaml.safe_load(overlay)["lr_schedule"].get("total_steps") == steps
        assert ("lr_schedule.total_steps" in {ch["key"] for ch in changes}) == bool(steps)
        said = UNSTATED_LENGTH.format(steps=10000)
        assert (said in merged, said in overlay) == (not steps, not steps)


def test_qwen2_5_bf16_gqa_and_per_layer_recompute(tmp_path, capsys):
    code, data = init(tmp_path, QWEN25, "--backend", "simulate", "--total-steps", "2000")
    assert code == 0
    model = data["model"]
    assert (
        model["num_kv_heads"],
        model["ffn_hidden_size"],
        model["dtype"],
        model["param_dtype"],
    ) == (4, 18944, "bfloat16", "float32")
    assert data["train"]["global_batch_size"] == 64  # 1 × dp 4 × 16 micro-batches
    assert data["baseline"]["micro_batches"] == 16 and data["baseline"]["recompute"] == "full"
    assert "loss_scale" not in data["baseline"]  # bfloat16: scale_sense absent, nothing scaled
    err = capsys.readouterr().err
    for key in ("qkv_has_bias", "recompute_config.select_recompute"):
        assert key in err, key  # the last: patterns beyond MindFormers' defaults
    # recompute: [7, 7] over 2 stages of 14 layers: the first 7 of each whole; the selective
    # patterns on the first 14 of each stage, i.e. every layer
    assert model["recompute_layers"] == {
        "recompute": [*range(7), *range(14, 21)],
        "select_recompute": True,
    }
    assert model["sequence_parallel"] is True
    spec_and_space(tmp_path)
    # bfloat16 does not run on the CPU backend: init says so before writing anything
    assert init(tmp_path, QWEN25, "--backend", "cpu", "--total-steps", "10", out="c.yaml")[0] == 2
    assert "model.dtype" in capsys.readouterr().err and not (tmp_path / "c.yaml").exists()


def _variant(tmp_path, name, body):
    """A config layered on the 7B fixture through base_config (MindFormers' chain)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"base_config: {LLAMA7}\n" + textwrap.dedent(body))
    return path


@pytest.mark.parametrize(
    "name, body, named",
    [
        (
            "moe",
            "moe_config:\n  expert_num: 8\n  num_experts_chosen: 9\n",
            "model.experts_per_token: 9 > model.num_experts = 8",
        ),
        (
            "qknorm",
            "model:\n  model_config:\n    qk_layernorm: true\n",
            "model.model_config.qk_layernorm: q/k layernorm: MindFormers' legacy "
            "LlamaForCausalLM builds none",
        ),
        (
            "cp",
            "parallel_config:\n  context_parallel: 2\n"
            "model:\n  model_config:\n    use_flash_attention: false\n",
            "cp = 2 needs model.flash_attention (MindFormers' rule)",
        ),
        (
            "nohidden",
            "model:\n  model_config:\n    hidden_size: null\n",
            "model.model_config.hidden_size",
        ),
        (
            "badscale",
            "runner_wrapper:\n  scale_sense:\n    loss_scale_value: 0\n",
            "runner_wrapper.scale_sense.loss_scale_value",
        ),
    ],
)
def test_what_cannot_be_represented_is_refused_naming_the_key(tmp_path, capsys, name, body, named):
    code, _ = init(tmp_path, _variant(tmp_path, name, body), "--total-steps", "10")
    assert code == 2
    err = capsys.readouterr().err
    assert named in err and f"{name}.yaml" in err
    assert not (tmp_path / "model.yaml").exists()


def test_refusals_on_real_files(tmp_path, capsys):
    assert init(tmp_path, tmp_path / "absent.yaml")[0] == 2
    assert "absent.yaml" in capsys.readouterr().err
    (tmp_path / "model.yaml").write_text("keep me")
    assert init(tmp_path, LLAMA7, "--total-steps", "10")[0] == 2
    assert (
        "--force" in capsys.readouterr().err and (tmp_path / "model.yaml").read_text() == "keep me"
    )


def test_dropped_settings_warn(tmp_path, capsys):
    body = """\
        micro_batch_interleave_num: 2
        model:
          model_config:
            qkv_concat: true
            offset: [1, -1]
            tie_word_embeddings: true
        """
    code, data = init(
        tmp_path, _variant(tmp_path, "warn", body), "--total-steps", "10", "--backend", "simulate"
    )
    assert code == 0
    err = capsys.readouterr().err
    for key in ("micro_batch_interleave_num: 2", "qkv_concat", "offset", "tie_word_embeddings"):
        assert key in err, key
    assert data["train"]["global_batch_size"] == 128  # the interleave counts (semi-auto)


def test_a_baseline_outside_the_space_is_refused(tmp_path, capsys):
    assert init(tmp_path, LLAMA7, "--backend", "simulate", "--total-steps", "100")[0] == 0
    data = yaml.safe_load((tmp_path / "model.yaml").read_text())
    data["search"]["space"]["grad_accum"] = [1, 2]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "bad.yaml")]) == 2
    assert "baseline.grad_accum: 8 is not in the search space" in capsys.readouterr().err
    data["baseline"]["warp"] = 3
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "bad.yaml")]) == 2
    assert "baseline.warp: unknown knob" in capsys.readouterr().err


def _search(tmp_path, storage, trials=5):
    assert init(tmp_path, LLAMA7, "--backend", "simulate", "--total-steps", "1000")[0] == 0
    assert (
        main(
            [
                "search",
                str(tmp_path / "model.yaml"),
                "--storage",
                storage,
                "--trials",
                str(trials),
                "--artifacts",
                str(tmp_path / "trials"),
            ]
        )
        == 0
    )
    return optuna.load_study(study_name="llama2_7b", storage=storage)


def test_init_search_export_merges_into_the_config(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    study = _search(tmp_path, storage)
    first = study.trials[0]
    assert first.user_attrs["baseline"] is True
    assert (first.user_attrs["dp"], first.user_attrs["grad_accum"]) == (8, 8)
    assert main(["export", "llama2_7b", "--storage", storage, "--out", str(tmp_path / "x")]) == 0
    assert f"mindformers.yaml: {LLAMA7}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["mindformers"]["base"] == str(LLAMA7)
    merged = yaml.safe_load((tmp_path / "x" / "mindformers.yaml").read_text())
    assert merged["model"]["model_config"]["hidden_size"] == 4096  # the fixture, merged into
    assert merged["trainer"]["model_name"] == "llama2_7b"
    # the model.yaml's base is gone at export time: a clear error naming it
    moved = tmp_path / "pretrain_llama2_7b.yaml"
    moved.write_text(LLAMA7.read_text())
    data = yaml.safe_load((tmp_path / "model.yaml").read_text())
    data["export"]["mindformers_base"] = str(tmp_path / "gone.yaml")
    study.set_user_attr("model_yaml", data)
    assert main(["export", "llama2_7b", "--storage", storage, "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "export.mindformers_base" in err and "gone.yaml" in err
    assert (
        main(
            [
                "export",
                "llama2_7b",
                "--storage",
                storage,
                "--out",
                str(tmp_path / "y"),
                "--mindformers-base",
                str(moved),
            ]
        )
        == 0
    )


def test_the_configs_own_baseline_is_feasible_and_the_ratio_is_against_it(tmp_path, capsys):
    study = _search(tmp_path, f"sqlite:///{tmp_path}/s.db", trials=4)
    assert study.trials[0].user_attrs["outcome"] == "ok"
    assert "vs baseline #0" in capsys.readouterr().out


def test_published_mindformers_runs_are_estimated_from_their_own_configs(tmp_path):
    # MindFormers' Llama 2 runs on Atlas 800T A2 (benchmarks/mindformers_runs.yaml, the figures
    # benchmarks/costmodel_validation.py's Table 3 prints), each config through autotune init as
    # a user would run it, its baseline priced as the simulate study prices it
    runs = yaml.safe_load(
        (BENCHMARK_CONFIGS.parent / "mindformers_runs.yaml").read_text(encoding="utf-8")
    )["runs"]
    assert len(runs) >= 3
    baselines = {}
    for run in runs:
        out = run["config"].replace(".yaml", ".model.yaml")
        assert (
            init(
                tmp_path,
                BENCHMARK_CONFIGS / run["config"],
                "--backend",
                "simulate",
                "--total-steps",
                "1000",
                out=out,
            )[0]
            == 0
        )
        spec, space = spec_and_space(tmp_path, out)
        c = baselines[run["config"]] = space.baseline()
        est = estimate(spec, c)
        tokens = est.samples_per_s * spec.model.seq_length / c.devices
        # tokens/s/device within table 3's ±15% of the published figure (docs/costmodel.md;
        # the ascend-910b profile's achievable fraction is fitted on the rows marked "tune")
        assert abs(tokens / run["tokens_per_s_per_device"] - 1) < 0.15, (run, tokens)
        # every published run fitted its max_device_memory
        assert est.memory_gb_per_device <= spec.cluster.max_device_memory_gb, run
    seventy = "finetune_llama2_70b_bf16_32p.yaml"
    c = baselines[seventy]
    assert (c.dp, c.tp, c.pp) == (1, 4, 8)
    # the 70B fits its 53 GB only through sequence parallelism and per-stage recompute, which
    # init reads from the config and the simulate study's engine prices
    spec = load_spec(tmp_path / seventy.replace(".yaml", ".model.yaml"))
    assert spec.model.sequence_parallel and spec.model.recompute_layers == {
        key: [*range(8), *range(10, 14), *range(20, 24), 30, 40, 50, 60, 70]
        for key in ("select_recompute", "select_comm_recompute")
    }
    plain = replace(spec.model, sequence_parallel=False, recompute_layers={})
    assert (
        estimate(replace(spec, model=plain), c).memory_gb_per_device
        > spec.cluster.max_device_memory_gb
    )


def test_estimate_takes_the_baseline_and_set_wins_over_it(tmp_path, capsys):
    assert init(tmp_path, LLAMA7, "--backend", "simulate", "--total-steps", "1000")[0] == 0
    capsys.readouterr()
    model = str(tmp_path / "model.yaml")
    assert main(["estimate", model, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["candidate"]
    assert (out["dp"], out["grad_accum"], out["parallel_optimizer"]) == (8, 8, True)
    assert (
        main(["estimate", model, "--set", "parallel_optimizer=false", "--set", "tp=2", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)["candidate"]
    assert (out["dp"], out["tp"], out["grad_accum"], out["parallel_optimizer"]) == (4, 2, 8, False)


@pytest.mark.parametrize("config", EVERY, ids=[p.name for p in EVERY])
def test_every_fixture_is_read_or_refused_by_name(tmp_path, capsys, config):
    # no --total-steps: a config's -1 is counted from its dataset or defaulted, in one line
    code, data = init(tmp_path, config, "--backend", "simulate")
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if config.name in REFUSED:
        assert code == 2 and REFUSED[config.name] in err, err
        assert str(config) in err and not (tmp_path / "model.yaml").exists()
    else:
        assert code == 0, err
        assert data["model"]["family"] == "llama" and data["cluster"]["device"]
        spec_and_space(tmp_path)


def test_a_qwen_warmup_of_one_percent_stays_the_baselines_on_a_real_backend(tmp_path, capsys):
    """The baseline's 10 warmup steps of 1000 compress to 0 in a 30-step trial, like 0 and 5:
    merge_warmups keeps 10 as their group's value, so the baseline is in the space."""
    code, data = init(tmp_path, FIXTURES / "finetune_qwen2.5_72B_32K.yaml", "--total-steps", "1000")
    assert code == 0, capsys.readouterr().err
    assert data["cluster"]["backend"] == "ascend" and data["baseline"]["warmup_steps"] == 10
    # 1 × dp 1 × micro_batch_num 32; qkv biases dropped
    assert data["train"]["global_batch_size"] == 32 and data["model"]["ffn_hidden_size"] == 29568
    _, space = spec_and_space(tmp_path)
    assert 10 in space.domains["warmup_steps"] and space.baseline().warmup_steps == 10


def test_use_parallel_false_is_one_device_stand_alone(tmp_path):
    # KnowLM-13B: use_parallel False with parallel_config dp 2, mp 4, pp 2 and 16 micro-batches:
    # MindFormers sets no parallel context and resets parallel_config, so one device runs
    # batch_size 4 (BaseTrainer._check_global_batch_size_for_auto_parallel, stand-alone branch)
    code, data = init(
        tmp_path, FIXTURES / "run_knowlm_13b.yaml", "--total-steps", "1000", "--backend", "simulate"
    )
    assert code == 0
    assert data["cluster"]["devices"] == 1 and data["train"]["global_batch_size"] == 4
    assert data["baseline"] | {"recompute": None} == {
        "dp": 1,
        "tp": 1,
        "pp": 1,
        "grad_accum": 1,
        "recompute": None,
        "parallel_optimizer": False,
        "loss_scale": 65536,
        "warmup_steps": 30,
    }
    assert data["model"]["ffn_hidden_size"] == 13824  # 4·5120·2/3 up to a multiple of 256
    assert (
        "# NOTE: use_parallel: False: MindFormers runs it stand-alone"
        in (tmp_path / "model.yaml").read_text()
    )


def test_data_parallel_mode_resets_the_layout_as_mindformers_does(tmp_path):
    # parallel_mode 0: every launched device a data-parallel rank, accumulation reset to 1
    body = "parallel:\n  parallel_mode: 0\nparallel_config:\n  model_parallel: 2\n"
    code, data = init(
        tmp_path, _variant(tmp_path, "dp0", body), "--total-steps", "10", "--backend", "simulate"
    )
    assert code == 0
    assert (data["cluster"]["devices"], data["train"]["global_batch_size"]) == (16, 16)
    assert (data["baseline"]["dp"], data["baseline"]["tp"], data["baseline"]["grad_accum"]) == (
        16,
        1,
        1,
    )


def test_o2_vocab_emb_dp_and_kv_channels_are_read_with_a_warning(tmp_path, capsys):
    code, data = init(
        tmp_path,
        FIXTURES / "finetune_codellama_34b_16p.yaml",
        "--total-steps",
        "1000",
        "--backend",
        "simulate",
    )
    assert code == 0 and data["baseline"]["jit_level"] == "O1"
    assert (
        "context.jit_config.jit_level: O2: the GE backend, deprecated since MindSpore 2.9"
        in capsys.readouterr().err
    )
    # CodeLlama-34B: 4·8192·2/3 up to a multiple of 256 = 22016; 1 × dp 1 × 128 micro-batches
    assert data["model"]["ffn_hidden_size"] == 22016 and data["train"]["global_batch_size"] == 128
    code, _ = init(
        tmp_path,
        FIXTURES / "run_codellama_34b_910b.yaml",
        "--total-steps",
        "1000",
        "--backend",
        "simulate",
        out="b.yaml",
    )
    assert code == 0
    assert (
        "parallel_config.vocab_emb_dp: True with model_parallel 8: MindFormers keeps the "
        "embedding whole" in capsys.readouterr().err
    )
    # Qwen1.5-0.5B: kv_channels 16 is not 1024 / 16 = 64, and the legacy llama ignores it
    code, data = init(
        tmp_path,
        FIXTURES / "finetune_qwen1_5_05b.yaml",
        "--total-steps",
        "1000",
        "--backend",
        "simulate",
        out="c.yaml",
    )
    assert code == 0 and data["model"]["num_heads"] == 16
    assert "model.model_config.kv_channels: 16: ignored" in capsys.readouterr().err
    # an mcore model's heads are head_dim wide (Qwen3's): the llama family's head_dim
    body = (
        "use_legacy: False\nmodel:\n  model_config:\n    model_type: qwen3\n    head_dim: 256\n"
        "    num_hidden_layers: 32\n    num_attention_heads: 32\n    intermediate_size: 11008\n"
    )
    code, data = init(
        tmp_path, _variant(tmp_path, "mcore", body), "--total-steps", "10", out="d.yaml"
    )
    assert code == 0 and (data["model"]["head_dim"], data["model"]["qk_norm"]) == (256, True)


def test_cluster_device_is_written_for_every_backend(tmp_path):
    # a CPU config on simulate is priced as the CPU (the export then targets it), and an Ascend
    # config run on the CPU backend as the CPU it runs on
    assert init(tmp_path, TINY, "--backend", "simulate")[1]["cluster"]["device"] == "cpu"
    data = init(tmp_path, LLAMA7, "--backend", "cpu", "--total-steps", "10", out="b.yaml")[1]
    assert data["cluster"]["device"] == "cpu" and "max_device_memory_gb" not in data["cluster"]
    data = init(tmp_path, LLAMA7, "--total-steps", "10", out="c.yaml")[1]
    assert (data["cluster"]["backend"], data["cluster"]["device"]) == ("ascend", "ascend-910b")
