"""Trial programs are a door (docs/architecture.md, "A trial program"): every registered program
implements every method of both sides, no module outside the two registries names one, and a toy
third program — defined and registered here only, no edit under autotune/ — is read, checked,
screened, priced, fingerprinted, replayed, exported and refused where it cannot run, through the
real command, Optuna and the cost model. The registries are restored after the test."""

import ast
import csv
import json
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.costmodel import estimate
from autotune.execution.program_run import RUNS, ProgramRun, register_run
from autotune.execution.runner import TrainerRun
from autotune.spec.backends import ENGINES, backend_of
from autotune.spec.constraints import violations
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS
from autotune.spec.model_yaml import load_spec
from autotune.spec.programs import PROGRAMS, TrialProgram, register_program
from autotune.spec.space import build_space
from autotune.storage.schema import knobs_of, outcome_of
from tests.conftest import ROOT, SMALL_CPU_SIMULATE, naming
from tests.mindformers.conftest import mindformers_model

PACKAGE = ROOT / "autotune"
REGISTRIES = (PACKAGE / "spec" / "programs.py", PACKAGE / "execution" / "program_run.py")


def contract_gaps(name: str) -> list[str]:
    """What program ``name`` leaves out of the contract, on either side (empty: nothing)."""
    gaps = []
    program = PROGRAMS[name]
    if not isinstance(program, TrialProgram) or type(program).__abstractmethods__:
        gaps.append(f"spec side: {sorted(type(program).__abstractmethods__)} not implemented")
    if program.engine not in ENGINES:
        gaps.append(f"engine {program.engine!r} is not one the cost model prices")
    run = RUNS.get(name)
    if run is None:
        gaps.append("no run side registered under its name")
    elif not issubclass(run, ProgramRun) or run.__abstractmethods__:
        gaps.append(f"run side: {sorted(run.__abstractmethods__)} not implemented")
    elif not (isinstance(run.warm_pools, bool) and isinstance(run.compile_cache, bool)):
        gaps.append("run side: warm_pools and compile_cache must be stated")
    return gaps


def spec_of(name: str, tmp_path: Path):
    """A study whose trials are program ``name``'s, on this CPU (MindFormers': the tiny legacy
    llama over a synthetic dataset; the interpreter is never run here)."""
    if PROGRAMS[name].keys:
        return load_spec(mindformers_model(tmp_path))
    path = tmp_path / "model.yaml"
    path.write_text("study: s\n" + SMALL_CPU_SIMULATE.replace("simulate", "cpu"))
    return load_spec(path)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_program_implements_every_method_on_both_sides(name, tmp_path):
    assert contract_gaps(name) == []
    program, spec = PROGRAMS[name], spec_of(name, tmp_path)
    assert spec.trial.program == name == program.name
    space = build_space(spec)
    c = space.baseline()
    assert all(isinstance(reason, str) for reason in program.refusals(spec, c))
    limits, note = program.space_limits(spec)
    assert set(limits) <= set(KNOBS) and (note is None or isinstance(note, str))
    for limited, values in limits.items():  # the space holds only what the program runs
        assert set(space.domains[limited]) <= set(values)
    json.dumps([program.fingerprint(spec), program.export_notes(spec, "launch.sh")])
    assert all(line.startswith("# ") for line in program.launch_note(spec).splitlines())


def test_the_built_in_programs_and_their_run_sides_are_the_same_names():
    assert set(PROGRAMS) == set(RUNS) and len(PROGRAMS) >= 2


def test_an_incomplete_program_or_run_side_is_refused():
    class Half(TrialProgram):
        name, engine = "half", "trainer"

    with pytest.raises(TypeError, match="abstract"):
        register_program(Half())
    with pytest.raises(ValueError, match="registered already"):
        register_program(PROGRAMS[sorted(PROGRAMS)[0]])

    class HalfRun(ProgramRun):
        name = "half"

    with pytest.raises(ValueError, match="does not implement"):
        register_run(HalfRun)
    assert "half" not in PROGRAMS and "half" not in RUNS


def test_no_module_outside_the_registries_names_a_program():
    """A grep for ``program ==`` / ``program !=`` anywhere in autotune/, and its AST form: no
    comparison with, dict keyed by or tuple of program names outside the two registries — each
    such rule is a method of the program instead."""
    words, found = set(PROGRAMS), []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in REGISTRIES:
            continue
        text, where = path.read_text(), path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if "program ==" in line or "program !=" in line:
                found.append(f"{where}:{number}: {line.strip()}")
        found += [f"{where}:{number}: {why}" for number, why in naming(ast.parse(text), words)]
    assert not found, "\n".join(found)


def test_the_check_sees_each_way_of_naming_a_program():
    """The check above can fail: each form it looks for, planted."""
    words = set(PROGRAMS)
    planted = {
        'if spec.trial.program == "mindformers": pass': True,
        'fresh = program != "autotune"': True,
        'ENGINE = {"mindformers": "mindspore"}': True,
        'PROGRAMS = ("autotune", "mindformers")': True,
        'section = config.get("mindformers"); run("autotune")': False,
    }
    for source, named in planted.items():
        assert bool(naming(ast.parse(source), words)) == named, source


# --- a toy third program, registered here only ----------------------------------------------

TOY_ENGINE = "megatron"  # what its steps run on: priced so, where the trainer's would not be


