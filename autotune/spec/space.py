"""Search space: knob domains parsed from YAML, and sampling a candidate from them.

Contract:
- :func:`build_space` turns a search-space mapping into a :class:`SearchSpace` for one spec,
  filtering out values the backend cannot execute (one note line per knob) and those the trial
  program does not run (`autotune.spec.programs.TrialProgram.space_limits`, its note), raising
  :class:`SpecError` for unknown knobs, empty or inverted ranges, or no feasible candidate.
- :meth:`SearchSpace.sample` draws a :class:`Candidate` through an Optuna trial's ``suggest_*``
  calls (each searched knob through its param, `autotune.spec.encoding`); the knobs a trial keeps as
  user attrs are returned beside it for the caller to record, so every trial holds each knob's
  value under the knob's own name (`autotune.storage.schema.knobs_of`).
- The space of a study holds only candidates that may meet the hard constraints
  (`autotune.spec.constraints`): values no feasible layout uses are dropped with a note.
- A model.yaml ``baseline:`` (the user's own configuration) is the space's
  :meth:`SearchSpace.baseline`: where a knob is fixed for the backend or the dtype, the
  baseline's value is the one kept, and a baseline the space does not hold, or one that breaks a
  hard constraint, is a SpecError naming ``baseline.<knob>``; a knob an override (``--set``)
  fixes takes the override's value instead.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

from autotune.spec.backends import backend_of
from autotune.spec.candidate import Candidate
from autotune.spec.constraints import violations
from autotune.spec.encoding import ORDERED, param_for
from autotune.spec.errors import SpecError
from autotune.spec.knobs import KNOB_NAMES, KNOBS, LOSS_SCALED_DTYPES, is_active
from autotune.spec.model_yaml import DEFAULT_SPACE
from autotune.spec.programs import program_of
from autotune.spec.space_narrowing import fix_expert_and_context, merge_warmups
from autotune.spec.specs import Spec
from autotune.spec.yaml_file import load_yaml


def parse_domain(name: str, raw, source: str) -> tuple:
    """A knob's YAML domain → the ordered tuple of values it may take (``("auto",)`` for dp)."""
    where = f"{source}: {name}"
    knob = KNOBS[name]
    if raw == "auto" and name == "dp":
        return ("auto",)
    if isinstance(raw, list):
        values = tuple(raw)
    elif isinstance(raw, dict):
        values = _range_values(raw, where)
    else:
        values = (raw,)
    if not values:
        raise SpecError(f"{where}: empty domain")
    allowed = knob.choices
    for value in values:
        if knob.kind is bool:
            if not isinstance(value, bool):
                raise SpecError(f"{where}: values must be true or false, got {value!r}")
            continue
        if knob.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise SpecError(f"{where}: values must be integers, got {value!r}")
        if knob.kind is str and (not isinstance(value, str) or value not in allowed):
            raise SpecError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
        if knob.kind is int and value < knob.minimum:
            raise SpecError(f"{where}: {value} is out of range")
    if knob.pow2 and any(v & (v - 1) for v in values):
        raise SpecError(f"{where}: values must be powers of two")
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: repeated values")
    return values


def _range_values(raw: dict, where: str) -> tuple:
    if set(raw) == {"pow2"}:
        bounds = raw["pow2"]
        if not (
            isinstance(bounds, list) and len(bounds) == 2 and all(type(b) is int for b in bounds)
        ):
            raise SpecError(f"{where}: pow2 takes [low_exponent, high_exponent]")
        if bounds[0] > bounds[1] or bounds[0] < 0:
            raise SpecError(f"{where}: pow2 range {bounds} is empty or inverted")
        return tuple(2**e for e in range(bounds[0], bounds[1] + 1))
    unknown = set(raw) - {"low", "high", "step", "log"}
    if unknown or not {"low", "high"} <= set(raw):
        raise SpecError(f"{where}: a range is {{low, high[, step | log]}} or {{pow2: [a, b]}}")
    low, high, step, log = raw["low"], raw["high"], raw.get("step", 1), raw.get("log", False)
    if not all(type(v) is int for v in (low, high, step)) or not isinstance(log, bool):
        raise SpecError(f"{where}: low, high and step must be integers, log true or false")
    if low > high or step < 1:
        raise SpecError(f"{where}: range [{low}, {high}] step {step} is empty or inverted")
    if log:
        if "step" in raw:
            raise SpecError(f"{where}: give step or log, not both")
        values = tuple(2**e for e in range(0, high.bit_length()) if low <= 2**e <= high)
        if not values:
            raise SpecError(f"{where}: no power of two in [{low}, {high}]")
        return values
    return tuple(range(low, high + 1, step))


