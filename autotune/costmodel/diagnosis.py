"""Why a trial is as fast as it is: its step time split into parts, the measured facts beside
them, and the one-line verdict a person would write ("bubble 31%: more micro-batches or fewer
stages").

Contract:

- :func:`diagnose` is pure. From the cost model's time breakdown of the candidate
  (``estimate["breakdown"]["time_s"]``, `autotune/costmodel/step_time.py`), the trial's metrics
  (`autotune.jobs.METRICS`), its knobs and the device memory budget it returns a strict-JSON
  dict:

  - ``parts_ms``: each part of :data:`PARTS` in ms per step — the estimate's breakdown scaled by
    ``scale`` = measured ``step_time_ms`` ÷ the estimate's step time, so the parts add up to the
    measured step (the cost model says how the step splits, the measurement how long it is);
  - ``shares``: each part over the step; ``largest``: the largest part other than compute;
  - ``facts``: what was measured, not modelled — ``overflow_steps`` (each one a skipped
    update), ``backoff_steps``, ``overflow_rate``, ``underflow_share``, ``peak_memory_mb``,
    ``memory_budget_mb`` and ``memory_share`` (peak over budget) where known;
  - ``verdict``: one line — the measured alarms first (memory within the cost model's safety
    margin of the budget, a loss scale that keeps overflowing, gradients flushed to zero), then
    the largest non-compute part with its share and what would shrink it; a step that is mostly
    compute says so and still names the largest other part.

  It returns None when there is no breakdown or no measured step time to scale it by.
  :func:`fact_lines` words the facts for people.
- :func:`from_attrs` is the same from what storage holds: a trial's user attrs (metrics and
  ``estimate``), its knobs and its study's user attrs (``model_yaml``, for the budget). The
  search stores its result as the user attr ``diagnosis`` of each ``ok`` trial
  (`autotune.study.recorder`); :func:`of_trial` reads it back, computing it for trials recorded
  before it was stored.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache

from autotune.costmodel.moe_time import MOE_PARTS

# The parts of a step, in the cost model's names, with the words a person uses for them.
PARTS = {
    "compute": "compute",
    "recompute": "recompute",
    "tp_comm": "TP communication",
    "pp_comm": "pipeline transfers",
    "bubble": "bubble",
    "dp_comm": "exposed DP all-reduce",
    "optimizer": "optimizer",
    "host": "host overhead",
    "experts": "experts",
    "imbalance": "expert imbalance",
    "mla": "latent attention projections",
    "mtp": "MTP modules",
    "ep_comm": "expert all-to-all in a node",
    "ep_comm_inter": "expert all-to-all across nodes",
    "cp_comm": "context-parallel exchange (ring, Ulysses all-to-alls)",
}
# the parts a model or layout without experts, latent attention, MTP modules, ep or cp never has:
# a view leaves them out where they are zero
OPTIONAL_PARTS = MOE_PARTS
COMPUTE_BOUND = 0.8  # compute at least this share of the step: nothing else is worth chasing
OVERFLOW_ALARM = 0.05  # overflowed measured steps after the back-off (each skips an update)
UNDERFLOW_ALARM = 0.01  # gradient elements float16 flushes to zero at the settled scale
MEMORY_ALARM = 0.9  # the cost model's SAFETY_MARGIN: above it a candidate is screened out


def _advice(part: str, knobs: dict) -> str:
    """What would shrink ``part`` for a candidate with ``knobs``."""
    pipeline = knobs.get("pp", 1) > 1
    if part == "bubble":
        return "more micro-batches or fewer stages"
    if part == "dp_comm":
        small = knobs.get("fusion_mb")
        fusion = f"larger fusion buckets (fusion_mb {small})" if small else "larger fusion buckets"
        if pipeline:  # the trainer's pipeline reduces after the last micro-batch: nothing hides
            return "fewer data-parallel replicas (a pipeline cannot hide its all-reduce)"
        return f"{fusion}, gradient accumulation or fewer data-parallel replicas"
    if part == "tp_comm":
        return "smaller tp, or a tp group inside one node"
    if part == "pp_comm":
        return "fewer pipeline stages"
    if part == "recompute":
        if knobs.get("recompute", "none") == "none" and pipeline:
            return "fewer stages (each stage but the last runs its forward twice)"
        return "recompute less (selective or none) where memory allows"
    if part == "optimizer":
        return "shard the parameters over more devices (tp or pp)"
    if part == "ep_comm_inter":
        return "an expert-parallel group inside one node (smaller ep)"
    if part in ("ep_comm", "imbalance"):
        return "smaller ep"
    if part == "cp_comm":
        return "smaller cp, a cp group inside one node, or another ulysses share of it"
    if part == "host":
        if knobs.get("jit_level") == "pynative":
            return "graph mode (jit_level O1) instead of PyNative"
        return "fewer, larger micro-steps per update"
    return "a faster device"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def diagnose(
    breakdown: dict | None,
    metrics: dict,
    knobs: dict | None = None,
    memory_budget_gb: float | None = None,
) -> dict | None:
    """The diagnosis of one trial (see the module doc); None without breakdown or step time."""
    knobs = knobs or {}
    times = {part: _number((breakdown or {}).get(part)) or 0.0 for part in PARTS}
    estimated = sum(times.values())
    measured = _number(metrics.get("step_time_ms"))
    if not estimated or not measured:
        return None
    scale = measured / (estimated * 1000)
    parts_ms = {part: seconds * 1000 * scale for part, seconds in times.items()}
    shares = {part: ms / measured for part, ms in parts_ms.items()}
    largest = max((p for p in PARTS if p != "compute"), key=lambda p: shares[p])

    facts = {
        name: metrics[name]
        for name in (
            "overflow_steps",
            "backoff_steps",
            "overflow_rate",
            "underflow_share",
            "peak_memory_mb",
        )
        if _number(metrics.get(name)) is not None
    }
    if memory_budget_gb and "peak_memory_mb" in facts:
        facts["memory_budget_mb"] = memory_budget_gb * 1024
        facts["memory_share"] = facts["peak_memory_mb"] / facts["memory_budget_mb"]

    alarms = []
    if facts.get("memory_share", 0) > MEMORY_ALARM:
        alarms.append(
            f"peak memory {facts['memory_share']:.0%} of the budget: no headroom "
            "(more tp/pp or recompute)"
        )
    if facts.get("overflow_rate", 0) > OVERFLOW_ALARM:
        alarms.append(
            f"loss scale overflows {facts['overflow_rate']:.0%} of steps after its "
            "back-off: a lower initial loss scale"
        )
    if facts.get("underflow_share", 0) > UNDERFLOW_ALARM:
        alarms.append(
            f"{facts['underflow_share']:.1%} of gradients underflow in float16: a higher loss scale"
        )
    named = f"{PARTS[largest]} {shares[largest]:.0%}: {_advice(largest, knobs)}"
    if shares["compute"] >= COMPUTE_BOUND:
        named = f"compute-bound (compute {shares['compute']:.0%}); largest other part: {named}"
    return {
        "step_time_ms": measured,
        "scale": scale,
        "parts_ms": parts_ms,
        "shares": shares,
        "largest": largest,
        "facts": facts,
        "verdict": "; ".join(alarms + [named]),
    }


def fact_lines(facts: dict) -> list[str]:
    """The measured facts of a diagnosis, as sentences."""
    lines = []
    if "overflow_steps" in facts:
        lines.append(
            f"overflowed steps (updates skipped): {facts['overflow_steps']:g}"
            + (
                f", {facts['backoff_steps']:g} of them the scaler's initial back-off"
                if "backoff_steps" in facts
                else ""
            )
            + (
                f"; overflow rate after it {facts['overflow_rate']:.1%}"
                if "overflow_rate" in facts
                else ""
            )
        )
    if "underflow_share" in facts:
        lines.append(f"gradients flushed to zero in float16: {facts['underflow_share']:.2%}")
    if "peak_memory_mb" in facts:
        budget = (
            f" of {facts['memory_budget_mb']:.0f} MB budget ({facts['memory_share']:.0%})"
            if "memory_budget_mb" in facts
            else ""
        )
        lines.append(f"peak memory per device: {facts['peak_memory_mb']:.0f} MB{budget}")
    return lines


@lru_cache(maxsize=32)
def _budget_gb(model_yaml: str, model_yaml_path: str) -> float | None:
    """Device memory of a study's cluster (GiB), from the model.yaml (as JSON) it stored."""
    from pathlib import Path

    from autotune.costmodel import resolve_profile
    from autotune.spec.model_yaml import parse_spec

    try:
        spec = parse_spec(json.loads(model_yaml), Path(model_yaml_path), stored=True)
    except (ValueError, OSError):  # SpecError too: a study written by an older autotune
        return None
    return resolve_profile(spec.cluster).memory_gb


