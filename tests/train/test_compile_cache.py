"""The compile cache's graph key and its failures, on real one-process trials
(`autotune.train.runtime.compile_cache`; what it loads and stores across trials:
tests/execution/test_warm.py, slow).

- The key covers the source of every ``autotune`` module a trial process imported: a value one
  of them puts into a graph (``spec/knobs.py``'s loss-scale window, ``spec/backends.py``'s fused
  attention) cannot reach a trial through a graph stored before it changed.
- A cache that cannot read or write its folder is off for the process, said in one line on
  stderr; the trial runs and ends as it would without it.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

import autotune
import autotune.train
from autotune.train.runtime import compile_cache
from tests.conftest import make_config, run  # noqa: E402

# Runs the trial program on a config, then writes which autotune modules the process imported.
TRIAL_AND_MODULES = """
import json, sys
from autotune.train.__main__ import main
code = main([sys.argv[1]])
modules = {name: module.__file__ for name, module in list(sys.modules.items())
           if name.split(".")[0] == "autotune" and getattr(module, "__file__", None)}
json.dump({"code": code, "modules": modules}, open(sys.argv[2], "w"))
sys.exit(code)
"""


def _trial(tmp_path: Path, name: str, cache: Path) -> tuple[dict, str]:
    """A short one-process float16 trial with the compile cache in ``cache``: (what the wrapper
    wrote, stderr)."""
    out = tmp_path / name
    config = make_config(out, steps=4)
    data = json.loads(config.read_text())
    data["compile_cache"] = str(cache)
    config.write_text(json.dumps(data))
    program = tmp_path / "trial_and_modules.py"
    program.write_text(TRIAL_AND_MODULES)
    code, _, err = run([sys.executable, program, config, out / "modules.json"], timeout=240)
    assert (out / "modules.json").exists(), err[-3000:]
    return json.loads((out / "modules.json").read_text()), err


@pytest.fixture(scope="module")
def store_broken(tmp_path_factory):
    """A trial whose graph store cannot be written: ``graphs`` is a file where the folder of
    stored graphs would be (so any user, root included, gets an I/O error storing one)."""
    tmp = tmp_path_factory.mktemp("store")
    (tmp / "cache").mkdir()
    (tmp / "cache" / "graphs").write_text("not a folder")
    return (tmp, *_trial(tmp, "trial", tmp / "cache"))


def _said_off(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"{compile_cache.SAY} off")]


def test_a_store_that_cannot_be_written_turns_the_cache_off_and_the_trial_runs(store_broken):
    tmp, ran, err = store_broken
    assert ran["code"] == 0, err[-3000:]
    metrics = json.loads((tmp / "trial" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and not metrics["diverged"]
    (said,) = _said_off(err)  # one line, for the first failure only
    assert "graphs" in said and "the trial runs without it" in said


def test_a_cache_folder_that_cannot_be_made_turns_the_cache_off_and_the_trial_runs(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache's folder would be")
    ran, err = _trial(tmp_path, "trial", tmp_path / "cache")
    assert ran["code"] == 0, err[-3000:]
    assert json.loads((tmp_path / "trial" / "metrics.json").read_text())["steps"] == 4
    (said,) = _said_off(err)
    assert str(tmp_path / "cache") in said


def test_the_key_changes_with_every_autotune_module_a_trial_process_imported(
    store_broken, tmp_path, monkeypatch
):
    """Every module the trial process above imported, changed in a copy of the package (one
    at a time), changes the key's program digest: a module moved into another package later
    stays in it, as does one that puts a value into a graph (spec/knobs.py's SCALE_WINDOW)."""
    _, ran, _ = store_broken
    package = Path(autotune.__file__).parent
    imported = sorted({Path(path).relative_to(package) for path in ran["modules"].values()})
    assert Path("spec/knobs.py") in imported and Path("spec/backends.py") in imported
    copy = tmp_path / "autotune"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # the digest reads the package the process imported: here, the copy
    for module in (autotune, autotune.train, compile_cache):
        monkeypatch.setattr(
            module, "__file__", str(copy / Path(module.__file__).relative_to(package))
        )
    digest = compile_cache._program_digest.__wrapped__
    unchanged = digest()
    missed = []
    for relative in imported:
        source = copy / relative
        text = source.read_text()
        source.write_text(text + "\n# changed\n")
        if digest() == unchanged:
            missed.append(str(relative))
        source.write_text(text)
    assert digest() == unchanged
    assert not missed, f"the graph key misses modules the trial process imported: {missed}"
