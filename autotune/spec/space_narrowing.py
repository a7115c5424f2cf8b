"""Knob values a study could not tell apart, narrowed before the space is searched.

Contract:
- :func:`fix_expert_and_context` keeps ep only on a model with experts and the values dividing
  them, cp only with flash attention and, in the default space, where a device keeps at least
  :data:`MIN_CP_TOKENS` tokens of a sequence, and ulysses only at values dividing a cp value
  left above 1; the baseline's values always stay. It narrows
  ``domains`` in place and returns a note for each knob whose space the user stated.
- :func:`merge_warmups` keeps one warmup of each group a trial compresses to the same warmup
  (`autotune.spec.knobs.trial_warmup`), the baseline's when the group holds it, so the baseline
  stays a candidate; it narrows ``domains`` in place and returns the note naming what merged.
- Both are steps of `autotune.spec.space.build_space`, which says when each applies.
"""

from __future__ import annotations

from autotune.spec.knobs import KNOBS, trial_warmup
from autotune.spec.specs import Spec

# The default space searches cp only where a device keeps at least this many tokens of a
# sequence: context parallelism is MindFormers' answer to long sequences (its 32K and 128K
# configs set it; its 4K and 8K ones keep 1). A space that lists cp itself is taken as it is.
MIN_CP_TOKENS = 4096


def fix_expert_and_context(spec: Spec, domains: dict) -> list[str]:
    """ep only on a model with experts and dividing them, cp only with flash attention and,
    in the default space, on long sequences (:data:`MIN_CP_TOKENS`), ulysses only dividing a
    cp left; the baseline's values stay. Returns the notes: one per knob whose space is not the default one (the default
    space's ep and cp go quietly where a model has no use for them)."""
    m, notes = spec.model, []
    keep = {name: spec.baseline.get(name) for name in ("ep", "cp", "ulysses")}
    stated = {
        name
        for name in ("ep", "cp", "ulysses")
        if spec.search.space.get(name, KNOBS[name].default_space) != KNOBS[name].default_space
    }

    def restrict(name: str, allowed, why: str) -> None:
        kept = tuple(v for v in domains[name] if allowed(v) or v == keep[name])
        dropped = [v for v in domains[name] if v not in kept]
        if dropped and kept:
            domains[name] = kept
            if name in stated:
                notes.append(f"{name}: {', '.join(map(str, dropped))} removed: {why}")

    experts = m.num_experts or 0
    if experts < 2:
        restrict("ep", lambda v: v == 1, "the model has no experts")
    else:
        restrict("ep", lambda v: experts % v == 0, f"they do not divide its {experts} experts")
    if not m.flash_attention:
        restrict("cp", lambda v: v == 1, "context parallelism needs model.flash_attention")
    elif "cp" not in stated and m.seq_length:
        restrict(
            "cp",
            lambda v: v == 1 or m.seq_length // v >= MIN_CP_TOKENS,
            f"a {m.seq_length}-token sequence split that far leaves a device under "
            f"{MIN_CP_TOKENS} tokens (list other cp values in search.space to search them)",
        )
    split = [v for v in domains["cp"] if v > 1]  # Ulysses groups are carved out of cp
    restrict(
        "ulysses",
        lambda v: v == 1 or any(cp % v == 0 for cp in split),
        f"no cp value it divides (cp: {', '.join(map(str, domains['cp']))})",
    )
    return notes


def merge_warmups(spec: Spec, domains: dict) -> list[str]:
    """Keep one warmup of each group a trial cannot tell apart (the same compressed warmup,
    `autotune.spec.knobs.trial_warmup`): the value nearest the full-run warmup that group's
    trial schedule stands for (ties: the smaller), or the baseline's warmup when the group holds
    it, so the baseline stays a candidate. Returns the note naming the merged values."""
    total, steps = spec.train.total_steps, spec.trial.steps
    baseline = spec.baseline.get("warmup_steps")
    groups: dict = {}
    for value in domains["warmup_steps"]:
        groups.setdefault(trial_warmup(value, total, steps), []).append(value)
    kept, merged = [], []
    for compressed, values in groups.items():
        stands_for = compressed * total / steps
        keep = (
            baseline if baseline in values else min(values, key=lambda v: (abs(v - stands_for), v))
        )
        kept.append(keep)
        if len(values) > 1:
            merged.append(f"{', '.join(str(v) for v in values if v != keep)} → {keep}")
    if not merged:
        return []
    domains["warmup_steps"] = tuple(kept)
    return [
        f"warmup_steps: {'; '.join(merged)}: a {steps}-step trial of the {total}-step "
        "schedule compresses them to the same warmup, so they would run alike"
    ]