def memory_budget_gb(study_attrs: dict) -> float | None:
    """The memory budget of one device of a study (None when its model.yaml is not stored)."""
    if "model_yaml" not in study_attrs:
        return None
    # the text is the cache key: a record per trial must not parse the file each time
    return _budget_gb(
        json.dumps(study_attrs["model_yaml"], sort_keys=True),
        study_attrs.get("model_yaml_path", "."),
    )


def from_attrs(attrs: dict, knobs: dict, study_attrs: dict) -> dict | None:
    """:func:`diagnose` from a trial's stored user attrs (metrics and ``estimate``)."""
    estimate = attrs.get("estimate") or {}
    breakdown = (estimate.get("breakdown") or {}).get("time_s")
    if not breakdown:
        return None
    return diagnose(breakdown, attrs, knobs, memory_budget_gb(study_attrs))


def of_trial(frozen, knobs: dict, study_attrs: dict) -> dict | None:
    """The stored diagnosis of an ``ok`` trial, or one computed now for a trial recorded before
    diagnoses were stored (or None: not ok, or no estimate)."""
    if frozen.user_attrs.get("outcome") != "ok":
        return None
    found = frozen.user_attrs.get("diagnosis")
    if not found:
        return from_attrs(frozen.user_attrs, knobs, study_attrs)
    # stored before a part was known: it had none of it
    return found | {
        key: {part: found[key].get(part, 0.0) for part in PARTS} for key in ("parts_ms", "shares")
    }
