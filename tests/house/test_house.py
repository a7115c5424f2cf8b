"""The house: packages by concept with checked import contracts, and each piece of logic once.

`lint-imports` checks the contracts of pyproject.toml (make test runs it first); here a violation
of each contract is planted in a copy of the package and seen to break exactly that contract,
so no contract is one that cannot fail.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.moved import MOVED
from tests.conftest import MINI_MODEL, ROOT

PACKAGE = ROOT / "autotune"
LINT = Path(sys.executable).with_name("lint-imports")

# contract id → (module file, the import that breaks it)
PLANTED = {
    "layers": ("storage/schema.py", "import autotune.study.run"),
    "spec": ("spec/knobs.py", "import optuna"),
    "layout": ("layout.py", "import autotune.spec.knobs"),
    "costmodel": ("costmodel/estimate.py", "import optuna"),
    "train": ("train/config.py", "import autotune.spec.space"),
    "storage": ("storage/schema.py", "import autotune.costmodel"),
    "search": ("search/proposer.py", "import autotune.execution.executors"),
    "execution": ("execution/executors.py", "import autotune.storage.schema"),
    "stopping": ("stopping/budget.py", "import autotune.search.prior"),
    "analysis": ("analysis/frames.py", "import autotune.study.run"),
    "export": ("export/writer.py", "import autotune.study.run"),
    "mindformers": ("mindformers/config.py", "import mindspore"),
    "no-mindformers": ("execution/runner.py", "import mindformers.core"),
}


def lint(root: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy shadows the installed package
    return subprocess.run(
        [str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def contract_ids() -> list[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return [c["id"] for c in config["contracts"]]


def test_every_contract_has_a_planted_violation():
    assert sorted(PLANTED) == sorted(contract_ids())


def test_the_package_keeps_its_contracts():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(PLANTED)} kept, 0 broken." in done.stdout


def test_a_planted_violation_breaks_its_contract(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    for contract, (module, line) in PLANTED.items():
        target = copy / "autotune" / module
        original = target.read_text()
        target.write_text(original + f"\n{line}  # planted by tests/house/test_house.py\n")
        try:
            done = lint(copy, "--contract", contract)
        finally:
            target.write_text(original)
        assert done.returncode == 1 and "BROKEN" in done.stdout, (contract, done.stdout)
        assert f"{module.replace('/', '.').removesuffix('.py')}" in done.stdout.replace(
            "autotune.", ""
        ), (contract, done.stdout)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_nothing_of_autotune_imports_mindformers_and_its_cluster_files_import_nothing_of_autotune():
    """autotune never imports MindFormers (its own venv pins numpy < 2 and another MindSpore): no
    module of the package does, and the files MindFormers' interpreter runs
    (`autotune.mindformers.CLUSTER_DIR`: not a package, never imported) import MindFormers,
    MindSpore, numpy and the standard library only."""
    from autotune.mindformers import CLUSTER_DIR

    cluster = sorted(CLUSTER_DIR.glob("*.py"))
    assert cluster and not (CLUSTER_DIR / "__init__.py").exists()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == CLUSTER_DIR:
            continue
        tops = {name.split(".")[0] for name in _imports(path)}
        assert "mindformers" not in tops, path
    allowed = {"mindformers", "mindspore", "numpy", *sys.stdlib_module_names}
    for path in cluster:
        tops = {name.split(".")[0] for name in _imports(path)}
        assert tops <= allowed, (path.name, tops - allowed)


def test_the_encoding_takes_only_distributions_of_optuna():
    # the one import the spec contract lets through
    optuna = {m for m in _imports(PACKAGE / "spec" / "encoding.py") if m.split(".")[0] == "optuna"}
    assert optuna == {"optuna.distributions"}


def test_package_inits_re_export_nothing_that_drags_in_more():
    # a package __init__ that imports its modules would hand every caller their imports (the
    # trial program imports spec.knobs and must not get spec.space's Optuna with it)
    for package in (
        "spec",
        "storage",
        "search",
        "execution",
        "stopping",
        "study",
        "analysis",
        "train",
    ):
        imported = {
            m for m in _imports(PACKAGE / package / "__init__.py") if m.startswith("autotune")
        }
        assert not imported, (package, imported)


def _sources():
    return [(p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def _assignments(name: str) -> list[Path]:
    return [
        p
        for p, text in _sources()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]


def test_the_scale_window_is_defined_once():
    assert _assignments("SCALE_WINDOW") == [PACKAGE / "spec" / "knobs.py"]
    from autotune.export import configs
    from autotune.spec.knobs import SCALE_WINDOW

    assert (
        configs.loss_scale_cell(type("C", (), {"loss_scale": 1024})())["scale_window"]
        == SCALE_WINDOW
    )


def test_proc_stat_is_read_in_one_place():
    readers = [p for p, text in _sources() if '/stat"' in text or "/stat'" in text]
    assert readers == [PACKAGE / "procfs.py"]


def test_the_start_ticks_of_a_process_agree_everywhere():
    from autotune import procfs
    from autotune.storage.drivers import alive, driver_id

    me = driver_id()
    assert me.split("/")[-1] == str(procfs.start_ticks(os.getpid()))
    assert alive(me) is True
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        theirs = driver_id(child.pid)
        assert alive(theirs) is True and procfs.stat(child.pid).ppid == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert alive(theirs) is False and procfs.start_ticks(child.pid) is None


def test_the_first_objectives_direction_is_read_in_one_place():
    readers = [
        p
        for p, text in _sources()
        if "StudyDirection" in text or '"MAXIMIZE"' in text or '== "maximize"' in text
    ]
    assert readers == [PACKAGE / "storage" / "schema.py"]


def test_folders_are_staged_and_renamed_in_one_place(tmp_path):
    # a temporary folder beside the output, renamed into place: files.staged_folder, used by
    # the export, the report, the compile cache and MindFormers trials' synthetic dataset
    makers = [p.relative_to(PACKAGE).as_posix() for p, text in _sources() if "mkdtemp(" in text]
    assert makers == ["execution/ray_cluster.py", "files.py"]  # ray_cluster: Ray's own temp folder
    users = [
        p.relative_to(PACKAGE).as_posix() for p, text in _sources() if "staged_folder(" in text
    ]
    assert users == [
        "analysis/report/__init__.py",
        "export/writer.py",
        "files.py",
        "mindformers/data.py",
        "train/runtime/compile_cache.py",
    ]

    from autotune.files import staged_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_folder(out) as staged:
            (staged / "half.txt").write_text("half")
            raise RuntimeError("failed half way")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "old.txt").exists()
    with staged_folder(out) as staged:
        (staged / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


BATCH_SPEC = (
    "study: t\n"
    + MINI_MODEL
    + """\
