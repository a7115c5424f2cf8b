"""Warm start: the measured trials of earlier studies of the same model and cluster.

Contract: :func:`earlier_studies` loads and checks the studies named by ``--warm-start`` before
the study being run is opened (a refusal writes nothing); :func:`warm_start` then brings their
trials into it, before it proposes anything, and returns the measurements that only calibrate.

- Only a study of the same model, training setup and cluster hardware is used: its
  fingerprint's ``model``, ``train`` and cluster (devices, devices_per_node, device,
  device_memory_gb) must equal this study's. Anything else is refused (SpecError naming the
  study and what differs): another model's step times say nothing about this one, not even
  through a common correction factor. A study named twice, the study itself, or one without a
  fingerprint is refused too.
- What it may give depends on how it measured (:func:`comparability`). Its trials stand as
  measurements here only when it ran on the same backend (a replay study: the same table) with
  the same trial length (``trial.steps``, ``measure_after``: the overflow rate, the loss and the
  timed steps all depend on them). The same backend with another trial length only calibrates
  (step time and memory per step are still its measurements). An estimate-only study
  (``simulate``) warm-starting a study that measures gives nothing but a note: its values are
  the cost model's own, which the prior already ranks by — copied, they would stand as
  measurements and calibrate the model to itself (factor 1). Any other backend is refused.
- Its trials that measured their candidate (`autotune.storage.counting.counted`, no infrastructure
  failure, not ``infeasible``: this study's screen judges feasibility itself) and whose
  candidate this study's space contains are copied in as finished trials with user attr
  ``warm_start`` = ``"STUDY#N"`` (once: a resume does not copy them again). They do not count
  toward N and cost no budget, but the sampler learns from them, a proposal of their candidate
  is answered from them (never run again), the prior marks them tried, and rankings and export
  see them (`autotune.storage.counting.is_search_trial`). One that measured the baseline is the baseline.
- Measured ``ok`` trials outside the space, or without a value for one of this study's
  objectives (so not comparable with its trials), are returned as ``(estimate, peak MB, step ms)``:
  they refit the calibration and the prior's correction only.
"""

from __future__ import annotations

import optuna

from autotune import costmodel
from autotune.spec.backends import DEFAULT_BACKEND, backend_of
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.objectives import objective_values
from autotune.storage.connection import open_storage
from autotune.storage.schema import knobs_of, metrics_of, outcome_of, settle
from autotune.study.opening import fingerprint
from autotune.study.retry import remembered_after_restart

SAME_CLUSTER = ("devices", "devices_per_node", "device", "device_memory_gb")
COPY, CALIBRATE, NOTHING = "copy", "calibrate", "nothing"  # what an earlier study gives


def comparability(mine: dict, theirs: dict) -> tuple[str, str]:
    """What an earlier study (fingerprint ``theirs``) gives this one (``mine``): ``COPY`` its
    trials, ``CALIBRATE`` only, or ``NOTHING``, and why (see the module doc); SpecError text
    when it is not comparable at all ("" when it is)."""
    ours, their = mine["cluster"], theirs.get("cluster", {})
    mine_kind, their_kind = (
        backend_of(ours["backend"]).kind,
        backend_of(their.get("backend", DEFAULT_BACKEND)).kind,
    )
    if their_kind == "estimate" and mine_kind != "estimate":
        return NOTHING, (
            f"it is a {their.get('backend')} study: its values are the cost "
            "model's estimates, which the prior already ranks by, not "
            "measurements; nothing copied, nothing calibrated"
        )
    if (ours["backend"], ours.get("replay_sha256")) != (
        their.get("backend"),
        their.get("replay_sha256"),
    ):
        what = "replay table" if ours["backend"] == their.get("backend") else "backend"
        raise SpecError(
            f"it measured on another {what} ({their.get('backend')}, this study: "
            f"{ours['backend']}); a warm start takes measurements of the same "
            "backend"
        )
    if mine["trial"] != theirs.get("trial"):
        return CALIBRATE, (
            f"its trials were {_length(theirs.get('trial'))}, this study's "
            f"{_length(mine['trial'])}: their values are not comparable; their "
            "step times and memory calibrate the cost model only"
        )
    return COPY, ""


