"""autotune.export against real MindSpore: strategy files load, cover the model and reshard a full
checkpoint into exactly the numpy slices the layout promises; bad layouts write nothing; the
config documents agree with the candidate; launch.sh is valid bash and runs msrun as stated."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ms = pytest.importorskip("mindspore")
from mindspore.parallel import build_searched_strategy, merge_pipeline_strategys  # noqa: E402

from autotune.export import write_export  # noqa: E402
from autotune.layout import rank_coords  # noqa: E402
from autotune.spec.candidate import Candidate  # noqa: E402
from autotune.spec.errors import SpecError  # noqa: E402
from autotune.spec.model_yaml import parse_spec  # noqa: E402

H, FFN, VOCAB, SEQ, LAYERS = 16, 32, 32, 8, 2
TRIAL = {
    "number": 7,
    "study": "tiny",
    "metrics": {"goodput": 12.5, "loss_last": float("nan")},
    "estimate": {"feasible": True},
}
# Megatron plan, written out independently of the package: parameter → (shape, split dim or None).
COLUMN, ROW = 0, 1


def expected_params():
    params = {
        "embed.tok.embedding_table": ((VOCAB, H), COLUMN),
        "embed.pos.embedding_table": ((SEQ, H), None),
    }
    for i in range(LAYERS):
        b = f"blocks.{i}"
        params.update(
            {
                f"{b}.ln1.gamma": ((H,), None),
                f"{b}.ln1.beta": ((H,), None),
                f"{b}.attn.qkv.weight": ((3 * H, H), COLUMN),
                f"{b}.attn.qkv.bias": ((3 * H,), COLUMN),
                f"{b}.attn.proj.weight": ((H, H), ROW),
                f"{b}.attn.proj.bias": ((H,), None),
                f"{b}.ln2.gamma": ((H,), None),
                f"{b}.ln2.beta": ((H,), None),
                f"{b}.mlp.fc_in.weight": ((FFN, H), COLUMN),
                f"{b}.mlp.fc_in.bias": ((FFN,), COLUMN),
                f"{b}.mlp.fc_out.weight": ((H, FFN), ROW),
                f"{b}.mlp.fc_out.bias": ((H,), None),
            }
        )
    params.update(
        {
            "ln_f.gamma": ((H,), None),
            "ln_f.beta": ((H,), None),
            "head.weight": ((VOCAB, H), COLUMN),
            "head.bias": ((VOCAB,), COLUMN),
        }
    )
    return params


def expected_stage(name, pp):
    name = name.removeprefix("adam_m.").removeprefix("adam_v.")  # a moment sits with its parameter
    if name.startswith("blocks."):
        return int(name.split(".")[1]) // (LAYERS // pp)
    return 0 if name.startswith("embed.") else pp - 1


def make_spec(
    tmp_path,
    devices=8,
    devices_per_node=8,
    hidden=H,
    backend="simulate",
    device="a100-80g",
    **model,
):
    data = {
        "study": "tiny",
        "model": {
            "family": "transformer",
            "num_layers": LAYERS,
            "hidden_size": hidden,
            "num_heads": 2,
            "ffn_hidden_size": FFN,
            "seq_length": SEQ,
            "vocab_size": VOCAB,
            "dtype": "float16",
            **model,
        },
        "train": {"global_batch_size": 16, "learning_rate": 2e-3, "total_steps": 500},
        "cluster": {
            "backend": backend,
            "devices": devices,
            "devices_per_node": devices_per_node,
            "device": device,
        },
        "trial": {"steps": 10, "measure_after": 2},
    }
    return parse_spec(data, tmp_path / "model.yaml")


def candidate(**knobs):
    values = dict(
        dp=2,
        tp=2,
        pp=2,
        micro_batches=4,
        fusion_mb=16,
        grad_accum=1,
        loss_scale=2**12,
        warmup_steps=50,
        jit_level="O1",
        recompute="selective",
    )
    return Candidate(**{**values, **knobs})


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory):
    """A full checkpoint with the model's names, Adam moments and a step counter."""
    rng = np.random.default_rng(0)
    arrays = {
        n: rng.standard_normal(shape).astype(np.float32)
        for n, (shape, _) in expected_params().items()
    }
    arrays.update(
        {
            f"adam_m.{n}": rng.standard_normal(a.shape).astype(np.float32)
            for n, a in list(arrays.items())
        }
    )
    arrays["global_step"] = np.array([42], np.int32)
    path = tmp_path_factory.mktemp("full") / "model.ckpt"
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in arrays.items()], str(path))
    return path, arrays


