"""Where trials' time went: each trial's run split into its parts, fixed against measured.

Contract: a trial's *measured* time is ``steps_s`` (the steps its throughput is computed from);
its *fixed* time is the rest of its run (``run_s`` − ``steps_s``: launch, init, the first step
with its compile, the steps excluded from timing, the underflow probe, teardown —
`autotune.jobs.TIME_PARTS`). :func:`split` reads one trial's parts (None for a trial that did
not run, or ran before the split was stored); ``other_s`` is what the run holds beyond the
parts (the driver's launcher bookkeeping, the step loop's own work). :func:`device_time` sums
over trials, each weighted by its devices: device-seconds fixed and measured, and the median
trial's fixed ÷ measured ratio. Trials that ran but stored no split (a pruned or failed run)
count wholly as fixed: they measured nothing the study keeps.
"""

from __future__ import annotations

import statistics

from autotune.jobs import TIME_PARTS

LABELS = {
    "launch_s": "launch",
    "init_s": "init",
    "first_step_s": "first step",
    "excluded_steps_s": "excluded steps",
    "steps_s": "measured steps",
    "probe_s": "probe",
    "teardown_s": "teardown",
    "other_s": "other",
}


def split(attrs: dict) -> dict | None:
    """``{part: seconds}`` of a trial's user attrs (:data:`TIME_PARTS` and ``other_s``) with
    ``run_s``, ``fixed_s`` and ``measured_s``; None without a stored run split."""
    run_s, steps_s = attrs.get("run_s"), attrs.get("steps_s")
    if run_s is None or steps_s is None:
        return None
    parts = {name: float(attrs.get(name) or 0.0) for name in TIME_PARTS}
    parts["other_s"] = max(0.0, float(run_s) - sum(parts.values()))
    return {
        **parts,
        "run_s": float(run_s),
        "fixed_s": float(run_s) - float(steps_s),
        "measured_s": float(steps_s),
    }


def device_time(trials) -> dict:
    """Over ``trials`` (frozen, each with its knobs' ``devices``): ``fixed_s`` and
    ``measured_s`` device-seconds, ``trials`` with a split, and ``median_ratio``, the median
    of fixed ÷ measured over them (None without one)."""
    fixed = measured = 0.0
    ratios = []
    for trial, devices in trials:
        attrs = trial.user_attrs
        parts = split(attrs)
        if parts is None:
            fixed += float(attrs.get("run_s") or 0.0) * devices
            continue
        fixed += parts["fixed_s"] * devices
        measured += parts["measured_s"] * devices
        if parts["measured_s"] > 0:
            ratios.append(parts["fixed_s"] / parts["measured_s"])
    return {
        "fixed_s": fixed,
        "measured_s": measured,
        "trials": len(ratios),
        "median_ratio": statistics.median(ratios) if ratios else None,
    }


def line(parts: dict) -> str:
    """One trial's split as one line: each part in seconds, then fixed and measured."""
    shown = ", ".join(f"{LABELS[name]} {parts[name]:.2f} s" for name in (*TIME_PARTS, "other_s"))
    return (
        f"{shown}; fixed {parts['fixed_s']:.2f} s against {parts['measured_s']:.2f} s "
        f"measured ({parts['fixed_s'] / parts['measured_s']:.2g}×)"
        if parts["measured_s"]
        else shown
    )