train: {global_batch_size: 12}
cluster: {backend: cpu, devices: 2}
"""
)


@pytest.mark.parametrize(
    "knobs, broken",
    [
        ({"dp": 2, "pp": 1, "grad_accum": 2}, False),
        ({"dp": 2, "pp": 1, "grad_accum": 4}, True),  # 12 over dp·grad_accum = 8
        ({"dp": 1, "pp": 2, "micro_batches": 2}, False),
        ({"dp": 1, "pp": 2, "micro_batches": 8}, True),  # 12 over dp·micro_batches = 8
        ({"dp": 1, "pp": 2, "micro_batches": 1}, True),  # fewer micro-batches than stages
    ],
)
def test_the_batch_split_is_one_rule_for_the_search_and_the_trial_program(tmp_path, knobs, broken):
    # spec.constraints screens a candidate, train.config_check.check_config refuses its config: the
    # same rule (spec.knobs.batch_split_problems) with the same words, the program's naming the
    # field

    from autotune.spec.constraints import violations
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.train.config import ConfigError, trial_config
    from autotune.train.config_check import check_config

    (tmp_path / "model.yaml").write_text(BATCH_SPEC)
    spec = load_spec(tmp_path / "model.yaml")
    candidate = build_space(spec).baseline().replace(**knobs)
    config = trial_config(
        spec, candidate, study="t", number=0, out_dir=tmp_path, steps=5, measure_after=1
    )
    reasons = violations(spec, candidate)
    assert bool(reasons) == broken
    if not broken:
        check_config(config)
        return
    with pytest.raises(ConfigError) as refused:
        check_config(config)
    field, _, said = str(refused.value).partition(": ")
    assert said == reasons[0] and field in ("train.global_batch_size", "knobs.micro_batches")
    definers = [
        p.relative_to(PACKAGE).as_posix()
        for p, text in _sources()
        if "micro_batches < " in text or "micro_batches >= " in text
    ]
    assert definers == ["spec/knobs.py"]


def _renames() -> list[str]:
    """The modules that rename a file into place (``os.replace``, ``Path.replace(target)``)."""
    found = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("replace", "rename")
                and (
                    (isinstance(node.func.value, ast.Name) and node.func.value.id == "os")
                    or (len(node.args) == 1 and not node.keywords)
                )
            ):
                found.append(path.relative_to(PACKAGE).as_posix())
    return sorted(set(found))


def test_json_files_are_written_whole_in_one_place(tmp_path):
    # write then rename: files.write_json (the trial's metrics, the warm pool's handovers, a
    # trial's config.json) and files.staged_folder; a checkpoint is MindSpore's own file
    assert _renames() == ["files.py", "train/checkpoint.py"]

    from autotune.files import write_json

    path = tmp_path / "metrics.json"
    value = {"goodput": 1.5, "loss": float("nan"), "note": "µ", "steps": [1, 2]}
    for indent in (None, 1, 2):  # the writers' formats, each byte for byte json.dumps's
        write_json(path, value, indent=indent)
        assert path.read_bytes() == json.dumps(value, indent=indent).encode()
    with pytest.raises(TypeError):
        write_json(path, {"half": object()})
    assert path.read_bytes() == json.dumps(value, indent=2).encode()  # left as it was
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_values_json_cannot_hold_become_null_in_one_place():
    nan, inf = float("nan"), float("inf")
    definers = [
        p
        for p, text in _sources()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef)
        and "isfinite" in ast.unparse(node)
        and "return None" in ast.unparse(node)
        and "isinstance(value, dict)" in ast.unparse(node)
    ]
    assert definers == [PACKAGE / "files.py"]
    from autotune.files import json_safe
    from autotune.storage.schema import settle

    assert json_safe({"a": [nan, 1.0, (inf,)]}) == {"a": [None, 1.0, [None]]}
    _, _, attrs = settle(["goodput"], "error", {"loss_last": nan}, extra={"estimate": {"x": -inf}})
    assert attrs["loss_last"] is None and attrs["estimate"] == {"x": None}


ENTRY = """
import mindspore as ms
from mindspore import nn

