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
- a study of a tiny CPU llama, exported, trained by MindFormers' ``run_mindformer.py`` through
  ``launch.sh --mindformers`` on 2 data-parallel ranks (its loss lines are printed).

What the CPU run cannot show (tp, pp and the parallel optimizer under MindFormers): docs/mindformers.md.
"""

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

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


MAKE_TOKENS = """
import sys
import numpy as np
from mindspore.mindrecord import FileWriter
out, rows, seq, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writer = FileWriter(out, shard_num=1, overwrite=True)
writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]},
                   "labels": {"type": "int32", "shape": [-1]}}, "tokens")
rng = np.random.default_rng(0)
ids = [rng.integers(0, vocab, seq + 1, dtype=np.int32) for _ in range(rows)]
writer.write_raw_data([{"input_ids": x, "labels": x} for x in ids])
writer.commit()
"""
LOSS_LINE = re.compile(r"step:\[\s*(\d+)/\s*(\d+)\], loss:\[([0-9.e+-]+)/")


def test_a_study_exported_for_cpu_trains_under_mindformers_own_trainer(tmp_path, capsys):
    """init → a simulate study of the CPU → export → run_mindformer.py on 2 ranks."""
    python = _venv()
    model = tmp_path / "model.yaml"
    assert (
        main(["init", "--mindformers", str(TINY), "--backend", "simulate", "--out", str(model)])
        == 0
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(model),
                "--storage",
                storage,
                "--trials",
                "3",
                "--artifacts",
                str(tmp_path / "trials"),
            ]
        )
        == 0
    )
    # trial 0 is the config's own layout: dp 2, 2 accumulated micro-batches of 2
    assert (
        main(
            [
                "export",
                "tiny_llama_cpu",
                "--storage",
                storage,
                "--trial",
                "0",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 0
    )
    exported = yaml.safe_load((tmp_path / "x" / "mindformers.yaml").read_text())
    assert (
        exported["parallel"]["parallel_mode"] == 0 and exported["runner_config"]["batch_size"] == 4
    )
    data = tmp_path / "tokens.mindrecord"
    subprocess.run(
        [python, "-c", MAKE_TOKENS, str(data), "16", "32", "128"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    checkout = tmp_path / "mf"  # run_mindformer.py writes output/ and modules/ where it runs
    checkout.mkdir()
    shutil.copy(HERE / "run_mindformer.py", checkout)
    env = {**os.environ, "PATH": f"{Path(python).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        [
            "bash",
            str(tmp_path / "x" / "launch.sh"),
            "--mindformers",
            str(checkout),
            "--out",
            str(tmp_path / "run"),
            "--",
            "--train_dataset_dir",
            str(data),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = (tmp_path / "run" / "logs" / "worker_0.log").read_text(errors="replace")
    assert done.returncode == 0, log[-4000:]
    losses = [line for line in log.splitlines() if LOSS_LINE.search(line)]
    with capsys.disabled():
        print("\nMindFormers' run_mindformer.py on the export (rank 0):")
        for line in losses:
            print("  " + line[line.index("{") :])
    # 16 samples / global batch 8 = 2 steps an epoch, 2 epochs (the base's runner_config)
    assert len(losses) == 4
    values = [float(LOSS_LINE.search(line).group(3)) for line in losses]
    assert all(math.isfinite(v) for v in values) and values[-1] < values[0]
    assert (
        "global_batch_size = batch_size_per_card * device_num * gradient_accumulation_steps "
        "= 8 = 4 * 2 * 1" in log
    )
