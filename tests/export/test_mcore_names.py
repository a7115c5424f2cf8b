"""strategy.ckpt of a study whose MindFormers base is an mcore config (use_legacy: False): the
parameters MindFormers 1.9 builds — their names, shapes and the split each rank holds — for a
tiny Qwen3 (q/k norms, grouped-query attention) and a tiny Qwen3-MoE (grouped-GEMM experts over
ep); the refusals where no strategy could say what a rank holds; a legacy base keeps the legacy
llama's names. The slow test compares the names and shapes with the network MindFormers builds
from the same config on this CPU."""

import json

import pytest
import yaml

pytest.importorskip("mindspore")

from mindspore.parallel import build_searched_strategy  # noqa: E402
from mindspore.train.node_strategy_pb2 import ParallelStrategyMap  # noqa: E402

from autotune.cli import main  # noqa: E402
from autotune.export import write_export  # noqa: E402
from autotune.families.mcore import mcore_reasons  # noqa: E402
from autotune.spec.errors import SpecError  # noqa: E402
from autotune.spec.model_yaml import parse_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.export.test_export import TRIAL  # noqa: E402

HERE = ROOT / "tests" / "mindformers"
TINY_QWEN3 = HERE / "tiny_qwen3_cpu.yaml"
TINY_QWEN3_MOE = HERE / "tiny_qwen3_moe_cpu.yaml"
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
QWEN3_MOE = _model(EXPERTS)


def _spec(tmp_path, config, devices=4):
    """The model.yaml ``autotune init --mindformers`` writes for ``config``, on ``devices``."""
    path = tmp_path / "model.yaml"
    assert main(["init", "--mindformers", str(config), "--backend", "cpu", "--out", str(path)]) == 0
    data = yaml.safe_load(path.read_text())
    data["cluster"].update(devices=devices, devices_per_node=devices)
    del data["baseline"]  # the config's own 1-device layout; each test picks its candidate
    return parse_spec(data, path), data["export"]["mindformers_base"]


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
    spec, base = _spec(tmp_path, config)
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
        ("tie_word_embeddings", True, {"dp": 4}, "tied embeddings"),
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
    "option, value, what",
    [
        ("kv_lora_rank", 64, "multi-latent attention"),
        ("mtp_layers", 1, "multi-token prediction"),
        ("shared_ffn_hidden_size", 48, "shared experts"),
        ("dense_layers", 1, "dense first layers"),
        ("experts_tensor_parallel", True, "experts split over tp"),
    ],
)
def test_what_is_not_established_is_refused(option, value, what):
    model = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 48}
    assert mcore_reasons(model, {}, 2) == []
    (reason,) = mcore_reasons({**model, option: value}, {}, 2)
    assert what in reason and f"model.{option}" in reason


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
    order, are its ``Parameter.name``s and shapes, and those pinned above."""
    from tests.export.test_mindformers_consumer import consumer

    qwen3, moe = consumer(
        tmp_path, [{"network": str(TINY_QWEN3)}, {"network": str(TINY_QWEN3_MOE)}]
    )
    assert (qwen3["class"], moe["class"]) == (
        "TrainingQwen3ForCausalLM",
        "TrainingQwen3MoeForCausalLM",
    )
    for config, built, pinned in ((TINY_QWEN3, qwen3, QWEN3), (TINY_QWEN3_MOE, moe, QWEN3_MOE)):
        folder = tmp_path / config.stem
        folder.mkdir()
        parameters = [(name, tuple(shape)) for name, shape in built["parameters"]]
        assert _exported(_export(folder, config, dp=2, tp=2)) == parameters
        assert parameters == [(n, shape) for n, (shape, _) in pinned.items()]