import helper  # a neighbour of model.yaml


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(helper.WIDTH, 4)

    def construct(self, x):
        return self.dense(x)


def build(config):
    import numpy as np

    def dataset(step, shard, num_shards):
        rng = np.random.default_rng(step)
        n = config["train"]["global_batch_size"] // num_shards
        return rng.standard_normal((n, helper.WIDTH)).astype(np.float32), rng.integers(0, 4, n).astype(np.int32)

    return Net(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), dataset
"""


def sibling_entry_model(tmp_path) -> Path:
    """model.yaml with ``entry: "mymodel:build"``, mymodel.py (which imports its neighbour
    helper.py) beside it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mymodel.py").write_text(textwrap.dedent(ENTRY))
    (folder / "helper.py").write_text("WIDTH = 8\n")
    (folder / "model.yaml").write_text(
        textwrap.dedent("""
        study: sibling
        model: {entry: "mymodel:build", dtype: float32}
        train: {global_batch_size: 8}
        cluster: {backend: cpu, devices: 1}
        search: {space: {fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0,
                         jit_level: O1, recompute: none}, n_trials: 1}
        trial: {steps: 3, measure_after: 1, timeout_s: 240}
        """)
    )
    return folder / "model.yaml"


def test_an_entry_beside_model_yaml_loads_alike_for_validation_export_and_the_trial(tmp_path):
    from autotune.execution.environment import environment
    from autotune.export.params import model_parameters
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import load_spec
    from autotune.train.config import trial_config

    path = sibling_entry_model(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # none of the three may rely on the current folder
    try:
        spec = load_spec(path)  # validation imports it
        candidate = Candidate(1, 1, 1, 1, 64, 1, 1024, 0, "O1", "none")
        config = trial_config(
            spec, candidate, study="s", number=0, out_dir=elsewhere, steps=3, measure_after=1
        )
        assert model_parameters(spec, config) == {"dense.weight": (4, 8), "dense.bias": (4,)}
    finally:
        os.chdir(ROOT)
    # the trial program's process: the runner's environment, the trial folder as its cwd
    code = (
        "import json, sys; from autotune.train.models.entry import build; "
        "net, loss, data = build(json.load(open(sys.argv[1]))); "
        "print(sorted(p.name for p in net.get_parameters()))"
    )
    (elsewhere / "config.json").write_text(__import__("json").dumps(config))
    done = subprocess.run(
        [sys.executable, "-c", code, "config.json"],
        cwd=elsewhere,
        env=environment(config=config),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['dense.bias', 'dense.weight']"


def test_the_trials_the_search_ran_are_one_set_for_every_view(tmp_path):
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.analysis import frames, ranking, view
    from autotune.export.from_study import select_trial
    from autotune.storage.counting import search_trials
    from autotune.study.confirm import plan

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna_study(storage)

    def trial(state, value=None, tp=1, **attrs):
        outcome = {TrialState.COMPLETE: "ok", TrialState.FAIL: "error"}[state]
        return create_trial(
            state=state,
            values=None if value is None else [value],
            params={"log2_tp": tp.bit_length() - 1},
            distributions={"log2_tp": IntDistribution(0, 2)},
            user_attrs={"outcome": attrs.pop("outcome", outcome), "tp": tp, "dp": 8 // tp, **attrs},
        )

    study.add_trials(
        [
            trial(TrialState.COMPLETE, 100.0, baseline=True),  # 0 the baseline
            trial(TrialState.COMPLETE, 120.0, tp=2),  # 1
            trial(TrialState.COMPLETE, 999.0, tp=2, repeat_of=1),  # 2 answered from memory
            trial(TrialState.COMPLETE, 500.0, tp=2, confirm_of=1),  # 3 a confirm re-run
            trial(TrialState.FAIL, tp=4, outcome="interrupted"),  # 4 ran again later
            trial(TrialState.FAIL, tp=4, infrastructure=True),  # 5 lost, retried
            trial(TrialState.COMPLETE, 110.0, tp=4, retry_of=5),  # 6 its retry
            trial(TrialState.COMPLETE, 150.0, tp=4, warm_start="earlier#3"),  # 7 a warm start's
        ]
    )
    searched = [t.number for t in search_trials(study.get_trials())]
    assert searched == [0, 1, 6, 7]
    assert [t.number for t in view.view("s", storage).ran] == searched  # show, report
    assert [t.number for t in ranking.ranked_ok(study)] == [7, 1, 6, 0]  # rankings
    summary = frames.summary(["s"], storage)["s"]  # compare
    assert summary["best_trial"] == 7 and summary["trials_to_3pct"] == 4
    assert [t.number for t in plan(study, top=1, runs=1)] == [7, 0]  # confirm
    assert select_trial(study).number == ranking.best_confirmed(study).number == 1  # export
    assert select_trial(study, 6).number == 6


def optuna_study(storage):
    import optuna

    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.set_user_attr("objectives", ["goodput"])
    return study


def test_no_test_imports_a_benchmark_and_every_record_says_what_it_measured():
    # benchmarks/ holds the tools kept in step with the code; benchmarks/records/ the MindSpore
    # fact checks and decision records, each headed by the commit it measured
    benchmarks = {p.stem for p in (ROOT / "benchmarks").rglob("*.py")}
    for test in sorted((ROOT / "tests").rglob("*.py")):
        imported = {m.split(".")[0] for m in _imports(test)}
        assert not imported & (benchmarks | {"benchmarks"}), (test.name, imported & benchmarks)
    records = sorted((ROOT / "benchmarks" / "records").glob("*.py"))
    assert records
    for record in records:
        head = record.read_text().splitlines()[0]
        assert re.fullmatch(r"# measured at [0-9a-f]{7,40}", head), (record.name, head)


def test_a_moved_module_is_importable_by_its_old_name_and_says_where_it_went():
    """Every old name of `autotune.moved.MOVED` gives the new module itself, with a
    DeprecationWarning naming the new place; a module that became a package serves its old
    attributes (one fresh process: the old names must not be imported yet)."""
    probe = textwrap.dedent("""
        import importlib, sys, warnings
        from autotune.moved import BECAME_PACKAGES, MOVED
        for old, new in MOVED.items():
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                if old in BECAME_PACKAGES:
                    module = importlib.import_module(new)
                    name = next(n for n in vars(module) if not n.startswith("_") and
                                getattr(getattr(module, n), "__module__", None) == new)
                    assert getattr(importlib.import_module(old), name) is getattr(module, name), old
                else:
                    assert importlib.import_module(old) is importlib.import_module(new), old
            said = [str(w.message) for w in seen if w.category is DeprecationWarning]
            assert any(new in s and old in s for s in said), (old, said)
        print("ok", len(MOVED))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", str(len(MOVED))]
