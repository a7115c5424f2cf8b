"""Opening a study for a run: create it, or resume it and check that it is the same study.

Contract:
- :func:`open_study` (storage: a URL, or an Optuna storage object) creates the study (storing
  the spec, objectives, backend, :func:`fingerprint` and param encoding), or loads it with
  ``resume``; it refuses to reuse a name without ``resume`` and refuses a resume whose
  fingerprint differs, naming what changed (SpecError). Two drivers starting at once on a
  server database: one creates, the other resumes (`autotune.storage.drivers.locked`).
- :func:`fingerprint` is what makes two runs the same study: the ``model`` (a field added
  since studies were first stored is left out at its default, so an older study still matches)
  and ``train`` sections, the cluster (backend, devices, devices_per_node, device, device_memory_gb,
  max_device_memory_gb where given, and a replay study's table by its SHA-256), the resolved search space, the objectives and
  ``trial.steps``/``measure_after``, and what the trial program says makes its trials another
  measurement (`autotune.spec.programs.TrialProgram.fingerprint`). Not ``n_trials``, the
  sampler, the seed or the timeout: those may change between runs of one study. Nor
  ``trial.precision``/``min_steps``: they set how precisely a trial measures its step time before it stops, not what it measures (a goodput
  known to ±2 % and one known to ±5 % estimate the same number; a final_loss study never stops
  early), so a resume may tighten or loosen them and its trials stay comparable (so does a warm
  start's).
- :func:`older_measurements` is the one line a resumed study says when it holds trials the
  trial program measured by older rules (`autotune.train.metrics.MEASUREMENT`).
- :func:`encoding_of` is how the study's knobs are Optuna params (`autotune.spec.encoding`):
  stored on every study when it is created; a study created before ordered knobs has none and
  keeps its categorical params; an encoding this version does not know is a SpecError.
- :func:`as_created` is the space a resumed study keeps running: its encoding, and each knob
  added since it was created (`autotune.spec.knobs.Knob.added_later`) fixed at the default the
  study ran with. The fingerprint leaves such a knob out while it is fixed at its default, so a
  study created before it resumes (and a new study that fixes it so fingerprints alike). A study
  created before warmups a trial cannot tell apart were merged
  (`autotune.spec.space_narrowing.merge_warmups`) keeps its own warmup values.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import optuna

from autotune.costmodel.estimate import default_engine
from autotune.spec.encoding import CATEGORICAL, ENCODINGS
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOBS
from autotune.spec.model_section import LATER_MODEL_FIELDS
from autotune.spec.objectives import directions as objective_directions
from autotune.spec.programs import program_of
from autotune.spec.specs import Spec
from autotune.storage.bulk import read_all
from autotune.storage.connection import open_storage
from autotune.storage.drivers import locked


def fingerprint(spec: Spec, space) -> dict:
    """The parts of a study that must not change when it is resumed, as plain JSON values."""
    c = spec.cluster
    cluster = {
        "backend": c.backend,
        "devices": c.devices,
        "devices_per_node": c.devices_per_node,
        "device": c.device,
        "device_memory_gb": c.device_memory_gb,
    }
    if c.max_device_memory_gb is not None:  # a later field: absent from older fingerprints
        cluster["max_device_memory_gb"] = c.max_device_memory_gb
    if c.replay:  # another table is another world (only replay studies have the key)
        cluster["replay_sha256"] = hashlib.sha256(Path(c.replay).read_bytes()).hexdigest()
    # a field added later, at the value that means what studies before it ran, is left out
    model = {
        k: v
        for k, v in asdict(spec.model).items()
        if k not in LATER_MODEL_FIELDS or v != LATER_MODEL_FIELDS[k]
    }
    parts = {
        "model": model,
        "train": asdict(spec.train),
        "cluster": cluster,
        "space": {
            name: list(values)
            for name, values in space.domains.items()
            if not (KNOBS[name].added_later and values == (KNOBS[name].default,))
        },
        "objectives": list(spec.search.objectives),
        "trial": {"steps": spec.trial.steps, "measure_after": spec.trial.measure_after},
    }
    # another program is another measurement (a later field: none for autotune's trainer)
    parts["trial"].update(program_of(spec).fingerprint(spec))
    return json.loads(json.dumps(parts, default=str))  # what storage gives back


def open_study(
    spec: Spec, space, storage: str, study_name: str, resume: bool, sampler, pruner=None
) -> optuna.Study:
    """Create the study, or load it when resuming (see the module doc)."""
    directions = objective_directions(spec.search.objectives)
    if isinstance(storage, str):  # else an Optuna storage object (benchmarks: in memory)
        url, storage = storage, open_storage(storage, create=True)
    else:
        url = type(storage).__name__
    with locked(storage, 0):  # two drivers starting at once: one creates, the other resumes
        study, exists = _create_or_load(
            spec, space, storage, url, study_name, resume, sampler, pruner
        )
    if exists and [d.name.lower() for d in study.directions] != directions:
        raise SpecError(f"search.objectives: {study_name!r} was created with other objectives")
    return study


def _create_or_load(spec, space, storage, url, study_name, resume, sampler, pruner):
    """(the study, whether it existed before)."""
    directions = objective_directions(spec.search.objectives)
    exists = study_name in optuna.get_all_study_names(storage)
    if exists and not resume:
        raise SpecError(
            f"--study: study {study_name!r} already exists in {url}; "
            "pass --resume to continue it or choose another name"
        )
    mine = fingerprint(spec, space)
    if exists:
        old = optuna.load_study(study_name=study_name, storage=storage)
        stored = old.user_attrs.get("fingerprint")
        mine = fingerprint(spec, as_created(old, space)[0])
        changed = [part for part in mine if stored is not None and stored.get(part) != mine[part]]
        if changed:
            raise SpecError(
                f"--resume: {study_name!r} was run with other {', '.join(changed)} "
                f"({spec.source} changed since); resume it with the file it was "
                "created with, or start a new study"
            )
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        sampler=sampler,
        directions=directions,
        load_if_exists=True,
        pruner=pruner,
    )
    if exists:  # a resume reads all of it: in one pass, not through Optuna's ORM
        read_all(study)
    else:
        study.set_user_attr("model_yaml", spec.raw)
        study.set_user_attr("model_yaml_path", spec.source)
        study.set_user_attr("objectives", list(spec.search.objectives))
        study.set_user_attr("backend", spec.cluster.backend)
        # what executes its trials: a table of them (`compare --csv`) replays with that prior
        study.set_user_attr("engine", default_engine(spec))
        study.set_user_attr("fingerprint", mine)
        study.set_user_attr("param_encoding", space.encoding)
    return study, exists


def as_created(study: optuna.Study, space) -> tuple:
    """(the space ``study`` keeps running, notes saying what was kept as it was); see the module
    doc."""
    notes, domains = [], dict(space.domains)
    stored = (study.user_attrs.get("fingerprint") or {}).get("space")
    for name, knob in KNOBS.items():
        if (
            stored is not None
            and knob.added_later
            and name not in stored
            and domains[name] != (knob.default,)
        ):
            domains[name] = (knob.default,)
            notes.append(
                f"{name}: fixed to {knob.default}: {study.study_name!r} was created "
                "before the knob existed"
            )
    warmups = tuple((stored or {}).get("warmup_steps", domains["warmup_steps"]))
    if warmups != domains["warmup_steps"] and set(domains["warmup_steps"]) <= set(warmups):
        domains["warmup_steps"] = warmups  # created before warmups were merged: it keeps its own
        notes.append(
            f"warmup_steps: {study.study_name!r} was created before warmups a trial "
            "cannot tell apart were merged: it keeps its own"
        )
    encoding = encoding_of(study)
    if encoding != space.encoding:
        notes.append(
            f"{study.study_name!r} was created before ordered knobs: its knobs stay "
            f"{encoding} params"
        )
    return replace(space, domains=domains, encoding=encoding), notes


def older_measurements(study: optuna.Study, measurement: int) -> str | None:
    """One line when ``study`` holds measured trials (``ok``, ``diverged``) recorded by the trial
    program's rules before ``measurement`` (`autotune.train.metrics.MEASUREMENT`; none recorded:
    1), else None: the trials a resume adds are measured by the new rules, and the two groups'
    numbers may differ by what changed (docs/search.md, "Old studies")."""
    older = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("outcome") in ("ok", "diverged")
        and t.user_attrs.get("measurement", 1) < measurement
    ]
    if not older:
        return None
    return (
        f"{len(older)} of {study.study_name!r}'s measured trials were measured by autotune's "
        f"rules before measurement {measurement} (a warm pool's peak memory and budget, the "
        "stop rule's estimate, the graph key, the timeout's clock, the underflow probe: "
        'docs/search.md, "Old studies"); the trials this run adds are measured by the new '
        "ones — differences between the two groups within those rules' effects are not findings"
    )


def encoding_of(study: optuna.Study) -> str:
    """How ``study`` samples its knobs (see the module doc)."""
    encoding = study.user_attrs.get("param_encoding", CATEGORICAL)
    if encoding not in ENCODINGS:
        raise SpecError(
            f"--resume: {study.study_name!r} samples its knobs as {encoding!r}, which "
            f"this autotune does not know ({', '.join(ENCODINGS)}); resume it with "
            "the autotune that created it"
        )
    return encoding
