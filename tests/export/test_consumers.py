"""The exported files read the way their consumers read them.

- launch.yaml: every section passed to MindSpore 2.10's own set_device / set_context / JitConfig /
  set_auto_parallel_context, for a CPU export of every layout, with no error and no deprecation
  warning; what MindSpore refuses on CPU (Ascend, O2) is checked by value.
- mindformers.yaml: MindFormers cannot be installed next to autotune (docs/mindformers.md), so
  its merge and global-batch rules are transcribed below from its source for this fast tier; the
  slow tier runs MindFormers itself over the same kind of exports, templates and LayerSetting
  included (tests/export/test_mindformers_consumer.py). The merged config of every layout must give
  MindFormers' trainer the tuned global batch, warmup, layout and no interleave.
- strategy.ckpt: MindFormers' llama and mcore parameter names (and their Adam moments) are split
  as MindFormers' layers split them.
- launch.sh --mindformers: the command MindFormers is started with.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ms = pytest.importorskip("mindspore")
from mindspore.parallel import build_searched_strategy  # noqa: E402

from autotune.export import write_export  # noqa: E402
from autotune.export.strategy import write_strategies  # noqa: E402
from autotune.families.llama import MINDFORMERS_RULES  # noqa: E402
from autotune.layout import plan_layout, with_optimizer_states  # noqa: E402
from autotune.mindformers.config import LEGACY_MODEL_KEYS  # noqa: E402
from autotune.spec.errors import SpecError  # noqa: E402
from tests.export.test_export import TRIAL, _fake_bin, candidate, make_spec  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mindformers"
LLAMA2 = FIXTURES / "pretrain_llama2_7b.yaml"
QWEN3 = FIXTURES / "pretrain_qwen3_bf16.yaml"
# Every (dp, tp, pp) of 8 devices the test model (2 layers, 2 heads) can take, and its knobs.
LAYOUTS = {
    "dp8": dict(dp=8, tp=1, pp=1, micro_batches=1, grad_accum=2),
    "dp4-tp2": dict(dp=4, tp=2, pp=1, micro_batches=1, grad_accum=4),
    "dp4-pp2": dict(dp=4, tp=1, pp=2, micro_batches=2, grad_accum=1),
    "dp2-tp2-pp2": dict(dp=2, tp=2, pp=2, micro_batches=4, grad_accum=1),
}
GLOBAL_BATCH = 16  # make_spec's train.global_batch_size


# --- MindFormers, transcribed -----------------------------------------------------------------


def mindformers_merge_a_into_b(a, b):
    """mindformers/tools/register/config.py, MindFormerConfig._merge_a_into_b, as written there."""
    b = b.copy() if b is not None else a.copy()
    for k, v in a.items():
        if isinstance(v, dict) and k in b:
            b[k] = mindformers_merge_a_into_b(v, b[k])
        else:
            b[k] = v
    return b


def mindformers_global_batch(cfg: dict, device_num: int) -> int:
    """mindformers/trainer/base_trainer.py: _check_grad_accumulation_steps, then
    _check_global_batch_size_for_auto_parallel (full_batch True and False give the same product)."""
    runner, par = cfg["runner_config"], cfg["parallel_config"]
    semi = cfg["parallel"]["parallel_mode"] in (1, 2)  # semi_auto_parallel, auto_parallel
    batch, accumulation, pp = (
        runner["batch_size"],
        runner["gradient_accumulation_steps"],
        par["pipeline_stage"],
    )
    if semi and pp > 1 and accumulation > 1:
        accumulation = 1  # "will not take effect when using pipeline parallel"
    if accumulation > 1 and not semi:
        accumulation = 1  # "currently need to be used in semi_auto_parallel mode"
    interleave = cfg["micro_batch_interleave_num"]
    if not semi:
        return batch * device_num * accumulation
    if pp > 1:
        return batch * par["data_parallel"] * par["micro_batch_num"] * interleave
    return batch * par["data_parallel"] * interleave * accumulation


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def legacy_listed(folder) -> dict:
    """The legacy llama's settings an overlay's header lists, by their dotted paths, with their
    values, for a legacy base (`autotune.mindformers.config`: the overlay itself carries none,
    its base's kind unknown)."""
    lines = (folder / "mindformers.yaml").read_text().splitlines()
    return yaml.safe_load("".join(f"{x[6:]}\n" for x in lines if x.startswith("#     "))) or {}


def export(tmp_path, name, knobs, dtype="float16", base=None, devices_per_node=8, **spec_args):
    out = tmp_path / name
    spec = make_spec(tmp_path, devices_per_node=devices_per_node, dtype=dtype, **spec_args)
    write_export(spec, candidate(**knobs), TRIAL, out, mindformers_base=str(base) if base else None)
    return out


# --- launch.yaml into MindSpore -----------------------------------------------------------------

APPLY = r"""
import json, sys
import yaml
import mindspore as ms
results = []
for path in sys.argv[1:]:
    doc = yaml.safe_load(open(path))
    ms.set_device(**doc["device"])
    ms.set_context(**doc["context"])
    cell = ms.nn.Dense(2, 2)
    if "jit_config" in doc:
        cell.set_jit_config(ms.JitConfig(**doc["jit_config"]))
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(**doc["auto_parallel_context"])
    results.append({"mode": ms.get_context("mode"), "device": ms.get_context("device_target"),
                    "parallel_mode": ms.get_auto_parallel_context("parallel_mode"),
                    "pipeline_stages": ms.get_auto_parallel_context("pipeline_stages"),
                    "device_num": ms.get_auto_parallel_context("device_num"),
                    "optimizer_shard": ms.get_auto_parallel_context("enable_parallel_optimizer")})
print(json.dumps(results))
"""


def test_launch_yaml_sections_are_mindspores_own_call_arguments(tmp_path):
    cases = {name: dict(knobs) for name, knobs in LAYOUTS.items()}
    cases["dp8-O0"] = dict(LAYOUTS["dp8"], jit_level="O0")
    cases["dp8-pynative"] = dict(LAYOUTS["dp8"], grad_accum=1, jit_level="pynative")
    paths = [
        export(tmp_path, name, knobs, backend="cpu") / "launch.yaml"
        for name, knobs in cases.items()
    ]
    done = subprocess.run(
        [sys.executable, "-c", APPLY, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GLOG_v": "2"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "deprecated" not in done.stderr, (
        done.stderr
    )  # set_context(device_target=…, jit_config=…)
    for (name, knobs), got in zip(cases.items(), json.loads(done.stdout.splitlines()[-1])):
        pynative = knobs.get("jit_level") == "pynative"
        assert got["mode"] == (ms.PYNATIVE_MODE if pynative else ms.GRAPH_MODE), name
        assert got["device"] == "CPU" and got["device_num"] == 8 and got["optimizer_shard"] is False
        split = knobs["tp"] > 1 or knobs["pp"] > 1
        assert got["parallel_mode"] == ("semi_auto_parallel" if split else "data_parallel"), name
        assert got["pipeline_stages"] == knobs["pp"], name


def test_accelerator_launch_yaml_by_value(tmp_path):
    # Ascend cannot be set up on this CPU machine: its values are what MindSpore takes.
    doc = read_yaml(
        export(tmp_path, "o1", dict(LAYOUTS["dp2-tp2-pp2"], jit_level="O1"), device="ascend-910b")
        / "launch.yaml"
    )
    assert doc["device"] == {"device_target": "Ascend"}
    assert doc["context"] == {"mode": ms.GRAPH_MODE} and doc["jit_config"] == {"jit_level": "O1"}
    assert ms.JitConfig(**doc["jit_config"]).jit_config_dict["backend"] == "ms_backend"
    gpu = read_yaml(export(tmp_path, "gpu", LAYOUTS["dp8"]) / "launch.yaml")
    assert gpu["device"] == {"device_target": "GPU"}


# --- mindformers.yaml ---------------------------------------------------------------------------


def test_overlay_merged_over_llama2_is_what_mindformers_rule_gives(tmp_path):
    out = export(
        tmp_path,
        "dp8",
        dict(LAYOUTS["dp8"], fusion_mb=16, loss_scale=2**12, warmup_steps=50),
        device="ascend-910b",
        base=LLAMA2,
    )
    merged = read_yaml(out / "mindformers.yaml")
    # The expectation, by hand: the base as MindFormers reads it, each tuned key set over it.
    expected = read_yaml(LLAMA2)
    expected["context"]["jit_config"] = {"jit_level": "O1"}
    expected["parallel"]["enable_parallel_optimizer"] = False
    expected["parallel"]["comm_fusion"] = {"allreduce": {"mode": "size", "config": 16}}
    expected["parallel_config"]["context_parallel"] = 1
    expected["runner_config"].update(batch_size=1, gradient_accumulation_steps=2)
    expected["runner_wrapper"]["scale_sense"]["loss_scale_value"] = 2**12
    expected["lr_schedule"] = {
        "type": "CosineWithWarmUpLR",
        "learning_rate": 2e-3,
        "lr_end": 0.0,
        "warmup_ratio": None,
        "total_steps": 500,
        "warmup_steps": 50,
        "warmup_lr_init": 0.0,
        "num_cycles": 0.5,
        "decay_steps": None,
        "decay_ratio": None,
    }
    expected["recompute_config"]["select_recompute"] = True
    expected["model"]["model_config"]["parallel_optimizer"] = False
    assert merged == expected
    changes = json.loads((out / "summary.json").read_text())["mindformers"]["changes"]
    # every key whose value moved ("absent": the base did not have it); lr_end 0 -> 0.0 is no change
    assert {c["key"]: c.get("old", "absent") for c in changes} == {
        "context.jit_config": "absent",
        "parallel.enable_parallel_optimizer": True,
        "parallel.comm_fusion": "absent",
        "parallel_config.context_parallel": "absent",
        "runner_config.gradient_accumulation_steps": 8,
        "runner_wrapper.scale_sense.loss_scale_value": 65536,
        "lr_schedule.learning_rate": 5e-5,
        "lr_schedule.warmup_steps": "absent",
        "lr_schedule.warmup_ratio": 0.03,
        "lr_schedule.total_steps": -1,
        "lr_schedule.warmup_lr_init": "absent",
        "lr_schedule.num_cycles": "absent",
        "lr_schedule.decay_steps": "absent",
        "lr_schedule.decay_ratio": "absent",
        "recompute_config.select_recompute": False,
        "model.model_config.parallel_optimizer": "absent",
    }
    header = (out / "mindformers.yaml").read_text().split("\nseed:")[0]
    assert "#   parallel.enable_parallel_optimizer: true -> false" in header
    assert "#   lr_schedule.warmup_ratio: 0.03 -> null" in header
    assert "#   parallel.comm_fusion: (absent) -> " in header


def test_a_tuned_parallel_optimizer_stays_on_over_a_base_that_has_it_on(tmp_path):
    out = export(
        tmp_path,
        "po",
        dict(LAYOUTS["dp8"], parallel_optimizer=True),
        device="ascend-910b",
        base=LLAMA2,
    )
    merged = read_yaml(out / "mindformers.yaml")
    base = read_yaml(LLAMA2)
    assert merged["parallel"]["enable_parallel_optimizer"] is True
    # the base's own threshold (and its gradient_accumulation_shard) are kept as they were
    assert (
        merged["parallel"]["parallel_optimizer_config"]
        == base["parallel"]["parallel_optimizer_config"]
    )
    changes = json.loads((out / "summary.json").read_text())["mindformers"]["changes"]
    # the legacy llama's embedding joins the sharding only when its model_config says so
    assert [c for c in changes if "parallel_optimizer" in c["key"]] == [
        {"key": "model.model_config.parallel_optimizer", "new": True}
    ]
    # the optimizer's all-gathers and reduce-scatters are bucketed at the tuned threshold too
    assert merged["parallel"]["comm_fusion"] == {
        bucket: {"mode": "size", "config": 16}
        for bucket in ("allreduce", "allgather", "reducescatter")
    }
    assert "optimizer_shard" not in json.dumps(merged["parallel_config"])
    # without a base, the overlay turns it on with MindFormers' default threshold
    overlay = read_yaml(
        export(
            tmp_path,
            "po-overlay",
            dict(LAYOUTS["dp8"], parallel_optimizer=True),
            device="ascend-910b",
        )
        / "mindformers.yaml"
    )
    assert overlay["parallel"]["enable_parallel_optimizer"] is True
    assert overlay["parallel"]["parallel_optimizer_config"] == {"parallel_optimizer_threshold": 64}


@pytest.mark.parametrize(
    "base, dtype", [(LLAMA2, "float16"), (QWEN3, "bfloat16")], ids=["llama2", "qwen3-bf16"]
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_trains_as_tuned_under_mindformers(tmp_path, base, dtype, layout):
    knobs = LAYOUTS[layout]
    out = export(
        tmp_path, layout, dict(knobs, warmup_steps=50), dtype=dtype, device="ascend-910b", base=base
    )
    merged = read_yaml(out / "mindformers.yaml")
    assert "base_config" not in merged  # complete: MindFormers reads it as is
    assert mindformers_global_batch(merged, device_num=8) == GLOBAL_BATCH
    par, pc = merged["parallel"], merged["parallel_config"]
    assert (pc["data_parallel"], pc["model_parallel"], pc["pipeline_stage"]) == (
        knobs["dp"],
        knobs["tp"],
        knobs["pp"],
    )
    assert pc.get("context_parallel", 1) == 1 and merged["model"]["model_config"]["offset"] == 0
    assert pc["vocab_emb_dp"] is (knobs["tp"] == 1)  # vocab-parallel embedding, as strategy.ckpt
    assert par["parallel_mode"] == 1 and par["full_batch"] is True  # pure DP too: accumulation kept
    assert par["enable_parallel_optimizer"] is False and merged["micro_batch_interleave_num"] == 1
    assert "strategy_ckpt_load_file" not in par
    assert merged["use_parallel"] is True and merged["run_mode"] == "train"
    lr = merged["lr_schedule"]
    assert (lr["type"], lr["warmup_steps"], lr["warmup_ratio"], lr["total_steps"]) == (
        "CosineWithWarmUpLR",
        50,
        None,
        500,
    )
    scale = merged["runner_wrapper"]["scale_sense"]
    if dtype == "bfloat16":
        assert scale == 1.0  # MindFormers' bf16 configs: no loss scaling
    else:
        assert scale == {
            "type": "DynamicLossScaleUpdateCell",
            "loss_scale_value": 2**12,
            "scale_factor": 2,
            "scale_window": 1000,
        }
    # The overlay alone, merged by MindFormers' own rule over the same base, is the same config.
    alone = export(
        tmp_path,
        f"{layout}-overlay",
        dict(knobs, warmup_steps=50),
        dtype=dtype,
        device="ascend-910b",
    )
    overlay = read_yaml(alone / "mindformers.yaml")
    assert overlay.pop("base_config") == "SET-ME-your-model-mindformers-config.yaml"
    # no legacy llama key, which an mcore base's converter refuses: the header lists them, with
    # the values the run has, for a legacy base (the user adds them there)
    model_config, listed = overlay["model"]["model_config"], legacy_listed(alone)
    keys = {k.removeprefix("model.model_config."): v for k, v in listed.items()}
    assert not set(LEGACY_MODEL_KEYS) & set(model_config) and set(keys) <= set(LEGACY_MODEL_KEYS)
    if base == QWEN3:
        assert not set(LEGACY_MODEL_KEYS) & set(merged["model"]["model_config"])
    else:
        model_config.update(keys)
    assert mindformers_merge_a_into_b(overlay, base_as_mindformers_reads_it(base)) == merged
    # MindFormers' own section templates check every key: tests/export/test_mindformers_consumer.py


def base_as_mindformers_reads_it(path: Path) -> dict:
    """MindFormerConfig._file2dict, transcribed: the file over its base_config files."""
    cfg = read_yaml(path)
    if "base_config" not in cfg:
        return cfg
    names = cfg.pop("base_config")
    base = {}
    for name in names if isinstance(names, list) else [names]:
        base.update(base_as_mindformers_reads_it(path.parent / name))
    return mindformers_merge_a_into_b(cfg, base)


def test_qwen3_base_chain_and_what_changes(tmp_path):
    out = export(
        tmp_path, "q", LAYOUTS["dp2-tp2-pp2"], dtype="bfloat16", device="ascend-910b", base=QWEN3
    )
    merged = read_yaml(out / "mindformers.yaml")
    # the chain: pretrain_qwen3_bf16.yaml over qwen3_common.yaml
    assert merged["runner_config"]["epochs"] == 1 and merged["optimizer"]["type"] == "AdamW"
    assert merged["model"]["model_config"]["num_hidden_layers"] == 8
    assert merged["use_legacy"] is False and merged["context"]["ascend_config"]["precision_mode"]
    changes = {
        c["key"]: (c.get("old"), c["new"])
        for c in json.loads((out / "summary.json").read_text())["mindformers"]["changes"]
    }
    assert changes["lr_schedule.type"] == ("ConstantWarmUpLR", "CosineWithWarmUpLR")
    assert changes["lr_schedule.warmup_ratio"] == (0.01, None)
    assert changes["model.model_config.offset"] == ([-1, -1, 1, 1], 0)
    assert changes["parallel.full_batch"] == (False, True)
    assert changes["parallel_config.model_parallel"] == (4, 2)
    assert changes["parallel_config.vocab_emb_dp"] == (True, False)
    assert "runner_wrapper.scale_sense" not in changes  # 1.0 stays 1.0


def test_an_mcore_base_without_compute_dtype_computes_in_bfloat16(tmp_path):
    """TransformerConfig's default compute_dtype is bfloat16 (a Hugging Face config.json's
    torch_dtype is not read): a float16 study does not export over such a base."""
    base = tmp_path / "mcore.yaml"
    base.write_text("use_legacy: False\nmodel:\n  model_config:\n    model_type: qwen3\n")
    with pytest.raises(SpecError, match="compute_dtype is 'bfloat16' but the study tuned"):
        export(tmp_path, "never", LAYOUTS["dp8"], base=base, device="ascend-910b")
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text("model:\n  model_config:\n    type: LlamaConfig\n")
    assert export(tmp_path, "ok", LAYOUTS["dp8"], base=legacy, device="ascend-910b").is_dir()


def test_mindformers_rule_cannot_merge_a_loss_scaler_over_a_number(tmp_path):
    """What the old overlay did to a bf16 base: MindFormers' merge crashes; with --mindformers-base
    the export replaces the number and reports it, and a bad base is an error naming its file."""
    with pytest.raises(AttributeError):
        mindformers_merge_a_into_b(
            {"scale_sense": {"type": "DynamicLossScaleUpdateCell"}}, {"scale_sense": 1.0}
        )
    fp16_base = tmp_path / "fp16.yaml"
    fp16_base.write_text(
        f"base_config: {QWEN3}\nmodel:\n  model_config:\n    compute_dtype: float16\n"
    )
    out = export(tmp_path, "out", LAYOUTS["dp8"], base=fp16_base, device="ascend-910b")
    changes = json.loads((out / "summary.json").read_text())["mindformers"]["changes"]
    assert {
        "key": "runner_wrapper.scale_sense",
        "old": 1.0,
        "new": {
            "type": "DynamicLossScaleUpdateCell",
            "loss_scale_value": 2**12,
            "scale_factor": 2,
            "scale_window": 1000,
        },
    } in changes
    conflict = f"base_config: {QWEN3}\nrunner_wrapper:\n  scale_sense: {{type: DynamicLossScaleUpdateCell}}\n"
    for text, message in (
        (
            conflict,
            "cannot merge it over its base_config: runner_wrapper.scale_sense: "
            "a mapping cannot be merged over 1.0",
        ),
        ("model: [unclosed\n", "not valid YAML"),
        ("base_config: missing.yaml\n", "missing.yaml: cannot read"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(SpecError, match=message):
            export(tmp_path, "never", LAYOUTS["dp8"], base=bad, device="ascend-910b")
        assert not (tmp_path / "never").exists()
    with pytest.raises(
        SpecError, match="compute_dtype is 'bfloat16' but the study tuned model.dtype 'float16'"
    ):
        export(tmp_path, "never", LAYOUTS["dp8"], base=QWEN3, device="ascend-910b")


# --- strategy.ckpt under MindFormers' parameter names ------------------------------------------

H, F, V, HD = 16, 32, 64, 4
# name → (shape, the dimension MindFormers' layer splits over tp): written from its shard() calls
# (docs/mindformers.md, "Parameter names"). Legacy llama (use_legacy: True) with qkv and ffn
# concatenation on layer 1 and off on layer 0:
LLAMA_NAMES = {
    "model.tok_embeddings.embedding_weight": ((V, H), 0),
    "model.layers.0.attention.wq.weight": ((H, H), 0),
    "model.layers.0.attention.wk.weight": ((H, H), 0),
    "model.layers.0.attention.wv.weight": ((H, H), 0),
    "model.layers.0.attention.wo.weight": ((H, H), 1),
    "model.layers.0.attention_norm.weight": ((H,), None),
    "model.layers.0.feed_forward.w1.weight": ((F, H), 0),
    "model.layers.0.feed_forward.w3.weight": ((F, H), 0),
    "model.layers.0.feed_forward.w2.weight": ((H, F), 1),
    "model.layers.0.ffn_norm.weight": ((H,), None),
    "model.layers.1.attention.w_qkv.weight": ((3 * H, H), 0),
    "model.layers.1.attention.wo.weight": ((H, H), 1),
    "model.layers.1.feed_forward.w_gate_hidden.weight": ((2 * F, H), 0),
    "model.layers.1.feed_forward.w2.weight": ((H, F), 1),
    "model.norm_out.weight": ((H,), None),
    "lm_head.weight": ((V, H), 0),
}
# mcore (use_legacy: False), Qwen3ForCausalLM wrapping GPTModel as `model`:
MCORE_NAMES = {
    "model.embedding.word_embeddings.weight": ((V, H), 0),
    **{
        name: value
        for i in range(2)
        for name, value in {
            f"model.decoder.layers.{i}.input_layernorm.weight": ((H,), None),
            f"model.decoder.layers.{i}.self_attention.linear_qkv.weight": ((3 * H, H), 0),
            f"model.decoder.layers.{i}.self_attention.linear_qkv.bias": ((3 * H,), 0),
            f"model.decoder.layers.{i}.self_attention.q_layernorm.weight": ((HD,), None),
            f"model.decoder.layers.{i}.self_attention.linear_proj.weight": ((H, H), 1),
            f"model.decoder.layers.{i}.pre_mlp_layernorm.weight": ((H,), None),
            f"model.decoder.layers.{i}.mlp.linear_fc1.weight": ((2 * F, H), 0),
            f"model.decoder.layers.{i}.mlp.linear_fc2.weight": ((H, F), 1),
        }.items()
    },
    "model.decoder.final_layernorm.weight": ((H,), None),
    "model.output_layer.weight": ((V, H), 0),
}


@pytest.mark.parametrize("names", [LLAMA_NAMES, MCORE_NAMES], ids=["llama", "mcore"])
def test_mindformers_names_and_their_moments_split_as_mindformers_does(tmp_path, names):
    dp, tp, pp = 2, 2, 2
    layouts, reasons = plan_layout(
        {n: shape for n, (shape, _) in names.items()}, tp, pp, MINDFORMERS_RULES
    )
    assert reasons == []
    write_strategies(with_optimizer_states(layouts), dp, tp, pp, tmp_path)
    loaded = build_searched_strategy(str(tmp_path / "strategy.ckpt"))
    for name, (shape, split) in names.items():
        layer = name.split("layers.")[1].split(".")[0] if "layers." in name else None
        stage = int(layer) if layer else (0 if "embedding" in name else 1)
        for saved in (name, f"adam_m.{name}", f"adam_v.{name}"):  # AdamW's moments: adam_m./adam_v.
            got = list(loaded[f"{stage}-{saved}"].tensor_map[0].dim)
            assert got == [0 if d == split else -1 for d in range(len(shape))], saved


# --- launch.sh --mindformers --------------------------------------------------------------------


def test_launch_sh_starts_mindformers_with_the_export(tmp_path):
    bin_dir = _fake_bin(tmp_path)
    (bin_dir / "msrun").write_text(
        '#!/usr/bin/env bash\n{ pwd; printf "%s\\n" "$@"; } > "$MSRUN_ARGS"\n'
    )
    mf = tmp_path / "mindformers"
    mf.mkdir()
    (mf / "run_mindformer.py").write_text("")
    ckpt = tmp_path / "ckpt"
    (ckpt / "rank_0").mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "MSRUN_ARGS": str(tmp_path / "args"),
    }
    overlay_only = export(tmp_path, "overlay", LAYOUTS["dp8"], backend="cpu")
    refused = subprocess.run(
        ["bash", str(overlay_only / "launch.sh"), "--mindformers", str(mf)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "base_config" in refused.stderr
    # MindFormers refuses semi-auto parallel on CPU: the script says so before starting anything
    split = export(tmp_path, "split", LAYOUTS["dp2-tp2-pp2"], backend="cpu", base=LLAMA2)
    refused = subprocess.run(
        ["bash", str(split / "launch.sh"), "--mindformers", str(mf)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert (
        refused.returncode == 2
        and "cannot run this export on CPU: tp = 2, pp = 2" in refused.stderr
    )
    out = export(tmp_path, "full", LAYOUTS["dp8"], backend="cpu", base=LLAMA2)
    # relative paths are the caller's: launch.sh makes them absolute before it changes folder
    subprocess.run(
        [
            "bash",
            str(out / "launch.sh"),
            "--mindformers",
            "mindformers",
            "--out",
            "mfrun",
            "--load-checkpoint",
            "ckpt",
            "--",
            "--train_dataset_dir",
            "/data",
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    cwd, *args = (tmp_path / "args").read_text().splitlines()
    assert cwd == str(mf)  # MindFormers' configs name files relative to its checkout
    assert args[:10] == [
        "--worker_num=8",
        "--local_worker_num=8",
        "--master_addr=127.0.0.1",
        "--master_port=8118",
        "--node_rank=0",
        f"--log_dir={tmp_path / 'mfrun' / 'logs'}",
        "--join=True",
        "--cluster_time_out=600",
        "--tail_worker_log=0",
        "--bind_core=True",
    ]
    assert args[10:] == [
        "run_mindformer.py",
        "--config",
        str(out / "mindformers.yaml"),
        "--run_mode",
        "train",
        "--output_dir",
        str(tmp_path / "mfrun"),
        "--register_path",
        str(out),  # autotune's CPU training step is there
        "--load_checkpoint",
        str(ckpt),
        "--src_strategy_path_or_dir",
        str(out / "strategy.ckpt"),
        "--auto_trans_ckpt",
        "True",
        "--train_dataset_dir",
        "/data",
    ]
    for bad in (
        ["--mindformers", str(tmp_path)],
        ["--mindformers", str(mf), "--steps", "3"],
        ["--load-checkpoint", str(ckpt)],
    ):
        done = subprocess.run(
            ["bash", str(out / "launch.sh"), *bad], env=env, capture_output=True, text=True
        )
        assert done.returncode == 2, bad


# --- the base's keys autotune does not tune -----------------------------------------------------


def test_per_stage_recompute_lists_are_rederived_for_the_tuned_stages():
    from autotune.mindformers.base import stage_lists

    # Llama 2 70B's select_comm_recompute: the first 8, 4, 4, 1, … layers of each 10-layer stage
    base = read_yaml(
        Path(__file__).parents[2]
        / "benchmarks"
        / "mindformers_configs"
        / "finetune_llama2_70b_bf16_32p.yaml"
    )
    key = "recompute_config.select_comm_recompute"
    assert stage_lists(base, 80, 8) == {}  # the base's own layout: nothing to do
    assert stage_lists(base, 80, 4) == {key: [12, 5, 2, 2]}
    assert stage_lists(base, 80, 2) == {key: [17, 4]}
    assert stage_lists(base, 80, 1) == {key: [21]}
    # an uneven offset moves layers: stages of 9 and 11 layers recompute layers 0-2 and 9-10
    uneven = {
        "parallel_config": {"pipeline_stage": 2},
        "model": {"model_config": {"offset": [-1, 1]}},
        "recompute_config": {
            "select_comm_recompute": {r".*\.norm": [3, 2], "mul": True},
            "select_recompute_exclude": ["w1"],
        },
    }
    assert stage_lists(uneven, 20, 4) == {key: {r".*\.norm": [3, 1, 1, 0], "mul": True}}
    # interleaved stages: a nested list, one row per interleave
    nested = {
        "parallel_config": {"pipeline_stage": 2},
        "model": {"model_config": {"pp_interleave_num": 2}},
        "recompute_config": {"select_comm_recompute": [[2, 0], [1, 1]]},
    }
    assert stage_lists(nested, 16, 1) == {key: [[2], [2]]}
    with pytest.raises(
        SpecError,
        match=r"select_comm_recompute: \[1, 2, 3\] has 3 entries for "
        r"the config's pipeline_stage 2",
    ):
        stage_lists(
            {
                "parallel_config": {"pipeline_stage": 2},
                "recompute_config": {"select_comm_recompute": [1, 2, 3]},
            },
            8,
            4,
        )


def test_the_header_lists_what_was_rederived_and_what_the_base_keeps(tmp_path):
    out = export(
        tmp_path,
        "o",
        dict(LAYOUTS["dp2-tp2-pp2"], parallel_optimizer=True),
        device="ascend-910b",
        base=FIXTURES / "pretrain_llama2_70b.yaml",
    )
    header = (out / "mindformers.yaml").read_text().split("\nseed:")[0]
    kept = header.split(
        "# Kept from the base, not tuned (they change layout, memory or schedule):\n"
    )[1]
    # the study priced no sequence parallelism (its model.yaml has none): the export says so
    assert "#   parallel_config.use_seq_parallel: true -> false\n" in header
    assert "use_seq_parallel" not in kept
    assert "#   model.model_config.fine_grain_interleave: 2\n" in kept
    assert "parallel_config.vocab_emb_dp" not in kept  # the overlay sets it
    overlay = read_yaml(
        export(tmp_path, "ov", LAYOUTS["dp4-pp2"], device="ascend-910b") / "mindformers.yaml"
    )
    assert "re-derived for pp = 2" in (tmp_path / "ov" / "mindformers.yaml").read_text()
    assert overlay["model"]["model_config"] == {"offset": 0}  # its base's kind unknown


def test_a_cpu_export_carries_autotunes_cpu_training_step(tmp_path):
    out = export(tmp_path, "cpu", LAYOUTS["dp8"], backend="cpu", base=LLAMA2)
    merged = read_yaml(out / "mindformers.yaml")
    wrapper = merged["runner_wrapper"]
    assert (wrapper["type"], wrapper["auto_register"]) == (
        "CpuTrainOneStepCell",
        "mindformers_cpu_wrapper.CpuTrainOneStepCell",
    )
    assert (
        "class CpuTrainOneStepCell(MFTrainOneStepCell)"
        in (out / "mindformers_cpu_wrapper.py").read_text()
    )
    model = merged["model"]["model_config"]
    assert (model["use_rope_slice"], model["fused_rms_norm"], model["use_flash_attention"]) == (
        True,
        False,
        False,
    )
    assert merged["context"]["device_target"] == "CPU"
    # what MindFormers cannot run on CPU keeps the device form, and says why
    split = export(tmp_path, "split", LAYOUTS["dp2-tp2-pp2"], backend="cpu", base=LLAMA2)
    assert not (split / "mindformers_cpu_wrapper.py").exists()
    assert (
        "# MindFormers cannot run this on CPU: tp = 2, pp = 2 is semi-auto parallel"
        in (split / "mindformers.yaml").read_text()
    )


def test_the_overlay_is_the_run_the_study_priced(tmp_path):
    """Sequence parallelism, the token table under the parallel optimizer and the recompute
    layers come from the model.yaml (what the simulate study's engine priced): layer 0 marked
    for selective recompute and its norms' communication, written per stage of the tuned pp."""
    llama = dict(
        family="llama",
        num_heads=2,
        sequence_parallel=True,
        device="ascend-910b",
        recompute_layers={"select_recompute": [0], "select_comm_recompute": [0]},
    )
    knobs = dict(LAYOUTS["dp2-tp2-pp2"], parallel_optimizer=True)
    out = export(tmp_path, "sp", knobs, **llama)
    mf = read_yaml(out / "mindformers.yaml")
    assert mf["parallel_config"]["use_seq_parallel"] is True
    # without tp there is nothing to split, and MindFormers' mcore layers refuse it
    # (tests/e2e/test_tiny_moe_cpu.py runs its LayerSetting over such an export)
    for name in ("dp8", "dp4-pp2"):
        plain = read_yaml(export(tmp_path, name, LAYOUTS[name], **llama) / "mindformers.yaml")
        assert plain["parallel_config"]["use_seq_parallel"] is False, name
    assert mf["recompute_config"] == {
        "recompute": False,
        "select_recompute": [1, 0],
        "select_comm_recompute": [1, 0],
    }
    # MindFormers' LlamaEmbedding stays out of the parallel optimizer, as model.yaml says: on a
    # legacy base (an mcore one refuses the key, so the overlay lists it for the user to add)
    assert "parallel_optimizer" not in mf["model"]["model_config"]
    assert legacy_listed(out) == {"model.model_config.parallel_optimizer": False}
    mf = read_yaml(
        export(
            tmp_path, "full", dict(knobs, recompute="full", pp=1, dp=4, micro_batches=1), **llama
        )
        / "mindformers.yaml"
    )
    assert mf["recompute_config"] == {
        "recompute": True,
        "select_recompute": False,
        "select_comm_recompute": [1],
    }
    shards = dict(llama, embedding_parallel_optimizer=True)
    assert legacy_listed(export(tmp_path, "emb", knobs, **shards)) == {
        "model.model_config.parallel_optimizer": True
    }
    merged = read_yaml(
        export(tmp_path, "emb-base", knobs, base=LLAMA2, **shards) / "mindformers.yaml"
    )
    assert merged["model"]["model_config"]["parallel_optimizer"] is True