@dataclass(frozen=True)
class SearchSpace:
    """Per-knob allowed values after backend filtering. ``domains[name]`` is a tuple."""

    domains: dict
    devices: int
    notes: tuple[str, ...] = ()
    encoding: str = ORDERED  # how knobs become Optuna params (`autotune.spec.encoding`)
    preset: tuple = ()  # (knob, value) pairs of model.yaml's baseline

    def searched(self) -> list[str]:
        """Knobs with more than one value (these become Optuna params)."""
        return [n for n in KNOB_NAMES if len(self.domains[n]) > 1]

    def _resolve(self, values: dict) -> Candidate:
        values = dict(values)
        if values["dp"] == "auto":
            values["dp"] = self._dp(values)
        for name in KNOB_NAMES:
            if not is_active(name, values["dp"], values["pp"], values["cp"]):
                values[name] = KNOBS[name].default
        return Candidate(**values)

    def _dp(self, values: dict) -> int:
        """dp of a candidate whose dp, tp, pp and cp are drawn (``auto``: the devices left)."""
        if values["dp"] == "auto":
            split = values["tp"] * values["pp"] * values.get("cp", 1)
            return max(1, self.devices // split)
        return values["dp"]

    @cached_property
    def params(self) -> dict:
        """knob → its :class:`~autotune.spec.encoding.Param`, for every searched knob."""
        return {
            name: param_for(name, self.domains[name], self.encoding) for name in self.searched()
        }

    def sample(self, trial) -> tuple[Candidate, dict]:
        """Draw a candidate through ``trial`` (each active searched knob through its param).
        Returns (candidate, attrs): ``attrs`` holds every knob whose value is not a param named
        after it (not sampled for this trial, or sampled as an exponent or index), for the
        caller to store as user attrs."""
        values, own = {}, set()
        # the layout's knobs (auto dp reads cp) come before every knob that depends on them
        first = ("dp", "tp", "pp", "cp")
        for name in (*first, *(n for n in KNOB_NAMES if n not in first)):
            domain = self.domains[name]
            active = name in first or is_active(name, self._dp(values), values["pp"], values["cp"])
            if len(domain) > 1 and active:
                values[name] = self.params[name].suggest(trial)
                if self.params[name].holds_value:
                    own.add(name)
            else:
                values[name] = domain[0]
        candidate = self._resolve(values)
        return candidate, {k: v for k, v in candidate.as_dict().items() if k not in own}

    def params_of(self, candidate: Candidate) -> dict:
        """The Optuna params a trial sampling ``candidate`` suggests (searched, active knobs)."""
        return {
            param.name: param.encode(getattr(candidate, name))
            for name, param in self.params.items()
            if is_active(name, candidate.dp, candidate.pp, candidate.cp)
        }

    def attrs_of(self, candidate: Candidate) -> dict:
        """The knobs of ``candidate`` its trial stores as user attrs (see :meth:`sample`)."""
        own = {
            name
            for name, param in self.params.items()
            if param.holds_value and is_active(name, candidate.dp, candidate.pp, candidate.cp)
        }
        return {k: v for k, v in candidate.as_dict().items() if k not in own}

    def distributions(self) -> dict:
        """Each searched knob's Optuna distribution, by param name."""
        return {param.name: param.distribution for param in self.params.values()}

    def contains(self, candidate: Candidate) -> bool:
        """Whether a trial of this space could have run ``candidate``."""
        values, auto = candidate.as_dict(), self.domains["dp"] == ("auto",)
        for name in KNOB_NAMES:
            if not (
                name == "dp"
                and auto
                or not is_active(name, candidate.dp, candidate.pp, candidate.cp)
                or values[name] in self.domains[name]
            ):
                return False
        return self._resolve(values | ({"dp": "auto"} if auto else {})) == candidate

    def baseline(self) -> Candidate:
        """The configuration trial 0 of a new study runs, so the gain of tuning is measured:
        model.yaml's ``baseline`` where it gives a knob, else the knob's default, or the
        nearest value the space allows."""
        values, preset = {}, dict(self.preset)
        for name in KNOB_NAMES:
            domain, default = self.domains[name], preset.get(name, KNOBS[name].default)
            if default in domain or not all(isinstance(v, int) for v in domain):
                values[name] = default if default in domain else domain[0]
            else:
                values[name] = min(domain, key=lambda v: (abs(v - default), v))
        return self._resolve(values)

    def layout_openers(self, spec: Spec) -> list[Candidate]:
        """One feasible candidate per (tp, pp) layout of the space other than the baseline's:
        the baseline with that layout, and the smallest micro-batch or accumulation count that
        makes it valid. A study runs them right after the baseline, so every layout is measured
        before the sampler takes over."""
        base = self.baseline()
        openers = []
        for tp, pp in itertools.product(self.domains["tp"], self.domains["pp"]):
            if (tp, pp) == (base.tp, base.pp):
                continue
            splits = "micro_batches" if pp > 1 else "grad_accum"
            options = sorted(self.domains[splits], key=lambda v: (v != getattr(base, splits), v))
            for value in options:
                values = base.as_dict() | {
                    "dp": self.domains["dp"][0],
                    "tp": tp,
                    "pp": pp,
                    splits: value,
                }
                if "auto" not in self.domains["dp"] and len(self.domains["dp"]) > 1:
                    values["dp"] = spec.cluster.devices // (tp * pp)
                candidate = self._resolve(values)
                if not violations(spec, candidate):
                    openers.append(candidate)
                    break
        return openers

    def candidates(self):
        """Every distinct candidate of the space (conditional knobs collapsed)."""
        seen = set()
        for combo in itertools.product(*(self.domains[n] for n in KNOB_NAMES)):
            candidate = self._resolve(dict(zip(KNOB_NAMES, combo)))
            if candidate not in seen:
                seen.add(candidate)
                yield candidate


def build_space(spec: Spec, overrides: dict | None = None) -> SearchSpace:
    """Validate ``spec.search.space`` (plus ``overrides``: knob → raw domain, e.g. from --set)
    and filter it for the backend. Knobs the file leaves out take the default space's values."""
    source = spec.search.space_source
    raw = dict(spec.search.space)
    for name in raw:
        if name not in KNOBS:
            raise SpecError(f"{source}: {name}: unknown knob (known: {', '.join(KNOB_NAMES)})")
    for name in overrides or {}:
        if name not in KNOBS:
            raise SpecError(f"--set {name}: unknown knob (known: {', '.join(KNOB_NAMES)})")
    # the default space file, and a knob it does not list (registered since) from its entry
    defaults = {name: knob.default_space for name, knob in KNOBS.items()} | load_yaml(DEFAULT_SPACE)
    raw = {**defaults, **raw, **(overrides or {})}
    backend, notes, domains = backend_of(spec.cluster.backend), [], {}
    limits, note = program_of(spec).space_limits(spec)  # known before running
    raw.update(limits)
    if note:
        notes.append(note)
    for name in KNOB_NAMES:
        values = parse_domain(name, raw[name], source)
        kept = tuple(v for v in values if v == "auto" or backend.executes(name, v))
        dropped = [v for v in values if v not in kept]
        if not kept:
            raise SpecError(
                f"{source}: {name}: no value of {list(values)} runs on backend "
                f"{backend.name!r}: {backend.why_not(name)}"
            )
        if dropped:
            notes.append(
                f"{name}: {', '.join(map(str, dropped))} removed on {backend.name}: "
                f"{backend.why_not(name)}"
            )
        if backend.kind == "estimate" and not KNOBS[name].estimable and len(kept) > 1:
            preferred = spec.baseline.get(name, KNOBS[name].default)
            kept = (preferred if preferred in kept else kept[0],)
            notes.append(
                f"{name}: fixed to {kept[0]} on {backend.name}: {KNOBS[name].unestimated_because}"
            )
        domains[name] = kept
    notes += _fix_for_model(spec, domains, source)
    if backend.runs_program:
        notes += merge_warmups(spec, domains)
    notes += _keep_feasible_layouts(spec, domains, source)
    # micro_batches only acts with pipeline stages and grad_accum only without: collapse the
    # one that cannot act so the space (and a grid) has no duplicate candidates.
    if domains["pp"] == (1,):
        domains["micro_batches"] = (1,)
    if 1 not in domains["pp"]:
        domains["grad_accum"] = (1,)
    space = SearchSpace(
        domains, spec.cluster.devices, tuple(notes), preset=tuple(spec.baseline.items())
    )
    _check_baseline(spec, space, set(overrides or ()))
    return space


def _check_baseline(spec: Spec, space: SearchSpace, overridden: set) -> None:
    """SpecError unless the space holds model.yaml's baseline and the baseline is valid. A knob
    ``--set`` fixes wins over the baseline's value (the baseline takes the value it fixed)."""
    if not spec.baseline:
        return
    base = space.baseline()
    where = f"{spec.source}: baseline"
    if overridden & {"tp", "pp", "cp"}:
        overridden.add("dp")  # dp follows the layout --set chose
    for name, value in spec.baseline.items():
        if name in overridden or not is_active(name, base.dp, base.pp, base.cp):
            continue
        held = space.domains[name]
        if name == "dp" and held == ("auto",):
            if value != base.dp:
                raise SpecError(f"{where}.dp: {value} is not devices / (tp·pp·cp) = {base.dp}")
        elif value not in held:
            raise SpecError(
                f"{where}.{name}: {value!r} is not in the search space "
                f"({', '.join(map(str, held))}); add it to search.space.{name}"
            )
    broken = violations(spec, base)
    if broken and not overridden:  # with --set the candidate is the user's to judge
        raise SpecError(f"{where}: {broken[0]}")


def _fix_for_model(spec: Spec, domains: dict, source: str) -> list[str]:
    """Fix the knobs the model gives nothing to choose (in ``domains``); returns the notes."""
    notes = fix_expert_and_context(spec, domains)
    if spec.model.entry is not None:
        for name in ("tp", "pp", "ep", "cp"):
            if domains[name] == (1,):
                continue
            if 1 not in domains[name]:
                raise SpecError(
                    f"{source}: {name}: a model.entry network runs with {name} = 1 "
                    "(see the user-model contract in autotune/train/models/entry.py)"
                )
            domains[name] = (1,)
            notes.append(
                f"{name}: fixed to 1: a model.entry network is not written for tensor "
                "or pipeline parallelism"
            )
    dtype = spec.model.dtype
    if dtype not in LOSS_SCALED_DTYPES and len(domains["loss_scale"]) > 1:
        default = spec.baseline.get("loss_scale", KNOBS["loss_scale"].default)
        domains["loss_scale"] = (
            default if default in domains["loss_scale"] else domains["loss_scale"][0],
        )
        notes.append(
            f"loss_scale: fixed to {domains['loss_scale'][0]}: {dtype} compute is not "
            "loss-scaled, so the value changes nothing"
        )
    return notes


def _keep_feasible_layouts(spec: Spec, domains: dict, source: str) -> list[str]:
    """Drop the tp and pp values that no feasible candidate uses (the sampler could only have them
    recorded infeasible); returns the notes. SpecError when no candidate is feasible at all."""
    structural = ("dp", "tp", "pp", "cp", "ep", "micro_batches", "grad_accum")
    space = SearchSpace(domains, spec.cluster.devices)
    used = {"tp": set(), "pp": set(), "cp": set(), "ep": set()}
    first_reasons = None
    for combo in itertools.product(*(domains[n] for n in structural)):
        values = {n: domains[n][0] for n in KNOB_NAMES} | dict(zip(structural, combo))
        candidate = space._resolve(values)
        reasons = violations(spec, candidate)
        if reasons:
            first_reasons = first_reasons or reasons
            continue
        for name in used:
            used[name].add(getattr(candidate, name))
    if not used["tp"]:
        if spec.baseline:  # the user's own layout: what breaks it says most
            preset = tuple(spec.baseline.items())
            base = SearchSpace(domains, spec.cluster.devices, preset=preset).baseline()
            first_reasons = violations(spec, base) or first_reasons
        raise SpecError(f"{source}: no feasible candidate in the space, e.g. {first_reasons[0]}")
    notes = []
    for name in used:  # the baseline's own values stay: its check names what breaks
        used[name].add(spec.baseline.get(name))
        dropped = [v for v in domains[name] if v not in used[name]]
        if dropped:
            domains[name] = tuple(v for v in domains[name] if v in used[name])
            notes.append(
                f"{name}: {', '.join(map(str, dropped))} removed: no feasible layout of "
                f"this model on {spec.cluster.devices} devices uses them"
            )
    return notes