def _length(trial: dict | None) -> str:
    trial = trial or {}
    return f"{trial.get('steps')} steps (measured after {trial.get('measure_after')})"


def _same_world(mine: dict, theirs: dict) -> list[str]:
    """What differs between two fingerprints in model, train and cluster hardware."""
    differs = [part for part in ("model", "train") if mine[part] != theirs.get(part)]
    cluster = theirs.get("cluster", {})
    differs += [f"cluster.{k}" for k in SAME_CLUSTER if mine["cluster"][k] != cluster.get(k)]
    return differs


def earlier_studies(spec, space, study_name: str, names, storage) -> list:
    """The studies ``names`` (in ``storage``: a URL or an Optuna storage object), checked
    before anything is written (see the module doc), as (study, what it gives, the note that
    says why it gives less than its trials — "" when it gives them)."""
    if not names:
        return []
    if len(set(names)) != len(names) or study_name in names:
        raise SpecError("--warm-start: name each earlier study once, and not this study itself")
    if isinstance(storage, str):
        storage = open_storage(storage)
    mine, studies = fingerprint(spec, space), []
    for name in names:
        try:
            earlier = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            raise SpecError(f"--warm-start {name}: no such study in the storage") from None
        theirs = earlier.user_attrs.get("fingerprint")
        if theirs is None:
            raise SpecError(
                f"--warm-start {name}: it has no fingerprint (created before "
                "fingerprints), so nothing says it measured the same model"
            )
        differs = _same_world(mine, theirs)
        if differs:
            raise SpecError(
                f"--warm-start {name}: it measured another {', '.join(differs)}; "
                "a warm start takes studies of the same model on the same cluster"
            )
        try:
            use, why = comparability(mine, theirs)
        except SpecError as e:
            raise SpecError(f"--warm-start {name}: {e}") from None
        studies.append((earlier, use, f"--warm-start {name}: {why}" if why else ""))
    return studies


def warm_start(spec, space, study: optuna.Study, earlier: list) -> list:
    """Bring the measurements of the ``earlier`` studies (:func:`earlier_studies`) into
    ``study`` (see the module doc); returns those that only calibrate, as ``[(candidate,
    estimate, metrics)]``."""
    done = {
        t.user_attrs["warm_start"]
        for t in study.get_trials(deepcopy=False)
        if "warm_start" in t.user_attrs
    }
    distributions, baseline = space.distributions(), space.baseline()
    calibration_only, copies = [], []
    for source, use, _ in earlier:
        if use == NOTHING:
            continue
        name = source.study_name
        for t in source.get_trials(deepcopy=False):
            outcome = outcome_of(t)
            if not remembered_after_restart(t) or outcome == "infeasible":
                continue
            candidate, metrics = Candidate(**knobs_of(t)), metrics_of(t)
            scored = objective_values(spec.search.objectives, metrics) is not None
            if use == CALIBRATE or not space.contains(candidate) or outcome == "ok" and not scored:
                if outcome == "ok":
                    calibration_only.append(
                        (candidate, costmodel.estimate(spec, candidate), metrics)
                    )
                continue
            tag = f"{name}#{t.number}"
            if tag in done:
                continue
            extra = {"warm_start": tag, **space.attrs_of(candidate)}
            if candidate == baseline:
                extra["baseline"] = True
            state, values, attrs = settle(
                spec.search.objectives, outcome, metrics, t.user_attrs.get("detail", ""), extra
            )
            params = space.params_of(candidate)
            copies.append(
                optuna.trial.create_trial(
                    state=state,
                    values=values,
                    params=params,
                    user_attrs=attrs,
                    distributions={k: distributions[k] for k in params},
                )
            )
    study.add_trials(copies)
    return calibration_only
