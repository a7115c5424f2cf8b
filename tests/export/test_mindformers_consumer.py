"""MindFormers itself as the consumer of what autotune reads and writes (slow tier).

mindformers 1.9.0 with mindspore 2.9.0 lives in a venv of its own (``make mindformers``,
``.venv-mindformers``: it pins numpy<2, autotune's venv cannot hold it). Each test runs
``tests/mindformers/consumer.py`` there, once, over many files:

- every fixture: MindFormers' ``_file2dict`` gives what autotune's reader gives, leaf for leaf;
- exports of every layout over MindFormers' configs, the overlay merged by MindFormers over its
  base, and a CPU export: its reading, its section templates, and the global batch its trainer
  computes (``_check_global_batch_size_for_auto_parallel``) is the tuned one;
- the Llama 2 70B config exported at pp 2, 4 and 8: MindFormers' ``LayerSetting`` builds every
  stage (the base itself at pp 4 raises MindFormers' IndexError: the check can fail);
- Qwen3-30B-A3B's mcore config exported at tp4·pp4·ep4, pp 2 and tp 1: MindFormers' mcore
  ``LayerSetting``, over the ``TransformerConfig`` the model is built with, builds every stage
  (sequence parallelism written at tp 1 is refused there: the check can fail);
- (a study of the tiny CPU llama whose trials are MindFormers runs, exported and trained by
  ``run_mindformer.py`` through ``launch.sh --mindformers``: tests/mindformers/test_mindformers_study.py).

What the CPU run cannot show (tp, pp and the parallel optimizer under MindFormers): docs/mindformers.md.
"""

import json
import os
import subprocess

import pytest
import yaml

from autotune.cli import main
from autotune.export import write_export
from autotune.spec.candidate import Candidate
from autotune.spec.mindformers_file import load_config
from autotune.spec.model_yaml import load_spec
from tests.conftest import ROOT
from tests.export.test_export import TRIAL, make_spec  # noqa: E402

pytestmark = pytest.mark.slow

MF_PYTHON = ROOT / ".venv-mindformers" / "bin" / "python"
HERE = ROOT / "tests" / "mindformers"
FIXTURES = ROOT / "tests" / "fixtures" / "mindformers"
BENCHMARK_CONFIGS = ROOT / "benchmarks" / "mindformers_configs"
LLAMA2 = FIXTURES / "pretrain_llama2_7b.yaml"
QWEN3 = FIXTURES / "pretrain_qwen3_bf16.yaml"
LLAMA70 = BENCHMARK_CONFIGS / "finetune_llama2_70b_bf16_32p.yaml"  # per-stage recompute lists
TINY = HERE / "tiny_llama_cpu.yaml"
LAYOUTS = {  # 8 devices, global batch 16 (make_spec)
    "dp8": dict(dp=8, tp=1, pp=1, micro_batches=1, grad_accum=2),
    "dp4-tp2": dict(dp=4, tp=2, pp=1, micro_batches=1, grad_accum=4),
    "dp4-pp2": dict(dp=4, tp=1, pp=2, micro_batches=2, grad_accum=1),
    "dp2-tp2-pp2": dict(dp=2, tp=2, pp=2, micro_batches=4, grad_accum=1),
}


def _venv():
    if not MF_PYTHON.exists():
        if os.environ.get("AUTOTUNE_REQUIRE_MINDFORMERS") == "1":
            pytest.fail(f"{MF_PYTHON} is missing: make test-slow creates it (make mindformers)")
        pytest.skip("MindFormers' venv is absent: make mindformers")
    return str(MF_PYTHON)


