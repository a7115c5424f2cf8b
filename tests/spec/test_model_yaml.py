"""model.yaml and search-space validation: every error names its field or file, exits 2,
prints no traceback and writes nothing."""

import subprocess
import sys
import textwrap

import pytest

from autotune.cli import main
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.conftest import MINI_MODEL, ROOT

GOOD = (
    "\nstudy: t\n"
    + MINI_MODEL
    + """\
train: {global_batch_size: 8}
cluster: {backend: cpu, devices: 2}
"""
)


def write(tmp_path, text, name="model.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(tmp_path, capsys, *argv):
    storage = tmp_path / "out" / "s.db"
    code = main([*argv, "--storage", f"sqlite:///{storage}", "--artifacts", str(tmp_path / "art")])
    err = capsys.readouterr().err
    assert not storage.exists() and not (tmp_path / "art").exists(), "bad input wrote files"
    assert not (tmp_path / "out").exists()
    return code, err


@pytest.mark.parametrize(
    "patch, field",
    [
        ("cluster: {backend: cpu, devices: -1}", "cluster.devices"),
        ("cluster: {backend: tpu, devices: 2}", "cluster.backend"),
        ("cluster: {backend: cpu, devices: two}", "cluster.devices"),
        ("train: {global_batch_size: 0}", "train.global_batch_size"),
        ("train: {learning_rate: 0.1}", "train.global_batch_size"),
        ("trial: {steps: 5, measure_after: 5}", "trial.measure_after"),
        ("trial: {precision: 0}", "trial.precision: must be > 0 and < 1"),
        ("trial: {precision: 2}", "trial.precision: must be > 0 and < 1 (a share of the mean"),
        ("trial: {precision: two}", "trial.precision: must be float"),
        ("trial: {precision: .nan}", "trial.precision: must be a finite number"),
        ("trial: {min_steps: 1}", "trial.min_steps: must be ≥ 2"),
        ("trial: {min_steps: 2.5}", "trial.min_steps: must be int"),
        (
            "trial: {steps: 10, measure_after: 5, min_steps: 6}",
            "trial.min_steps: must be ≤ 5 (trial.steps − trial.measure_after = 5 measured steps)",
        ),
        ("search: {sampler: annealing}", "search.sampler"),
        ("search: {objectives: [speed]}", "search.objectives"),
        ("search: {space: {tp: [1, 2], warp: [1]}}", "warp"),
        ("search: {space: {warmup_steps: {low: 10, high: 0}}}", "warmup_steps"),
        ("search: {space: {fusion_mb: []}}", "fusion_mb"),
        ("search: {space: {jit_level: [O3]}}", "jit_level"),
        ("search: {space: {loss_scale: [1000]}}", "loss_scale"),
        ("search: {space: nope.yaml}", "nope.yaml"),
        ("model: {family: transformer, num_layers: 2}", "model.hidden_size"),
        ("model: {family: cnn, num_layers: 2}", "model.family"),
        ("model: {entry: 'missing_file.py:build'}", "model.entry"),
        ("model: {entry: 'no_such_module_xyz:build'}", "model.entry"),
        ("color: blue", "color"),
        (
            "train: {global_batch_size: 8, learning_rate: .inf}",
            "train.learning_rate: must be a finite number",
        ),
        ("cluster: {backend: cpu, devices: 2, device_memory_gb: .nan}", "cluster.device_memory_gb"),
        (
            "model: {family: transformer, num_layers: 2, hidden_size: 30, num_heads: 4, seq_length: 16,"
            " vocab_size: 64}",
            "model.hidden_size: 30 is not a multiple of model.num_heads = 4",
        ),
        # how MindFormers runs a llama (autotune init --mindformers writes these)
        (
            "model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,"
            " vocab_size: 64, sequence_parallel: true}",
            "model.sequence_parallel: describes MindFormers' llama",
        ),
        (
            "model: {family: llama, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,"
            " vocab_size: 64, recompute_layers: {select_recompute: [0, 2]}}",
            "model.recompute_layers.select_recompute: must be true or a list of layer indices 0 … 1",
        ),
        (
            "model: {family: llama, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,"
            " vocab_size: 64, recompute_layers: {swap: [0]}}",
            "model.recompute_layers.swap: unknown key",
        ),
        # MindSpore 2.10 has no bfloat16 MatMul on CPU (test_train_program measures it)
        (
            "model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,"
            " vocab_size: 64, dtype: bfloat16}",
            "model.dtype: bfloat16 does not run on backend cpu",
        ),
    ],
)
def test_bad_model_yaml_exits_2_naming_the_field(tmp_path, capsys, patch, field):
    import yaml

    data = yaml.safe_load(GOOD)
    data.update(yaml.safe_load(patch))
    path = write(tmp_path, yaml.safe_dump(data))
    code, err = run_cli(tmp_path, capsys, "search", str(path))
    assert code == 2
    assert field in err and err.startswith("error: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "content",
    [bytes(range(256)) * 4, b"\x00\x01\x02", b"\xff\xfe"],
    ids=["binary", "nul-bytes", "not-utf8"],
)
def test_a_file_that_is_not_yaml_text_exits_2(tmp_path, capsys, content):
    path = tmp_path / "model.yaml"
    path.write_bytes(content)
    code, err = run_cli(tmp_path, capsys, "search", str(path))
    assert code == 2 and str(path) in err and "Traceback" not in err


def test_a_key_given_twice_exits_2_naming_it_and_its_line(tmp_path, capsys):
    # YAML itself keeps the last silently: the user's first value would be dropped unseen
    path = write(
        tmp_path,
        GOOD.replace(
            "train: {global_batch_size: 8}",
            "train:\n  global_batch_size: 8\n  global_batch_size: 16",
        ),
    )
    code, err = run_cli(tmp_path, capsys, "search", str(path))
    assert code == 2 and "line 7: 'global_batch_size' is given twice" in err


@pytest.mark.parametrize(
    "storage, reason",
    [
        ("{tmp}/plain.db", "Could not parse SQLAlchemy URL"),  # a path, not a URL
        ("sqlite:///{tmp}/garbage.db", "file is not a database"),
        ("mysql://nobody@127.0.0.1:1/x", "Failed to import DB access module"),  # no driver here
    ],
    ids=["plain-path", "not-a-database", "no-driver"],
)
@pytest.mark.parametrize("verb", ["search", "export", "studies"])
def test_a_storage_optuna_cannot_open_exits_2_naming_it(tmp_path, capsys, storage, reason, verb):
    (tmp_path / "garbage.db").write_bytes(bytes(range(256)) * 8)
    storage = storage.format(tmp=tmp_path)
    argv = {
        "search": ["search", str(tmp_path / "model.yaml")],
        "export": ["export", "t", "--out", str(tmp_path / "ex")],
        "studies": ["studies"],
    }[verb]
    if verb == "search":
        write(tmp_path, GOOD)
    assert main([*argv, "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert f"--storage: cannot open {storage}: " in err and reason in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["garbage.db"] + (["model.yaml"] if verb == "search" else [])
    )


def test_bad_tp_rule_names_the_rule(tmp_path):
    (tmp_path / "m.py").write_text("def build(config):\n    return None\n")
    path = write(
        tmp_path,
        GOOD.replace(
            "model: {family: transformer,",
            "model: {entry: 'm.py:build', tp_rules: {'w.*': diagonal},",
        ),
    )
    with pytest.raises(SpecError, match=r"model\.tp_rules\.w\.\*: must be one of column"):
        load_spec(path)


def test_no_feasible_candidate_is_an_input_error(tmp_path):
    # dp = 2 is the only layout left, and a batch of 3 never splits over 2 replicas
    path = write(
        tmp_path,
        GOOD.replace("global_batch_size: 8", "global_batch_size: 3")
        + "search: {space: {tp: 1, pp: 1}}\n",
    )
    with pytest.raises(SpecError, match="no feasible candidate"):
        build_space(load_spec(path))


def test_cpu_keeps_the_layouts_that_fit_and_offers_no_o2(tmp_path):
    space = build_space(load_spec(write(tmp_path, GOOD)))
    # 2 devices: tp and pp of 1 or 2 (the engine runs them on CPU); 4 and 8 fit no layout
    assert space.domains["tp"] == (1, 2) and space.domains["pp"] == (1, 2)
    assert (
        "tp: 4, 8 removed: no feasible layout of this model on 2 devices uses them" in space.notes
    )
    assert "O2" not in space.domains["jit_level"]  # not in the default space (deprecated)
    openers = space.layout_openers(load_spec(write(tmp_path, GOOD)))
    assert {(c.dp, c.tp, c.pp) for c in openers} == {(1, 2, 1), (1, 1, 2)}
    assert all(c.micro_batches >= c.pp for c in openers)


def test_ranges_expand(tmp_path):
    space = build_space(
        load_spec(
            write(tmp_path, GOOD.replace("vocab_size: 64}", "vocab_size: 64, dtype: float16}"))
        )
    )
    assert space.domains["fusion_mb"] == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert space.domains["loss_scale"][0] == 2**8 and space.domains["loss_scale"][-1] == 2**24
    # 0…2000 by 100, of which a 30-step trial of 10000 steps tells 7 apart (the next test)
    assert space.domains["warmup_steps"][:3] == (0, 300, 700)


def test_warmups_a_trial_cannot_tell_apart_are_one(tmp_path):
    """The default space's 21 warmups compress onto 7 trial schedules."""
    from autotune.spec.knobs import trial_warmup

    space = build_space(load_spec(write(tmp_path, GOOD)))
    kept = space.domains["warmup_steps"]
    assert kept == (0, 300, 700, 1000, 1300, 1700, 2000)
    assert len({trial_warmup(w, 10000, 30) for w in kept}) == len(kept)
    assert (
        "warmup_steps: 100 → 0; 200, 400 → 300; 500, 600, 800 → 700; 900, 1100 → 1000; "
        "1200, 1400, 1500 → 1300; 1600, 1800 → 1700; 1900 → 2000: a 30-step trial of the "
        "10000-step schedule compresses them to the same warmup, so they would run alike"
    ) in space.notes
    # a longer trial tells more apart; the replay and simulate backends keep the file's values
    longer = build_space(load_spec(write(tmp_path, GOOD + "trial: {steps: 200}\n")))
    assert len(longer.domains["warmup_steps"]) == 21


def test_loss_scale_is_fixed_when_nothing_is_scaled(tmp_path):
    space = build_space(load_spec(write(tmp_path, GOOD)))  # float32
    assert space.domains["loss_scale"] == (2**16,)
    assert (
        "loss_scale: fixed to 65536: float32 compute is not loss-scaled, so the value changes nothing"
        in space.notes
    )


def test_entry_model_keeps_tp_and_pp_at_one(tmp_path):
    (tmp_path / "m.py").write_text("def build(config):\n    return None\n")
    space = build_space(
        load_spec(
            write(
                tmp_path,
                GOOD.replace("model: {family: transformer,", "model: {entry: 'm.py:build',"),
            )
        )
    )
    assert space.domains["tp"] == (1,) and space.domains["pp"] == (1,)
    assert (
        "tp: fixed to 1: a model.entry network is not written for tensor or pipeline parallelism"
        in space.notes
    )


def test_simulate_keeps_model_parallel_and_fixes_what_it_cannot_estimate(tmp_path):
    text = GOOD.replace("backend: cpu, devices: 2", "backend: simulate, devices: 8")
    space = build_space(load_spec(write(tmp_path, text)))
    assert space.domains["tp"] == (1, 2, 4)  # 8 ∤ 4 heads
    assert space.domains["loss_scale"] == (2**16,) and space.domains["warmup_steps"] == (0,)
    # the jit level's factors on accelerators are guesses: a simulated "finding" would be fixed
    assert space.domains["jit_level"] == ("O1",)
    assert sorted(n.split(":")[0] for n in space.notes) == [
        "jit_level",
        "loss_scale",
        "pp",
        "tp",
        "warmup_steps",
    ]


def test_sampler_with_missing_extra_is_an_input_error(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("cmaes") is not None:
        pytest.skip("cmaes is installed here")
    path = write(
        tmp_path, GOOD.replace("backend: cpu, devices: 2", "backend: simulate, devices: 2")
    )
    code, err = run_cli(tmp_path, capsys, "search", str(path), "--sampler", "cmaes")
    assert code == 2 and "autotune[cmaes]" in err


def test_real_process_exits_2_without_traceback(tmp_path):
    path = write(tmp_path, GOOD.replace("devices: 2", "devices: -1"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            str(path),
            "--storage",
            f"sqlite:///{tmp_path}/x.db",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "cluster.devices" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [path]


def test_examples_validate():
    for example in (ROOT / "examples").glob("*.yaml"):
        assert main(["validate", str(example)]) == 0
