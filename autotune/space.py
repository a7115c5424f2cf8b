"""Search space: knob domains parsed from YAML, :class:`Candidate`, sampling and hard constraints.

Contract:
- :func:`build_space` turns a search-space mapping into a :class:`SearchSpace` for one spec,
  filtering out values the backend cannot execute (one note line per knob) and raising
  :class:`SpecError` for unknown knobs, empty or inverted ranges, or no feasible candidate.
- :meth:`SearchSpace.sample` draws a :class:`Candidate` through an Optuna trial's ``suggest_*``
  calls (searched knobs become params named after the knob); fixed and derived knobs are returned
  in ``fixed`` for the caller to record.
- :func:`violations` lists the hard constraints a candidate breaks (empty = structurally valid).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from autotune.knobs import JIT_LEVELS, KNOB_NAMES, KNOBS, RECOMPUTE_MODES
from autotune.spec import Spec, SpecError


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: a value for every knob."""

    dp: int
    tp: int
    pp: int
    micro_batches: int
    fusion_mb: int
    grad_accum: int
    loss_scale: int
    warmup_steps: int
    jit_level: str
    recompute: str

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    def as_dict(self) -> dict:
        return asdict(self)


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
    allowed = {"jit_level": JIT_LEVELS, "recompute": RECOMPUTE_MODES}.get(name)
    for value in values:
        if knob.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise SpecError(f"{where}: values must be integers, got {value!r}")
        if knob.kind is str and (not isinstance(value, str) or value not in allowed):
            raise SpecError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
        if knob.kind is int and value < (0 if name == "warmup_steps" else 1):
            raise SpecError(f"{where}: {value} is out of range")
    if name == "loss_scale" and any(v & (v - 1) for v in values):
        raise SpecError(f"{where}: loss scales must be powers of two")
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: repeated values")
    return values


def _range_values(raw: dict, where: str) -> tuple:
    if set(raw) == {"pow2"}:
        bounds = raw["pow2"]
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(type(b) is int for b in bounds)):
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


def is_active(name: str, pp: int) -> bool:
    """micro_batches only acts with pipeline stages, grad_accum only without."""
    return not (name == "micro_batches" and pp == 1) and not (name == "grad_accum" and pp > 1)