class Toy(TrialProgram):
    """Trials that are replayed rows or estimates of a Megatron-LM run: one key of its own
    (``trial.flavour``), no tensor parallelism, one accumulation step."""

    name, keys, engine = "toy", ("flavour",), TOY_ENGINE

    def read_trial(self, section, base, stored):
        return {"options": {"flavour": section.get("flavour", str, choices=("plain", "spicy"))}}

    def check(self, spec, stored):
        backend = backend_of(spec.cluster.backend)
        if backend.runs_program:
            raise SpecError(
                f"{spec.source}: trial.program: toy on backend {backend.name}: its trials are "
                "replayed rows or estimates only"
            )

    def refusals(self, spec, c):
        return [f"the toy splits no tensor (tp = {c.tp})"] if c.tp > 1 else []

    def space_limits(self, spec):
        return {"grad_accum": [1]}, "trial.program toy: grad_accum 1 only"

    def fingerprint(self, spec):
        return {"program": self.name, "flavour": spec.trial.options["flavour"]}

    def export_notes(self, spec, script):
        return {"launch": f"toy-run {script}", "flavour": spec.trial.options["flavour"]}

    def launch_note(self, spec):
        return f"# The study's trials ran the toy ({spec.trial.options['flavour']})\n"


class ToyRun(TrainerRun):
    """Its run side: autotune's trainer's (never reached: its check refuses real backends)."""

    name = Toy.name


@pytest.fixture
def toy():
    saved_programs, saved_runs = dict(PROGRAMS), dict(RUNS)
    register_program(Toy())
    register_run(ToyRun)
    yield PROGRAMS["toy"]
    PROGRAMS.clear(), PROGRAMS.update(saved_programs)
    RUNS.clear(), RUNS.update(saved_runs)


TOY_STUDY = """\
study: toy
model: {family: transformer, num_layers: 2, hidden_size: 64, num_heads: 4, seq_length: 32,
        vocab_size: 256, dtype: float16}
train: {global_batch_size: 16}
cluster: {backend: replay, replay: table.csv, devices: 2, devices_per_node: 2, device: cpu}
search:
  space: {tp: [1, 2], pp: 1, grad_accum: [1, 2], fusion_mb: 64, loss_scale: 65536,
          warmup_steps: 0, jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 4
  seed: 0
trial: {program: toy, flavour: plain}
"""


def _toy_study(tmp_path: Path, text: str = TOY_STUDY) -> Path:
    with open(tmp_path / "table.csv", "w", newline="") as f:
        csv.writer(f).writerows(
            [["tp", "goodput", "step_time_ms", "peak_memory_mb"], [1, 400.0, 40.0, 300.0]]
        )
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_toy_third_program_registered_here_runs_a_replay_study_and_its_export(
    toy, tmp_path, capsys
):
    assert contract_gaps("toy") == []
    model = _toy_study(tmp_path)
    storage = f"sqlite:///{tmp_path}/toy.db"
    search = ["search", str(model), "--storage", storage, "--sampler", "grid", "--no-confirm"]
    assert main(search) == 0
    notes = capsys.readouterr().out
    assert "trial.program toy: grad_accum 1 only" in notes  # its space limit, said
    # its refusal is a hard constraint: tp 2 leaves the space as no feasible layout's
    assert "tp: 2 removed: no feasible layout" in notes
    spec = load_spec(model)
    assert spec.trial.options == {"flavour": "plain"}
    c = build_space(spec).baseline()
    assert violations(spec, c.replace(tp=2, dp=1)) == ["the toy splits no tensor (tp = 2)"]
    study = optuna.load_study(study_name="toy", storage=storage)
    assert [(knobs_of(t)["tp"], knobs_of(t)["grad_accum"]) for t in study.trials] == [(1, 1)]
    # its engine: what the study's estimates price
    (ok,) = study.trials
    assert outcome_of(ok) == "ok" and ok.user_attrs["goodput"] == 400.0
    assert ok.user_attrs["estimate"] == estimate(spec, c, engine=TOY_ENGINE).as_dict()
    assert ok.user_attrs["estimate"] != estimate(spec, c, engine="trainer").as_dict()
    # its fingerprint: another flavour is another measurement, refused on resume
    spicy = model.read_text().replace("flavour: plain", "flavour: spicy")
    model.write_text(spicy)
    assert main([*search, "--resume"]) == 2
    assert "was run with other trial" in capsys.readouterr().err
    model.write_text(spicy.replace("flavour: spicy", "flavour: plain"))

    out = tmp_path / "export"
    assert main(["export", "toy", "--storage", storage, "--out", str(out)]) == 0
    assert f"run it as the study's trials ran: toy-run {out / 'launch.sh'}" in (
        capsys.readouterr().out
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == {
        "program": "toy",
        "launch": f"toy-run {out / 'launch.sh'}",
        "flavour": "plain",
    }
    assert "\n# The study's trials ran the toy (plain)\n" in (out / "launch.sh").read_text()
    assert yaml.safe_load((out / "launch.yaml").read_text())  # the export is whole


@pytest.mark.parametrize(
    "edit, said",
    [
        (("flavour: plain", "flavour: bitter"), "trial.flavour: must be one of plain, spicy"),
        (("backend: replay, replay: table.csv", "backend: cpu"), "toy on backend cpu: its"),
        (("program: toy, ", ""), "trial.flavour: is read by trial.program toy only"),
        (("flavour: plain", "python: x"), "trial.python: is read by trial.program mindformers"),
    ],
)
def test_the_toys_keys_and_check_are_the_specs_errors(toy, tmp_path, capsys, edit, said):
    model = _toy_study(tmp_path, TOY_STUDY.replace(*edit))
    assert main(["validate", str(model)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