@pytest.fixture(scope="module")
def export_222(tmp_path_factory, full_checkpoint):
    tmp = tmp_path_factory.mktemp("export")
    out = tmp / "out"
    files = write_export(
        make_spec(tmp), candidate(), TRIAL, out, reshard_from=str(full_checkpoint[0])
    )
    return out, files


def test_strategy_loads_and_covers_every_parameter(export_222, tmp_path):
    out, files = export_222
    params = expected_params()
    merged = build_searched_strategy(str(out / "strategy.ckpt"))
    # parameters and their Adam moments: what the trainer's per-rank checkpoints hold
    saved = {f"{prefix}{n}" for n in params for prefix in ("", "adam_m.", "adam_v.")}
    assert set(merged) == {f"{expected_stage(n, 2)}-{n}" for n in saved}
    for key, layout in merged.items():
        name = key.split("-", 1)[1].removeprefix("adam_m.").removeprefix("adam_v.")
        shape, split = params[name]
        assert list(layout.dev_matrix[0].dim) == [2, 2]
        assert list(layout.tensor_map[0].dim) == [
            0 if d == split else -1 for d in range(len(shape))
        ]
    for k in range(2):
        stage = build_searched_strategy(str(out / "strategy_stages" / f"stage{k}.ckpt"))
        assert set(stage) == {n for n in saved if expected_stage(n, 2) == k}
    # The stage files are what MindSpore merges into strategy.ckpt.
    merge_pipeline_strategys(str(out / "strategy_stages"), str(tmp_path / "again.ckpt"))
    assert set(build_searched_strategy(str(tmp_path / "again.ckpt"))) == set(merged)
    assert out / "strategy.ckpt" in files


