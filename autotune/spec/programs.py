"""Trial programs: what a study's trials run (``trial.program``) — one :class:`TrialProgram`
each, the one place that says so.

Contract: :data:`PROGRAMS` maps ``trial.program`` names to their :class:`TrialProgram`, built in:
autotune's own trainer (:data:`DEFAULT_PROGRAM`, `autotune.train`) and MindFormers'
``run_mindformer.py`` on the user's config, legacy or mcore (`autotune.spec.mindformers_trial`,
`autotune.mindformers`). A program states, on the driver's side, every rule that depends on it:

- its ``trial`` keys (:attr:`~TrialProgram.keys`, :meth:`~TrialProgram.read_trial`: model.yaml's
  reader, `autotune.spec.model_yaml`, names ``trial.<key>`` in its errors; a key of another
  program is refused naming the program that reads it, :func:`read_trial`);
- what the study needs before any trial (:meth:`~TrialProgram.check`: SpecError, exit 2, at
  ``autotune validate``/``search`` start; the trainer's: no option its network does not build,
  ``autotune.families.moe.TRAINER_UNBUILT``, on a backend whose trials are its runs);
- the candidates it cannot run (:meth:`~TrialProgram.refusals`: hard constraints,
  `autotune.spec.constraints`) and the knob values it runs only (:meth:`~TrialProgram.space_limits`:
  the space's filter and the note it prints, `autotune.spec.space`);
- what executes its steps (:attr:`~TrialProgram.engine`, one of `autotune.spec.backends.ENGINES`:
  the engine the cost model prices its trials as, `autotune.costmodel.estimate.default_engine`);
- what makes its trials another measurement than autotune's trainer's (:meth:`~TrialProgram.
  fingerprint`, `autotune.study.opening`);
- what the export writes of how its trials ran (:meth:`~TrialProgram.export_notes` into
  summary.json's ``trials``, :meth:`~TrialProgram.launch_note` into launch.sh's header).

How its real trials are prepared, launched and read back is its run side, an
`autotune.execution.program_run.ProgramRun` registered under the same name (below the driver's
rooms, the spec cannot import it). No module outside these two registries names a program
(tests/house/test_programs.py checks it, and that every program implements every method). Adding
a program is an entry here and its run side; :func:`register_program` adds one from outside the
package (a test's toy), which runs on the ``simulate`` and ``replay`` backends — the trial's
processes know only the run sides the runner's package registers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.families.moe import trainer_unbuilt
from autotune.spec.backends import ENGINES, backend_of
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS
from autotune.spec.mindformers_trial import (
    check_mindformers_trial,
    cpu_refusals,
    mindformers_launch_line,
    read_mindformers_keys,
)
from autotune.spec.specs import DEFAULT_PROGRAM

if TYPE_CHECKING:
    from autotune.spec.candidate import Candidate
    from autotune.spec.specs import Spec


class TrialProgram(ABC):
    """One trial program's driver-side rules (see the module doc). ``name`` is its
    ``trial.program`` value, ``keys`` the ``trial`` keys it reads beyond the common ones,
    ``engine`` what executes its steps."""

    name: str
    keys: tuple[str, ...] = ()
    engine: str

    @abstractmethod
    def read_trial(self, section, base: Path, stored: bool) -> dict:
        """Its ``keys`` of model.yaml's ``trial`` section (model_yaml's section reader:
        ``section.get``, ``section.fail``) as `autotune.spec.specs.TrialSpec` fields — a key
        TrialSpec names no field for goes into ``options`` — paths made absolute against
        ``base`` (model.yaml's folder); ``stored`` (a study's copy, for export): files that only a
        search needs are not checked."""

    @abstractmethod
    def check(self, spec: Spec, stored: bool) -> None:
        """Raise SpecError, one line naming the field, when ``spec``'s trials cannot run with
        this program at all (before any trial; ``stored``: what a search only needs is not
        checked)."""

    @abstractmethod
    def refusals(self, spec: Spec, c: Candidate) -> list[str]:
        """Why this program cannot run ``c`` of ``spec`` (empty: it can): hard constraints."""

    @abstractmethod
    def space_limits(self, spec: Spec) -> tuple[dict, str | None]:
        """``({knob: [values]}, note)``: the only values of those knobs this program runs in
        ``spec``'s study (known before running), and the note the space prints; ``({}, None)``."""

    @abstractmethod
    def fingerprint(self, spec: Spec) -> dict:
        """Keys of the study's fingerprint (its ``trial`` part) that make its trials another
        measurement than autotune's trainer's: ``{}`` for the trainer (older studies resume)."""

    @abstractmethod
    def export_notes(self, spec: Spec, script: str) -> dict:
        """What summary.json's ``trials`` entry records beside the program's name of how the
        study's trials ran, for an export whose launch.sh is at ``script``: ``autotune export``
        prints its ``launch`` (the line that runs the export as they ran) and ``note``."""

    @abstractmethod
    def launch_note(self, spec: Spec) -> str:
        """launch.sh's header lines (each ``# …\\n``) saying how the trials ran, or ``""``."""


