"""Warm start: the measured trials of earlier studies of the same model and cluster.

Contract: :func:`earlier_studies` loads and checks the studies named by ``--warm-start`` before
the study being run is opened (a refusal writes nothing); :func:`warm_start` then brings their
trials into it, before it proposes anything, and returns the measurements that only calibrate.

- Only a study of the same model, training setup and cluster hardware is used: its
  fingerprint's ``model``, ``train`` and cluster (devices, devices_per_node, device,
  device_memory_gb; not the backend or the replay table) must equal this study's. Anything
  else is refused (SpecError naming the study and what differs): another model's step times
  say nothing about this one, not even through a common correction factor. A study named
  twice, the study itself, or one without a fingerprint is refused too.
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
from autotune.spec.candidate import Candidate
from autotune.spec.errors import SpecError
from autotune.spec.objectives import objective_values
from autotune.storage.opening import open_storage
from autotune.storage.schema import knobs_of, metrics_of, outcome_of, settle
from autotune.study.opening import fingerprint
from autotune.study.retry import remembered_after_restart

SAME_CLUSTER = ("devices", "devices_per_node", "device", "device_memory_gb")


def _same_world(mine: dict, theirs: dict) -> list[str]:
    """What differs between two fingerprints in model, train and cluster hardware."""
    differs = [part for part in ("model", "train") if mine[part] != theirs.get(part)]
    cluster = theirs.get("cluster", {})
    differs += [f"cluster.{k}" for k in SAME_CLUSTER if mine["cluster"][k] != cluster.get(k)]
    return differs


def earlier_studies(spec, space, study_name: str, names, storage) -> list:
    """The studies ``names`` (in ``storage``: a URL or an Optuna storage object), checked
    before anything is written (see the module doc)."""
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
            raise SpecError(f"--warm-start {name}: it has no fingerprint (created before "
                            "fingerprints), so nothing says it measured the same model")
        differs = _same_world(mine, theirs)
        if differs:
            raise SpecError(f"--warm-start {name}: it measured another {', '.join(differs)}; "
                            "a warm start takes studies of the same model on the same cluster")
        studies.append(earlier)
    return studies


def warm_start(spec, space, study: optuna.Study, earlier: list) -> list:
    """Bring the measurements of the ``earlier`` studies into ``study`` (see the module doc);
    returns those that only calibrate."""
    done = {t.user_attrs["warm_start"] for t in study.get_trials(deepcopy=False)
            if "warm_start" in t.user_attrs}
    distributions, baseline = space.distributions(), space.baseline()
    calibration_only, copies = [], []
    for source in earlier:
        name = source.study_name
        for t in source.get_trials(deepcopy=False):
            outcome = outcome_of(t)
            if not remembered_after_restart(t) or outcome == "infeasible":
                continue
            candidate, metrics = Candidate(**knobs_of(t)), metrics_of(t)
            scored = objective_values(spec.search.objectives, metrics) is not None
            if not space.contains(candidate) or outcome == "ok" and not scored:
                if outcome == "ok":
                    calibration_only.append((costmodel.estimate(spec, candidate),
                                             metrics.get("peak_memory_mb"),
                                             metrics.get("step_time_ms")))
                continue
            tag = f"{name}#{t.number}"
            if tag in done:
                continue
            extra = {"warm_start": tag, **space.attrs_of(candidate)}
            if candidate == baseline:
                extra["baseline"] = True
            state, values, attrs = settle(spec.search.objectives, outcome, metrics,
                                          t.user_attrs.get("detail", ""), extra)
            params = space.params_of(candidate)
            copies.append(optuna.trial.create_trial(
                state=state, values=values, params=params, user_attrs=attrs,
                distributions={k: distributions[k] for k in params}))
    study.add_trials(copies)
    return calibration_only
