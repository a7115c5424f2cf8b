"""A base whose pipeline interleaves (``parallel.pipeline_config.pipeline_interleave`` and
``model_config.pp_interleave_num`` > 1): its layers run on the stages MindFormers'
``LayerSetting`` deals them to — chunks round the stages, not one block per stage — and the
export's strategy.ckpt and summary.json place each layer's parameters there."""

import json

import pytest
import yaml

from autotune.export import write_export
from autotune.families.layers import stage_of
from autotune.spec.errors import SpecError
from autotune.spec.space import build_space
from tests.export.test_export import TRIAL
from tests.export.test_mcore_names import TINY_QWEN3, _spec

pytest.importorskip("mindspore")
from mindspore.parallel import build_searched_strategy  # noqa: E402


def _interleaved(tmp_path, interleave=2, on=True, layers=4):
    """TINY_QWEN3 with ``layers`` layers and its pipeline interleaved ``interleave`` times."""
    path = tmp_path / "interleaved.yaml"
    body = {
        "base_config": str(TINY_QWEN3),
        "parallel": {"pipeline_config": {"pipeline_interleave": on, "pipeline_scheduler": "1f1b"}},
        "model": {"model_config": {"num_hidden_layers": layers, "pp_interleave_num": interleave}},
    }
    path.write_text(yaml.safe_dump(body))
    return path


def _stages(out) -> dict:
    """``{layer: {stages its parameters are on}}`` from the merged strategy ("<stage>-<name>")."""
    held = {}
    for key in build_searched_strategy(str(out / "strategy.ckpt")):
        stage, name = key.split("-", 1)
        if name.startswith("decoder.layers."):
            held.setdefault(int(name.split(".")[2]), set()).add(int(stage))
    return held


def _exported(tmp_path, config, **knobs):
    spec, base = _spec(tmp_path, config)
    c = build_space(spec).baseline().replace(**knobs)
    write_export(spec, c, TRIAL, tmp_path / "out", mindformers_base=base)
    return tmp_path / "out"


def test_an_interleaved_base_deals_its_layers_round_the_stages(tmp_path):
    out = _exported(tmp_path, _interleaved(tmp_path), dp=2, pp=2, micro_batches=2)
    # 4 layers in 2 · 2 chunks of 1: layers 0 and 2 on stage 0, 1 and 3 on stage 1
    assert _stages(out) == {0: {0}, 1: {1}, 2: {0}, 3: {1}}
    summary = json.loads((out / "summary.json").read_text())["parameters"]
    assert summary["decoder.layers.2.mlp.linear_fc1.weight"]["stage"] == 0
    assert summary["output_layer.weight"]["stage"] == 1


def test_without_pipeline_interleave_the_stages_are_blocks(tmp_path):
    """MindFormers takes pp_interleave_num only when MindSpore's pipeline_interleave is on."""
    out = _exported(tmp_path, _interleaved(tmp_path, on=False), dp=2, pp=2, micro_batches=2)
    assert _stages(out) == {0: {0}, 1: {0}, 2: {1}, 3: {1}}


def test_stage_of_deals_equal_chunks_in_order():
    # 12 layers, pp 2, interleave 3: chunks of 2 → stages 0 0 1 1 0 0 1 1 0 0 1 1
    assert [stage_of(12, 2, i, 3) for i in range(12)] == [0, 0, 1, 1] * 3
    assert [stage_of(12, 2, i) for i in range(12)] == [0] * 6 + [1] * 6


def test_reshard_is_refused_for_an_interleaved_base(tmp_path):
    spec, base = _spec(tmp_path, _interleaved(tmp_path))
    c = build_space(spec).baseline().replace(dp=2, pp=2, micro_batches=2)
    with pytest.raises(SpecError, match="--reshard: the base interleaves its pipeline"):
        write_export(
            spec, c, TRIAL, tmp_path / "out", tmp_path / "full.ckpt", mindformers_base=base
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_stages_are_those_mindformers_layersetting_deals(tmp_path):
    """MindFormers' own LayerSetting, over the exported mindformers.yaml with its pipeline
    context set as a run sets it, puts each layer on the stage the export does."""
    from tests.export.test_mindformers_consumer import consumer

    cases = ((2, 8, 2), (2, 8, 4), (4, 8, 2))  # (interleave, layers, pp)
    jobs = []
    for interleave, layers, pp in cases:
        folder = tmp_path / f"i{interleave}-l{layers}-pp{pp}"
        folder.mkdir()
        config = _interleaved(folder, interleave, layers=layers)
        out = _exported(folder, config, dp=4 // pp, pp=pp, micro_batches=pp)
        jobs.append({"layers": str(out / "mindformers.yaml")})
    results = consumer(tmp_path, jobs)
    for (interleave, layers, pp), result in zip(cases, results):
        assert "error" not in result, result
        folder = tmp_path / f"i{interleave}-l{layers}-pp{pp}"
        exported = {layer: stages.pop() for layer, stages in _stages(folder / "out").items()}
        assert result["pp_ids"] == [exported[i] for i in range(layers)], (interleave, pp)
        assert result["pp_ids"] != sorted(result["pp_ids"])  # interleaved, not blocks