def consumer(tmp_path, jobs: list) -> list:
    """Run tests/mindformers/consumer.py over ``jobs`` in MindFormers' venv; its results."""
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    done = subprocess.run(
        [_venv(), str(HERE / "consumer.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )  # MindFormers logs to ./output
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    results = json.loads(lines[-1].removeprefix("RESULTS "))
    crashed = [r["crash"] for r in results if "crash" in r]
    assert not crashed, crashed[0]
    return results


def as_json(value):
    """What a YAML value becomes once through JSON (the consumer's results are JSON)."""
    return json.loads(json.dumps(value))


def test_mindformers_reads_every_fixture_as_autotune_does(tmp_path):
    files = sorted(FIXTURES.glob("*.yaml")) + sorted(BENCHMARK_CONFIGS.glob("*.yaml")) + [TINY]
    results = consumer(tmp_path, [{"read": str(f)} for f in files])
    for path, result in zip(files, results):
        assert result["raw"] == as_json(load_config(path)), path.name


def _exports(tmp_path) -> dict:
    """name → (export folder, candidate): every layout over MindFormers' own configs."""
    out = {}
    for base, dtype in ((LLAMA2, "float16"), (QWEN3, "bfloat16")):
        for name, knobs in LAYOUTS.items():
            c = Candidate(
                **dict(
                    knobs,
                    fusion_mb=16,
                    loss_scale=2**12,
                    warmup_steps=50,
                    jit_level="O1",
                    recompute="selective",
                    parallel_optimizer=knobs["dp"] > 2,
                )
            )
            folder = tmp_path / f"{base.stem}-{name}"
            spec = make_spec(tmp_path, dtype=dtype, device="ascend-910b")
            write_export(spec, c, TRIAL, folder, mindformers_base=str(base))
            out[folder.name] = (folder, c)
    # the overlay alone, its base_config set as the user would: MindFormers merges it
    c = Candidate(
        **dict(
            LAYOUTS["dp2-tp2-pp2"],
            fusion_mb=16,
            loss_scale=2**12,
            warmup_steps=50,
            jit_level="O1",
            recompute="full",
        )
    )
    folder = tmp_path / "overlay"
    write_export(make_spec(tmp_path, device="ascend-910b"), c, TRIAL, folder)
    text = (folder / "mindformers.yaml").read_text()
    (folder / "mindformers.yaml").write_text(
        text.replace("SET-ME-your-model-mindformers-config.yaml", str(LLAMA2))
    )
    out["overlay"] = (folder, c)
    # the CPU form: data parallel, accumulation folded into the batch
    c = Candidate(
        **dict(
            LAYOUTS["dp8"],
            fusion_mb=16,
            loss_scale=2**12,
            warmup_steps=50,
            jit_level="O1",
            recompute="none",
        )
    )
    folder = tmp_path / "cpu"
    write_export(make_spec(tmp_path, backend="cpu"), c, TRIAL, folder, mindformers_base=str(LLAMA2))
    out["cpu"] = (folder, c)
    return out


def test_exports_are_read_checked_and_batched_by_mindformers_as_tuned(tmp_path):
    exports = _exports(tmp_path)
    jobs = []
    for folder, c in exports.values():
        path = str(folder / "mindformers.yaml")
        jobs += [{"read": path}, {"batch": path, "device_num": c.devices}]
    results = consumer(tmp_path, jobs)
    for (name, (folder, c)), read, batch in zip(exports.items(), results[::2], results[1::2]):
        written = load_config(folder / "mindformers.yaml")
        assert read["raw"] == as_json(written), name  # MindFormers reads what autotune wrote
        assert read["template"] is None, (name, read["template"])  # its templates accept it
        # MindFormers' trainer: the tuned global batch (make_spec's 16) in every layout
        assert batch["global_batch_size"] == 16, (name, batch)
        # its batch_size afterwards: per rank in data parallel; the global batch with full_batch
        assert batch["batch_size"] == (16 // c.dp if name == "cpu" else 16), (name, batch)


def _init_70b(tmp_path):
    assert (
        main(
            [
                "init",
                "--mindformers",
                str(LLAMA70),
                "--backend",
                "simulate",
                "--total-steps",
                "1000",
                "--out",
                str(tmp_path / "model.yaml"),
            ]
        )
        == 0
    )
    return load_spec(tmp_path / "model.yaml")


def test_the_70b_export_builds_its_stages_in_mindformers_at_pp_2_4_8(tmp_path):
    spec = _init_70b(tmp_path)
    jobs, folders = [], {}
    for pp in (2, 4, 8):
        dp = 32 // (4 * pp)
        c = Candidate(
            dp=dp,
            tp=4,
            pp=pp,
            micro_batches=256 // dp,
            grad_accum=1,
            fusion_mb=16,
            loss_scale=1,
            warmup_steps=30,
            jit_level="O1",
            recompute="selective",
            parallel_optimizer=False,
        )
        folder = tmp_path / f"pp{pp}"
        write_export(spec, c, TRIAL, folder, mindformers_base=str(LLAMA70))
        folders[pp] = folder
        jobs.append({"layers": str(folder / "mindformers.yaml")})
    # the base as it was, its pipeline_stage changed to 4: what the old export wrote
    stale = load_config(LLAMA70)
    stale["parallel_config"]["pipeline_stage"] = 4
    (tmp_path / "stale.yaml").write_text(yaml.safe_dump(stale))
    jobs.append({"layers": str(tmp_path / "stale.yaml")})
    results = consumer(tmp_path, jobs)
    assert "IndexError" in results[-1]["error"]
    for pp, result in zip((2, 4, 8), results):
        assert "error" not in result, (pp, result)
        assert result["layer_list"] == [[80 // pp] * pp]
        # the base recomputes 8+4+4+1+1+1+1+1 = 21 layers' norms and SwiGLU patterns (init reads
        # them into model.recompute_layers, the study prices them); each stage keeps its span's
        for key in ("select_comm_recompute", "select_recompute"):
            for pattern, rows in result[key].items():
                assert sum(rows[0]) == 21 and len(rows[0]) == pp, (pp, key, pattern, rows)
        text = (folders[pp] / "mindformers.yaml").read_text()
        header = text.split("\nseed:")[0]
        assert "# Kept from the base, not tuned" in header
        assert f"# Per stage of pp = {pp}, the layers model.recompute_layers marks" in header
        assert yaml.safe_load(text)["parallel_config"]["use_seq_parallel"] is True  # as priced
    assert results[1]["select_comm_recompute"][r".*\.norm"][0] == [12, 5, 2, 2]  # pp 4


QWEN3_MOE = FIXTURES / "pretrain_qwen3_30b_a3b_4k.yaml"  # mcore: 48 layers, 128 experts


def test_a_qwen3_moe_export_builds_its_stages_in_mindformers_mcore_layers(tmp_path):
    """Qwen3-30B-A3B's own expert-parallel layout (tp4·pp4·ep4 on 16 devices) and a pp 2 one
    exported over its mcore config: MindFormers' mcore LayerSetting, over the TransformerConfig
    the model is built with, places 48 ÷ pp layers on each stage; and at tp 1 the export's
    sequence parallelism (the base's use_seq_parallel: True) would be refused by it."""
    assert (
        main(
            [
                "init",
                "--mindformers",
                str(QWEN3_MOE),
                "--backend",
                "simulate",
                "--out",
                str(tmp_path / "model.yaml"),
            ]
        )
        == 0
    )
    from autotune.spec.space import build_space

    spec = load_spec(tmp_path / "model.yaml")
    baseline = build_space(spec).baseline()
    assert (baseline.dp, baseline.tp, baseline.pp, baseline.ep) == (1, 4, 4, 4)
    assert baseline.micro_batches == 16 and spec.train.global_batch_size == 16
    layouts = {
        "pp4": baseline,
        "pp2": baseline.replace(dp=2, pp=2, micro_batches=8),
        "tp1": baseline.replace(dp=4, tp=1, micro_batches=4),  # sequence parallelism needs tp
    }
    jobs = []
    for name, c in layouts.items():
        write_export(spec, c, TRIAL, tmp_path / name, mindformers_base=str(QWEN3_MOE))
        jobs.append({"layers": str(tmp_path / name / "mindformers.yaml")})
    results = consumer(tmp_path, jobs)
    for (name, c), result in zip(layouts.items(), results):
        assert "error" not in result, (name, result)
        assert result["layer_list"] == [[48 // c.pp] * c.pp], (name, result)