@dataclass(frozen=True)
class SearchSpace:
    """Per-knob allowed values after backend filtering. ``domains[name]`` is a tuple."""

    domains: dict
    devices: int
    notes: tuple[str, ...] = ()

    def searched(self) -> list[str]:
        """Knobs with more than one value (these become Optuna params)."""
        return [n for n in KNOB_NAMES if len(self.domains[n]) > 1]

    def _resolve(self, values: dict) -> Candidate:
        values = dict(values)
        if values["dp"] == "auto":
            values["dp"] = max(1, self.devices // (values["tp"] * values["pp"]))
        # micro_batches only means something with pipeline stages, grad_accum only without.
        if values["pp"] == 1:
            values["micro_batches"] = 1
        else:
            values["grad_accum"] = 1
        return Candidate(**values)

    def sample(self, trial) -> tuple[Candidate, dict]:
        """Draw a candidate through ``trial.suggest_categorical``. Returns (candidate, fixed),
        where ``fixed`` holds the knobs that were not sampled for this trial."""
        values, sampled = {}, set()
        for name in KNOB_NAMES:
            domain = self.domains[name]
            if len(domain) > 1 and is_active(name, values.get("pp", 1)):  # pp comes before both
                values[name] = trial.suggest_categorical(name, list(domain))
                sampled.add(name)
            else:
                values[name] = domain[0]
        candidate = self._resolve(values)
        fixed = {k: v for k, v in candidate.as_dict().items() if k not in sampled}
        return candidate, fixed

    def params_of(self, candidate: Candidate) -> dict:
        """The Optuna params a trial sampling ``candidate`` suggests (searched, active knobs)."""
        return {name: getattr(candidate, name) for name in self.searched()
                if is_active(name, candidate.pp)}

    def baseline(self) -> Candidate:
        """The untuned configuration: each knob's default, or the nearest value the space
        allows (trial 0 of a new study, so the gain of tuning is measured)."""
        values = {}
        for name in KNOB_NAMES:
            domain, default = self.domains[name], KNOBS[name].default
            if default in domain or not all(isinstance(v, int) for v in domain):
                values[name] = default if default in domain else domain[0]
            else:
                values[name] = min(domain, key=lambda v: (abs(v - default), v))
        return self._resolve(values)

    def first_candidate(self) -> Candidate:
        """Every knob at the first value of its domain (what ``estimate`` shows by default)."""
        return self._resolve({n: self.domains[n][0] for n in KNOB_NAMES})

    def candidates(self):
        """Every distinct candidate of the space (conditional knobs collapsed)."""
        seen = set()
        for combo in itertools.product(*(self.domains[n] for n in KNOB_NAMES)):
            candidate = self._resolve(dict(zip(KNOB_NAMES, combo)))
            if candidate not in seen:
                seen.add(candidate)
                yield candidate


def violations(spec: Spec, c: Candidate) -> list[str]:
    """The hard constraints of DESIGN.md that ``c`` breaks, as readable reasons."""
    reasons = []
    m, batch = spec.model, spec.train.global_batch_size
    if c.devices != spec.cluster.devices:
        reasons.append(f"dp·tp·pp = {c.devices} ≠ cluster.devices = {spec.cluster.devices}")
    if c.tp > 1 and m.num_heads is not None and m.num_heads % c.tp:
        reasons.append(f"tp = {c.tp} does not divide num_heads = {m.num_heads}")
    if c.tp > 1 and m.hidden_size is not None and m.hidden_size % c.tp:
        reasons.append(f"tp = {c.tp} does not divide hidden_size = {m.hidden_size}")
    if c.pp > 1 and m.num_layers is not None and m.num_layers % c.pp:
        reasons.append(f"pp = {c.pp} does not divide num_layers = {m.num_layers}")
    if c.pp == 1 and batch % (c.dp * c.grad_accum):
        reasons.append(f"global_batch_size = {batch} is not divisible by dp·grad_accum = "
                       f"{c.dp * c.grad_accum}")
    if c.pp > 1 and batch % (c.dp * c.micro_batches):
        reasons.append(f"global_batch_size = {batch} is not divisible by dp·micro_batches = "
                       f"{c.dp * c.micro_batches}")
    if c.pp > 1 and c.micro_batches < c.pp:
        reasons.append(f"micro_batches = {c.micro_batches} < pp = {c.pp}")
    return reasons


def build_space(spec: Spec, overrides: dict | None = None) -> SearchSpace:
    """Validate ``spec.search.space`` (plus ``overrides``: knob → raw domain, e.g. from --set)
    and filter it for the backend. Knobs the file leaves out take the default space's values."""
    from autotune.spec import DEFAULT_SPACE, load_yaml

    source = spec.search.space_source
    raw = dict(spec.search.space)
    for name in raw:
        if name not in KNOBS:
            raise SpecError(f"{source}: {name}: unknown knob (known: {', '.join(KNOB_NAMES)})")
    for name in overrides or {}:
        if name not in KNOBS:
            raise SpecError(f"--set {name}: unknown knob (known: {', '.join(KNOB_NAMES)})")
    defaults = load_yaml(DEFAULT_SPACE)
    raw = {**defaults, **raw, **(overrides or {})}
    backend, notes, domains = spec.cluster.backend, [], {}
    for name in KNOB_NAMES:
        values = parse_domain(name, raw[name], source)
        kept = tuple(v for v in values if v == "auto" or KNOBS[name].supports(backend, v))
        dropped = [v for v in values if v not in kept]
        if not kept:
            raise SpecError(f"{source}: {name}: no value of {list(values)} runs on backend "
                            f"{backend!r}: {KNOBS[name].unsupported_because}")
        if dropped:
            notes.append(f"{name}: {', '.join(map(str, dropped))} removed on {backend}: "
                         f"{KNOBS[name].unsupported_because}")
        if backend == "simulate" and not KNOBS[name].estimable and len(kept) > 1:
            kept = (KNOBS[name].default if KNOBS[name].default in kept else kept[0],)
            notes.append(f"{name}: fixed to {kept[0]} on simulate: the cost model cannot tell "
                         "its values apart")
        domains[name] = kept
    # micro_batches only acts with pipeline stages and grad_accum only without: collapse the
    # one that cannot act so the space (and a grid) has no duplicate candidates.
    if domains["pp"] == (1,):
        domains["micro_batches"] = (1,)
    if 1 not in domains["pp"]:
        domains["grad_accum"] = (1,)
    space = SearchSpace(domains, spec.cluster.devices, tuple(notes))
    _require_feasible(spec, space, source)
    return space


def _require_feasible(spec: Spec, space: SearchSpace, source: str) -> None:
    """Fail early when no combination of the structural knobs satisfies the constraints."""
    structural = ("dp", "tp", "pp", "micro_batches", "grad_accum")
    first_reasons = None
    for combo in itertools.product(*(space.domains[n] for n in structural)):
        values = {n: space.domains[n][0] for n in KNOB_NAMES} | dict(zip(structural, combo))
        reasons = violations(spec, space._resolve(values))
        if not reasons:
            return
        first_reasons = first_reasons or reasons
    raise SpecError(f"{source}: no feasible candidate in the space, e.g. {first_reasons[0]}")
