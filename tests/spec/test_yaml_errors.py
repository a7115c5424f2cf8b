"""Every way a YAML file can be bad is exit 2 with the file, and the line and column where YAML
knows them — never a traceback, and never a Python object built: PyYAML's
constructor, scanner, parser, composer and reader errors, a value its tag cannot hold, a file
that is not UTF-8, and the alias bomb, on each command that reads a file the user wrote:
``validate`` and ``search`` (model.yaml), ``init`` (a MindFormers config) and ``export``
(``--mindformers-base``)."""

from pathlib import Path

import pytest

from autotune.cli import main
from tests.conftest import ROOT
from tests.spec.test_yaml_bomb import bomb

# (the bad part, what the error must say); each document is a mapping around it
BAD = {
    "constructor": (
        'run: !!python/object/apply:os.system ["touch {marker}"]\n',
        "(line 2, column 6): could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'",
    ),
    "value": ("when: 2001-13-45\n", "(line 2, column 7): month must be in 1..12"),
    "scanner": ("a: b: c\n", "(line 2, column 5): mapping values are not allowed here"),
    "parser": ("list: [1, 2\nnext: 3\n", "(line 3, column 5): expected ',' or ']'"),
    "composer": ("x: *nowhere\n", "(line 2, column 4): found undefined alias 'nowhere'"),
    "reader": ("bell: \x07\n", "(line 2, column 7): unacceptable character #x0007"),
}


def _write(path: Path, head: str, bad: str, marker: Path) -> None:
    path.write_text(head + bad.format(marker=marker))


def _refused(argv, capsys, *needles) -> str:
    """Run the CLI; it must exit 2 with one error line holding every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


ASCEND = """study: ascend
model: {family: transformer, num_layers: 2, hidden_size: 256, num_heads: 4, seq_length: 128,
        vocab_size: 1024, dtype: bfloat16}
train: {global_batch_size: 16}
cluster: {backend: simulate, devices: 2, devices_per_node: 2, device: ascend-910b}
search: {n_trials: 2, space: {fusion_mb: 64, loss_scale: 1024, warmup_steps: 0, jit_level: O1}}
"""


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """A simulated study of an Ascend pool (MindFormers runs there): what export merges into a
    MindFormers base."""
    folder = tmp_path_factory.mktemp("ascend")
    (folder / "model.yaml").write_text(ASCEND)
    url = f"sqlite:///{folder}/autotune.db"
    assert main(["search", str(folder / "model.yaml"), "--storage", url]) == 0
    return url


@pytest.mark.parametrize("kind", BAD)
def test_every_yaml_error_is_exit_2_with_its_line_and_column(tmp_path, storage, capsys, kind):
    bad, says = BAD[kind]
    marker = tmp_path / "executed"
    model = tmp_path / "model.yaml"
    _write(model, "study: bad\n", bad, marker)
    for verb in ("validate", "search"):
        _refused([verb, str(model)], capsys, f"{model}: not valid YAML", says)
    config = tmp_path / "mf.yaml"
    _write(config, "seed: 0\n", bad, marker)
    _refused(
        [
            "init",
            "--mindformers",
            str(config),
            "--devices",
            "2",
            "--out",
            str(tmp_path / "out.yaml"),
        ],
        capsys,
        f"{config}: not valid YAML",
        says,
    )
    _refused(
        [
            "export",
            "ascend",
            "--out",
            str(tmp_path / "export"),
            "--storage",
            storage,
            "--mindformers-base",
            str(config),
        ],
        capsys,
        f"{config}: not valid YAML",
        says,
    )
    assert not marker.exists() and not (tmp_path / "out.yaml").exists()
    assert not (tmp_path / "export").exists()


def test_a_file_that_is_not_utf8_and_an_alias_bomb_are_exit_2_everywhere(tmp_path, storage, capsys):
    for name, content, says in (
        ("latin.yaml", "study: caf\xe9\n".encode("latin-1"), "not a text (UTF-8) file"),
        (
            "bomb.yaml",
            ("study: b\n" + bomb()).encode(),
            "its aliases expand it to more than 1,000,000 YAML nodes",
        ),
    ):
        path = tmp_path / name
        path.write_bytes(content)
        for verb in ("validate", "search"):
            _refused([verb, str(path)], capsys, str(path), says)
        _refused(
            [
                "init",
                "--mindformers",
                str(path),
                "--devices",
                "2",
                "--out",
                str(tmp_path / "out.yaml"),
            ],
            capsys,
            str(path),
            says,
        )
        _refused(
            [
                "export",
                "ascend",
                "--out",
                str(tmp_path / "export"),
                "--storage",
                storage,
                "--mindformers-base",
                str(path),
            ],
            capsys,
            str(path),
            says,
        )


def test_a_set_value_that_is_not_yaml_is_exit_2(tmp_path, capsys):
    model = ROOT / "examples" / "quickstart.yaml"
    _refused(
        ["validate", str(model), "--set", "tp=!!python/object/apply:os.system [x]"],
        capsys,
        "--set 'tp=!!python/object/apply:os.system [x]': not a YAML value: could "
        "not determine a constructor",
    )
