"""What a MindFormers trial is launched with besides its candidate (issue 44): the user's own
``--register_path`` kept beside autotune's files, candidates MindFormers' ``LayerSetting`` would
refuse under an interleaved pipeline screened out, and ``trial.yaml`` written whole."""

import os

import pytest
import yaml

from autotune.execution.mindformers_run import node_launch
from autotune.mindformers import CLUSTER_DIR
from autotune.mindformers.launch import ENTRY, launch
from autotune.mindformers.trial import RECORDER_FILE, TRIAL_FILE, trial_section
from autotune.spec.backends import BACKENDS
from autotune.spec.candidate import Candidate
from autotune.spec.constraints import violations
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.mindformers.conftest import RUN_MINDFORMER, TINY, mindformers_model


def _register_path(argv: list[str]) -> str:
    program = argv[argv.index(str(ENTRY)) :]
    return program[program.index("--register_path") + 1]


def test_the_users_register_path_is_kept_beside_the_recorders(tmp_path):
    """The Llama 3.1 README launches with ``--register_path research/llama3_1``: its modules
    (``auto_register: llama3_1_tokenizer.Llama3Tokenizer``) and autotune's recorder load from
    the one folder MindFormers takes."""
    user = tmp_path / "research" / "llama3_1"
    user.mkdir(parents=True)
    (user / "llama3_1_tokenizer.py").write_text("class Llama3Tokenizer: pass\n")
    (user / "infer").mkdir()
    spec = load_spec(mindformers_model(tmp_path, **{"trial.register_path": str(user)}))
    assert spec.trial.register_path == str(user)
    trial_dir = tmp_path / "trials" / "0"
    trial_dir.mkdir(parents=True)
    mf = trial_section(spec, build_space(spec).baseline(), 0, trial_dir)
    argv, _, _ = launch(
        mf, trial_dir, trial_dir / "logs", {}, workers=2, local_workers=2, master_port=8123
    )
    folder = trial_dir / "register"
    assert _register_path(argv) == str(folder)
    assert (folder / "llama3_1_tokenizer.py").resolve() == user / "llama3_1_tokenizer.py"
    assert (folder / "infer").resolve() == user / "infer"
    assert (folder / RECORDER_FILE).resolve() == CLUSTER_DIR / RECORDER_FILE
    # every node builds the same folder; the first in place is the one all use
    again, _, _ = launch(
        mf, trial_dir, trial_dir / "logs", {}, workers=2, local_workers=2, master_port=8123
    )
    assert _register_path(again) == str(folder)
    assert [p.name for p in trial_dir.iterdir() if p.name.startswith(".")] == []
    # without one, autotune's own folder, as before
    (tmp_path / "plain").mkdir()
    plain = load_spec(mindformers_model(tmp_path / "plain"))
    mf = trial_section(plain, build_space(plain).baseline(), 0, trial_dir)
    argv, _, _ = launch(mf, trial_dir, trial_dir, {}, workers=2, local_workers=2, master_port=1)
    assert _register_path(argv) == str(CLUSTER_DIR)


def test_a_register_path_is_the_checkouts_and_must_be_there(tmp_path):
    spec = load_spec(mindformers_model(tmp_path, **{"trial.register_path": "."}))
    assert spec.trial.register_path == str(RUN_MINDFORMER.parent)  # as run_mindformer.py takes it
    with pytest.raises(SpecError, match=r"trial\.register_path: .*no such folder"):
        load_spec(mindformers_model(tmp_path, **{"trial.register_path": "research/none"}))


def test_an_interleaved_pipeline_screens_what_layersetting_refuses(tmp_path):
    """num_layers % (pp · pp_interleave_num): MindFormers' LayerSetting._check_inputs raises
    unless the offsets sum to it, and the export writes offset 0."""
    base = tmp_path / "interleaved.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "base_config": str(TINY),
                "parallel": {"pipeline_config": {"pipeline_interleave": True}},
                "model": {"model_config": {"pp_interleave_num": 2, "num_layers": 6}},
            }
        )
    )
    settings = {"cluster.backend": "ascend", "cluster.device": "ascend-910b"}
    spec = load_spec(mindformers_model(tmp_path, base=base, **settings))
    baseline = build_space(spec).baseline()
    pp2 = Candidate(**{**baseline.as_dict(), "dp": 1, "pp": 2, "micro_batches": 2})
    refused = violations(spec, pp2)  # 2 · 2 = 4 stages of 6 layers
    assert any(
        "pp · pp_interleave_num = 2 · 2 does not divide num_layers = 6" in r for r in refused
    )
    pp1 = Candidate(**{**baseline.as_dict(), "dp": 2, "pp": 1})
    assert not violations(spec, pp1)  # 2 chunks of 3
    # without MindSpore's pipeline_interleave the interleave does not act: pp2 is 3 + 3
    off = tmp_path / "off.yaml"
    unset = {"pipeline_config": {"pipeline_interleave": False}}
    off.write_text(yaml.safe_dump({"base_config": str(base), "parallel": unset}))
    folder = tmp_path / "off"
    folder.mkdir()
    plain = load_spec(mindformers_model(folder, base=off, **settings))
    assert not violations(plain, pp2)


def test_each_node_writes_trial_yaml_whole(tmp_path):
    """A reader that opened trial.yaml (another node's worker on a shared folder) keeps reading
    the whole file it opened while a node writes it again: a new file renamed into place."""
    old = "a: 1\n" * 1000
    (tmp_path / TRIAL_FILE).write_text(old)
    mf = {"run_mindformer": str(RUN_MINDFORMER), "python": "/v/bin/python", "trial_yaml": "b: 2\n"}
    with open(tmp_path / TRIAL_FILE) as reader:
        node_launch(mf, tmp_path, tmp_path, {}, 2, None, False, BACKENDS["cpu"], 600)
        assert reader.read() == old
    assert (tmp_path / TRIAL_FILE).read_text() == "b: 2\n"
    assert oct(os.stat(tmp_path / TRIAL_FILE).st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == [TRIAL_FILE]