class Trainer(TrialProgram):
    """autotune's own trainer (``python -m autotune.train``): every layout the family splits,
    on every backend; its keys are the common ones."""

    name = DEFAULT_PROGRAM
    engine = "trainer"

    def read_trial(self, section, base: Path, stored: bool) -> dict:
        return {}

    def check(self, spec: Spec, stored: bool) -> None:
        # the model.yaml's own checks are the trainer's, but for what its network does not build:
        # a property of the model, so every trial would fail — refused before any, where the
        # trials are its runs (an estimate or a table prices them; a stored study's export too)
        backend = backend_of(spec.cluster.backend)
        if stored or backend.kind != "program":
            return
        for key, value, why in trainer_unbuilt(lambda key: getattr(spec.model, key, None)):
            raise SpecError(
                f"{spec.source}: model.{key}: {value}: {why} (autotune's trainer runs every "
                f"trial on backend {backend.name}); study this model on cluster.backend "
                "simulate, run its trials as MindFormers runs (trial.program mindformers), "
                "or leave the key out"
            )

    def refusals(self, spec: Spec, c: Candidate) -> list[str]:
        # the layout's are every program's (`autotune.spec.constraints`); what a trial of the
        # trainer cannot run is refused before dispatch, so it is recorded infeasible rather
        # than failing as an error (an estimate or a table prices any cp)
        if c.cp > 1 and backend_of(spec.cluster.backend).kind == "program":
            return [
                f"cp = {c.cp}: autotune's trainer splits no sequence (context parallelism runs "
                "in MindFormers trials; price it on cluster.backend simulate)"
            ]
        return []

    def space_limits(self, spec: Spec) -> tuple[dict, str | None]:
        return {}, None

    def fingerprint(self, spec: Spec) -> dict:
        return {}

    def export_notes(self, spec: Spec, script: str) -> dict:
        return {}

    def launch_note(self, spec: Spec) -> str:
        return ""  # launch.sh runs the trainer itself


class MindFormers(TrialProgram):
    """MindFormers' ``run_mindformer.py`` on the config ``export.mindformers_base`` names, in
    MindFormers' own interpreter (`autotune.spec.mindformers_trial` says what it needs): MindSpore's
    engine; on a backend whose MindFormers runs data parallel only (the CPU) no tp, pp,
    parallel optimizer, and one ``grad_accum`` (folded into the per-rank batch)."""

    name = "mindformers"
    keys = ("run_mindformer", "python", "data", "register_path")
    engine = "mindspore"

    def read_trial(self, section, base: Path, stored: bool) -> dict:
        return read_mindformers_keys(section, base, stored)

    def check(self, spec: Spec, stored: bool) -> None:
        check_mindformers_trial(spec, stored)

    def _data_parallel_only(self, spec: Spec) -> bool:
        return backend_of(spec.cluster.backend).mindformers_cpu_form

    def refusals(self, spec: Spec, c: Candidate) -> list[str]:
        if not self._data_parallel_only(spec):
            return []
        return [f"MindFormers on CPU: {reason}" for reason in cpu_refusals(c)]

    def space_limits(self, spec: Spec) -> tuple[dict, str | None]:
        if not self._data_parallel_only(spec):
            return {}, None
        accum = spec.baseline.get("grad_accum", KNOBS["grad_accum"].default)
        note = (
            f"trial.program {self.name} on {spec.cluster.backend}: MindFormers runs data parallel "
            "only here (tp, pp and the parallel optimizer are semi-auto/Ascend-only: not searched; "
            f"grad_accum, folded into the batch, is one run: {accum})"
        )
        return {"tp": [1], "pp": [1], "parallel_optimizer": [False], "grad_accum": [accum]}, note

    def fingerprint(self, spec: Spec) -> dict:
        return {"program": self.name, "data": spec.trial.data}

    def export_notes(self, spec: Spec, script: str) -> dict:
        notes = {"launch": mindformers_launch_line(spec, script), "data": spec.trial.data}
        if spec.trial.data == "synthetic":
            notes["note"] = (
                "they read a synthetic MindRecord: add -- --train_dataset_dir PATH, or train on "
                "the config's own dataset"
            )
        return notes

    def launch_note(self, spec: Spec) -> str:
        line = mindformers_launch_line(spec, "launch.sh")
        return f"# The study's trials ran MindFormers: {line}\n"


PROGRAMS: dict[str, TrialProgram] = {}


def register_program(program: TrialProgram) -> TrialProgram:
    """Add ``program`` (an instance: an incomplete class cannot be made one) under its name;
    ValueError for a taken name or an engine the cost model does not price."""
    if program.name in PROGRAMS:
        raise ValueError(f"trial program {program.name!r} is registered already")
    if program.engine not in ENGINES:
        raise ValueError(
            f"trial program {program.name!r}: engine must be one of {', '.join(ENGINES)}, "
            f"got {program.engine!r}"
        )
    PROGRAMS[program.name] = program
    return program


for _program in (Trainer(), MindFormers()):
    register_program(_program)


def program_of(spec: Spec) -> TrialProgram:
    """The program ``spec``'s trials run."""
    return PROGRAMS[spec.trial.program]


def read_trial(section, base: Path, stored: bool) -> dict:
    """``trial.program`` and the chosen program's keys of model.yaml's ``trial`` section, as
    `autotune.spec.specs.TrialSpec` fields; a key only another program reads is refused, naming
    that program."""
    name = section.get("program", str, default=DEFAULT_PROGRAM, choices=tuple(PROGRAMS))
    program = PROGRAMS[name]
    for other in PROGRAMS.values():
        for key in set(other.keys) - set(program.keys):
            if section.data.get(key) is not None:
                section.fail(key, f"is read by trial.program {other.name} only (program is {name})")
            section.used.add(key)  # None: the key left empty, as model.yaml allows
    return {"program": name, **program.read_trial(section, base, stored)}