def test_reshard_gives_the_promised_slices_on_every_rank(export_222, full_checkpoint):
    out, _ = export_222
    _, arrays = full_checkpoint
    params = expected_params()
    dp, tp = 2, 2
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == [f"rank_{r}" for r in range(8)]
    for rank in range(8):
        stage, tp_index = rank // (dp * tp), rank % tp  # MindSpore: rank = stage·dp·tp + d·tp + t
        assert rank_coords(rank, dp, tp) == (stage, rank % (dp * tp) // tp, tp_index)
        got = ms.load_checkpoint(
            str(out / "checkpoint" / f"rank_{rank}" / f"checkpoint_{rank}.ckpt")
        )
        mine = {n for n in params if expected_stage(n, 2) == stage}
        assert set(got) == mine | {f"adam_m.{n}" for n in mine} | {"global_step"}
        for name, value in got.items():
            base = name.removeprefix("adam_m.")
            full = arrays[name]
            split = params[base][1] if base in params else None
            if split is not None:
                size = full.shape[split] // tp
                full = np.take(full, np.arange(tp_index * size, (tp_index + 1) * size), axis=split)
            np.testing.assert_array_equal(value.asnumpy(), full, err_msg=f"rank {rank} {name}")


def test_summary_and_configs_agree_with_the_candidate(export_222, tmp_path):
    out, _ = export_222
    summary = json.loads((out / "summary.json").read_text())
    assert summary["study"] == "tiny" and summary["trial"] == 7
    assert summary["knobs"] == candidate().as_dict()
    assert summary["metrics"] == {"goodput": 12.5, "loss_last": None}
    assert summary["estimate"] == {"feasible": True}
    assert {n: (tuple(p["shape"]), p["stage"]) for n, p in summary["parameters"].items()} == {
        n: (shape, expected_stage(n, 2)) for n, (shape, _) in expected_params().items()
    }
    assert summary["reshard"]["copied_whole"] == ["global_step"]

    launch = yaml.safe_load((out / "launch.yaml").read_text())
    par = launch["auto_parallel_context"]
    assert par["parallel_mode"] == "semi_auto_parallel" and par["device_num"] == 8
    assert par["pipeline_stages"] == 2 and par["gradients_mean"] is False
    assert par["comm_fusion"] == {"allreduce": {"mode": "size", "config": 16}}
    assert par["enable_parallel_optimizer"] is False
    # strategy.ckpt describes checkpoints; as a strategy to load it would match no operator
    assert "strategy_ckpt_config" not in par
    assert launch["device"] == {"device_target": "GPU"}
    assert launch["context"] == {"mode": 0}  # GRAPH_MODE, the integer set_context takes
    assert launch["jit_config"] == {"jit_level": "O1"}
    assert launch["pipeline"]["PipelineCell"]["micro_size"] == 4
    assert launch["loss_scale"]["DynamicLossScaleUpdateCell"]["loss_scale_value"] == 2**12
    assert (
        launch["lr_schedule"]["warmup_steps"] == 50 and launch["lr_schedule"]["total_steps"] == 500
    )
    assert launch["recompute"]["mode"] == "selective"
    assert launch["batch"] == {"global_batch_size": 16, "micro_batch_size": 2}

    # MindFormers runs on Ascend only (docs/accelerators.md): the same candidate exported there
    assert not (out / "mindformers.yaml").exists()
    ascend = tmp_path / "ascend"
    write_export(make_spec(tmp_path, device="ascend-910b"), candidate(), TRIAL, ascend)
    text = (ascend / "mindformers.yaml").read_text()
    mf = yaml.safe_load(text)
    # no base given: the overlay names the base_config to set, and says so at its top
    assert mf["base_config"] == "SET-ME-your-model-mindformers-config.yaml"
    assert (
        text.startswith("# autotune export") and "Set base_config" in text.split("\nbase_config")[0]
    )
    pc = mf["parallel_config"]
    assert (
        pc["data_parallel"],
        pc["model_parallel"],
        pc["pipeline_stage"],
        pc["micro_batch_num"],
    ) == (2, 2, 2, 4)
    assert pc["vocab_emb_dp"] is False
    # With pipeline stages MindFormers' global batch is batch_size × dp × micro_batch_num.
    assert mf["runner_config"]["batch_size"] * 2 * 4 == 16
    assert mf["runner_wrapper"]["scale_sense"]["loss_scale_value"] == 2**12
    assert mf["lr_schedule"]["warmup_steps"] == 50 and mf["lr_schedule"]["warmup_ratio"] is None
    assert mf["context"]["jit_config"]["jit_level"] == "O1"
    assert mf["recompute_config"] == {"recompute": False, "select_recompute": True}
    assert "strategy_ckpt_load_file" not in mf["parallel"]

    config = json.loads((out / "train_config.json").read_text())
    assert config["trial"] == {"steps": 500, "measure_after": 2, "schedule": "full"}
    assert config["checkpoint"] == {
        "dir": "run/checkpoint",
        "save_every": 1000,
        "resume": False,
        "init_from": None,
    }
    assert config["knobs"] == candidate().as_dict() and config["trial_number"] == 7


def test_data_parallel_export(tmp_path):
    c = candidate(dp=2, tp=1, pp=1, micro_batches=1, grad_accum=4)
    out = tmp_path / "dp"
    write_export(make_spec(tmp_path, devices=2, backend="cpu"), c, TRIAL, out)
    assert set(build_searched_strategy(str(out / "strategy.ckpt"))) == {
        f"{prefix}{n}" for n in expected_params() for prefix in ("", "adam_m.", "adam_v.")
    }
    assert not (out / "strategy_stages").exists()
    launch = yaml.safe_load((out / "launch.yaml").read_text())
    assert launch["auto_parallel_context"]["parallel_mode"] == "data_parallel"
    assert "pipeline_stages" not in launch["auto_parallel_context"]
    assert launch["auto_parallel_context"]["gradients_mean"] is True
    assert launch["device"] == {"device_target": "CPU"} and launch["context"] == {"mode": 0}
    mf = yaml.safe_load((out / "mindformers.yaml").read_text())
    # MindFormers on CPU runs data parallel only (parallel_mode 0), where it accumulates nothing:
    # the 4 accumulated micro-batches of 2 become one batch of 8 per rank.
    assert mf["runner_config"] == {
        "batch_size": 8,
        "gradient_accumulation_steps": 1,
        "sink_mode": False,
    }
    assert mf["parallel"]["parallel_mode"] == 0 and mf["parallel"]["full_batch"] is False
    assert mf["parallel"]["gradients_mean"] is True
    # On Ascend: batch_size × dp × gradient_accumulation_steps, and MindFormers keeps the
    # accumulation only in semi-auto parallel (parallel_mode 1), pure DP included.
    write_export(make_spec(tmp_path, devices=2, device="ascend-910b"), c, TRIAL, tmp_path / "npu")
    mf = yaml.safe_load((tmp_path / "npu" / "mindformers.yaml").read_text())
    assert mf["runner_config"] == {"batch_size": 2, "gradient_accumulation_steps": 4}
    assert mf["parallel"]["parallel_mode"] == 1 and mf["parallel"]["full_batch"] is True


def test_pynative_data_parallel_export(tmp_path):
    c = candidate(dp=2, tp=1, pp=1, micro_batches=1, grad_accum=1, jit_level="pynative")
    out = tmp_path / "dp"
    write_export(make_spec(tmp_path, devices=2, backend="cpu"), c, TRIAL, out)
    launch = yaml.safe_load((out / "launch.yaml").read_text())
    assert launch["context"] == {"mode": 1} and "jit_config" not in launch  # PYNATIVE_MODE
    mf = yaml.safe_load((out / "mindformers.yaml").read_text())
    # PyNative runs data parallel only: MindFormers' code 0
    assert mf["parallel"]["parallel_mode"] == 0 and mf["context"]["mode"] == 1
    assert mf["runner_config"] == {
        "batch_size": 8,
        "gradient_accumulation_steps": 1,
        "sink_mode": False,
    }


@pytest.mark.parametrize(
    "knobs, message",
    [
        (
            dict(jit_level="pynative"),
            "jit_level = pynative with tp = 2, pp = 2: MindSpore's PyNative",
        ),
        (
            dict(dp=8, tp=1, pp=1, micro_batches=1, grad_accum=2, jit_level="pynative"),
            "jit_level = pynative with grad_accum = 2: MindFormers accumulates",
        ),
        (dict(jit_level="O2"), "jit_level = O2 on gpu: O2 is deprecated since MindSpore 2.9"),
    ],
)
def test_configs_mindspore_cannot_run_are_refused(tmp_path, knobs, message):
    out = tmp_path / "out"
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        write_export(make_spec(tmp_path), candidate(**knobs), TRIAL, out)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(
    "hidden, knobs, devices, message",
    [
        (
            18,
            dict(dp=2, tp=3, pp=1, micro_batches=1),
            6,
            "tp = 3 does not divide embed.tok.embedding_table dim 0 (32)",
        ),
        (H, dict(dp=1, tp=2, pp=4), 8, "pp = 4 exceeds the model's 2 layers"),
    ],
)
def test_invalid_layout_raises_and_writes_nothing(tmp_path, hidden, knobs, devices, message):
    spec = make_spec(tmp_path, devices=devices, hidden=hidden, num_heads=6 if hidden == 18 else 2)
    out = tmp_path / "exports" / "bad"
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_export(spec, candidate(**knobs), TRIAL, out)
    assert not (tmp_path / "exports").exists() or not any((tmp_path / "exports").iterdir())


def test_existing_folder_is_kept_unless_overwrite(tmp_path):
    spec, c = make_spec(tmp_path), candidate()
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SpecError, match="not empty"):
        write_export(spec, c, TRIAL, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    write_export(spec, c, TRIAL, out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "strategy.ckpt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folders left


def test_bad_reshard_source_writes_nothing(tmp_path, full_checkpoint):
    _, arrays = full_checkpoint
    partial = tmp_path / "partial.ckpt"
    ms.save_checkpoint(
        [{"name": "head.weight", "data": ms.Tensor(arrays["head.weight"])}], str(partial)
    )
    with pytest.raises(SpecError, match="missing embed.tok.embedding_table"):
        write_export(
            make_spec(tmp_path), candidate(), TRIAL, tmp_path / "out", reshard_from=str(partial)
        )
    assert not (tmp_path / "out").exists()


def _fake_bin(tmp_path):
    """A PATH with the test's python as `python` and an `msrun` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    msrun = bin_dir / "msrun"
    msrun.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$MSRUN_ARGS"\n')
    msrun.chmod(0o755)
    return bin_dir


def test_launch_sh_is_valid_and_runs_msrun(export_222, tmp_path):
    out, _ = export_222
    script = out / "launch.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = {
        **os.environ,
        "PATH": f"{_fake_bin(tmp_path)}:{os.environ['PATH']}",
        "MSRUN_ARGS": str(tmp_path / "args"),
        "MASTER_PORT": "9123",
    }
    subprocess.run(
        ["bash", str(script), "--steps", "5", "--out", str(tmp_path / "run")], check=True, env=env
    )
    args = (tmp_path / "args").read_text().split("\n")
    # autotune.train.msrun's options; no --bind_core: this export runs on GPUs
    assert args[:9] == [
        "--worker_num=8",
        "--local_worker_num=8",
        "--master_addr=127.0.0.1",
        "--master_port=9123",
        "--node_rank=0",
        f"--log_dir={tmp_path / 'run' / 'logs'}",
        "--join=True",
        "--cluster_time_out=600",
        "--tail_worker_log=0",
    ]
    assert args[9:12] == ["python", "-m", "autotune.train"]
    config = json.loads(Path(args[12]).read_text())
    assert config["trial"] == {"steps": 5, "measure_after": 2, "schedule": "full"}
    assert config["out_dir"] == str(tmp_path / "run")
    # the export's own checkpoint/ (from --reshard) is where a new run starts
    assert config["checkpoint"] == {
        "dir": str(tmp_path / "run" / "checkpoint"),
        "save_every": 1000,
        "resume": False,
        "init_from": str(out / "checkpoint"),
    }
    subprocess.run(
        ["bash", str(script), "--steps", "5", "--out", str(tmp_path / "run"), "--resume"],
        check=True,
        env=env,
    )
    config = json.loads(Path((tmp_path / "args").read_text().split("\n")[12]).read_text())
    assert config["checkpoint"]["resume"] is True and config["checkpoint"]["init_from"] is None
    bad = subprocess.run(["bash", str(script), "--steps", "x"], env=env, capture_output=True)
    assert bad.returncode == 2


def test_multi_node_launch_needs_master_addr_and_node_rank(tmp_path):
    out = tmp_path / "out"
    write_export(make_spec(tmp_path, devices_per_node=4), candidate(), TRIAL, out)
    script = str(out / "launch.sh")
    subprocess.run(["bash", "-n", script], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
    env.update(
        PATH=f"{_fake_bin(tmp_path)}:{os.environ['PATH']}", MSRUN_ARGS=str(tmp_path / "args")
    )
    run = tmp_path / "run"
    for missing, given in (
        ("MASTER_ADDR", {"NODE_RANK": "1"}),
        ("NODE_RANK", {"MASTER_ADDR": "10.0.0.1"}),
        ("NODE_RANK", {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "2"}),
    ):
        bad = subprocess.run(
            ["bash", script, "--out", str(run)],
            env={**env, **given},
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2 and missing in bad.stderr, bad.stderr
        assert not run.exists()  # refused before anything was written
    subprocess.run(
        ["bash", script, "--out", str(run)],
        check=True,
        env={**env, "MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"},
    )
    args = (tmp_path / "args").read_text().split("\n")
    assert args[:5] == [
        "--worker_num=8",
        "--local_worker_num=4",
        "--master_addr=10.0.0.1",
        "--master_port=8118",
        "--node_rank=1",
    ]


ENTRY = """
from mindspore import nn

class Attention(nn.Cell):
    def __init__(self, h):
        super().__init__()
        self.wq, self.wo = nn.Dense(h, h, has_bias=False), nn.Dense(h, h, has_bias=False)

class FeedForward(nn.Cell):
    def __init__(self, h):
        super().__init__()
        self.w1, self.w2 = nn.Dense(h, 2 * h, has_bias=False), nn.Dense(2 * h, h, has_bias=False)

class Layer(nn.Cell):
    def __init__(self, h):
        super().__init__()
        self.attention, self.feed_forward = Attention(h), FeedForward(h)

class Llama(nn.Cell):
    def __init__(self, h, layers, vocab):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, h)
        self.layers = nn.CellList([Layer(h) for _ in range(layers)])
        self.norm_out = nn.LayerNorm((h,))
        self.lm_head = nn.Dense(h, vocab, has_bias=False)

def build(config):
    m = config["model"]
    return Llama(m["hidden_size"], m["num_layers"], m["vocab_size"]), None, None
"""


def test_entry_model_uses_mindformers_rules(tmp_path):
    (tmp_path / "llama.py").write_text(ENTRY)
    spec = parse_spec(
        {
            "model": {
                "entry": "llama.py:build",
                "num_layers": 4,
                "hidden_size": 8,
                "num_heads": 2,
                "seq_length": 8,
                "vocab_size": 16,
            },
            "train": {"global_batch_size": 8},
            "cluster": {"backend": "simulate", "devices": 8},
        },
        tmp_path / "model.yaml",
    )
    out = tmp_path / "out"
    write_export(spec, candidate(micro_batches=2), TRIAL, out)
    params = json.loads((out / "summary.json").read_text())["parameters"]
    layout = {n: (p["stage"], p["split_dim"]) for n, p in params.items()}
    assert layout["tok_embeddings.embedding_table"] == (0, 0)
    assert layout["layers.1.attention.wq.weight"] == (0, 0)
    assert layout["layers.2.attention.wo.weight"] == (1, 1)
    assert layout["layers.3.feed_forward.w1.weight"] == (1, 0)
    assert layout["layers.0.feed_forward.w2.weight"] == (0, 1)
    assert layout["norm_out.gamma"] == (1, None)
    assert layout["lm_head.weight"] == (1, 0)
    merged = build_searched_strategy(str(out / "strategy.ckpt"))
    assert len(merged) == 3 * len(params)  # each parameter and its two Adam moments


def test_user_tp_rules_come_before_the_defaults(tmp_path):
    (tmp_path / "llama.py").write_text(ENTRY)
    spec = parse_spec(
        {
            "model": {
                "entry": "llama.py:build",
                "num_layers": 4,
                "hidden_size": 8,
                "num_heads": 2,
                "seq_length": 8,
                "vocab_size": 16,
                "tp_rules": {"lm_head.*": "replicated", "layers.*.attention.wo.*": "column"},
            },
            "train": {"global_batch_size": 8},
            "cluster": {"backend": "simulate", "devices": 8},
        },
        tmp_path / "model.yaml",
    )
    out = tmp_path / "out"
    write_export(spec, candidate(micro_batches=2), TRIAL, out)
    params = json.loads((out / "summary.json").read_text())["parameters"]
    assert params["lm_head.weight"]["split_dim"] is None
    assert params["layers.2.attention.wo.weight"]["split_dim"] == 0
    assert params["layers.1.attention.wq.weight"]["split_dim"] == 0  # default rule still applies


def test_parallel_optimizer_export_lays_out_the_shards_and_turns_it_on(tmp_path):
    # h=128, ffn=512: qkv (384·128), proj (128·128: 64 KB exactly, not smaller than MindSpore's
    # threshold), fc_in (512·128) and fc_out (128·512) in float32 are split by tp 2: their
    # slices' dim 0 is sharded over the dp group of 2, whose ranks stride by tp (MindSpore's
    # opt_weight_shard_step); everything else stays whole.
    spec = make_spec(tmp_path, hidden=128, ffn_hidden_size=512)
    out = tmp_path / "po"
    write_export(spec, candidate(parallel_optimizer=True), TRIAL, out)
    sharded = {
        f"blocks.{i}.{part}.weight"
        for i in range(LAYERS)
        for part in ("attn.qkv", "attn.proj", "mlp.fc_in", "mlp.fc_out")
    }
    merged = build_searched_strategy(str(out / "strategy.ckpt"))
    assert len(merged) == 3 * len(expected_params())
    for key, layout in merged.items():
        name = key.split("-", 1)[1].removeprefix("adam_m.").removeprefix("adam_v.")
        shard = (layout.opt_weight_shard_step, layout.opt_weight_shard_size)
        assert shard == ((2, 2) if name in sharded else (0, 0)), key
    par = yaml.safe_load((out / "launch.yaml").read_text())["auto_parallel_context"]
    assert par["enable_parallel_optimizer"] is True
    assert par["parallel_optimizer_config"] == {"parallel_optimizer_threshold": 64}
    off = tmp_path / "off"
    write_export(spec, candidate(), TRIAL, off)
    assert all(
        lay.opt_weight_shard_size == 0
        for lay in build_searched_strategy(str(off / "strategy.ckpt")).values()
    )
