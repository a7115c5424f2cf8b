"""The truths `benchmarks/search_efficiency.py` searches: families of truth structures, each
seed's noise-free truth, and the replay table that measures it.

Contract (autotune is imported inside functions only: the benchmark's worker processes may
import another checkout's autotune, ``search_efficiency.py --pre26``):

- :data:`STRUCTURES` holds two disjoint splits of truth structures, ``tune`` (what the search's
  constants may be chosen on) and ``report`` (what the benchmark reports); each names its
  families (:meth:`Structures.families`) and where its seeds start. :func:`kind_of` sorts a
  family: ``mild``, ``time`` (structural, the memory model exact), ``memory`` (structural, the
  peak mispriced), ``engine`` (priced by MindSpore's engine, the prior by the trainer's) or
  ``layout`` (a whole-step effect of a layout's shape that no mechanism of the cost model
  prices: :data:`SHAPES`, built from a candidate's knobs alone, never from the search's belief).
- :class:`Setting` is one space as a replay study of it prices its candidates (its prior);
  :func:`truth_of` is a family's noise-free :class:`Truth` on it for one seed: every candidate
  of the space that breaks no constraint, over the memory cap or not (the table holds every
  candidate a study can run, none missing).
- :func:`write_table` writes a truth as a replay table of :data:`ROWS` measurements per
  candidate that fits, each its own draw of the run noise (a re-run takes the next row, so it
  draws again), and one ``oom`` row per candidate over the cap (every run of it ends so; no
  peak: a run that ran out measured none). :func:`real_truth` reads a measured table as a truth
  (a candidate's value: its mean over its rows).
- :func:`model_reach` and :func:`screen_reach`: how far trusting the prior gets on a truth.
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

NOISE_SIGMA = 0.03  # lognormal σ of one measured step time
ROWS = 15  # measurements per candidate: no study of ≤ 15 runs spends more on one candidate
TRIAL_STEPS, COMPILE_S = 50, 60.0  # a row's run_s (what orders trials that share a pool)
PERTURBED = (
    "achievable",
    "intra_node_gbps",
    "inter_node_gbps",
    "collective_latency_us",
    "hop_latency_us",
)
MILD = (0.8, 1.25)  # a mild truth's constants × U[MILD]
# mechanism → the parts of the estimated step it prices; "pipeline" only on pipelined candidates
MECHANISMS = {
    "tp": ("tp_comm",),
    "pipeline": ("compute", "recompute", "bubble", "pp_comm"),
    "dp": ("dp_comm",),
    "recompute": ("recompute",),
    "optimizer": ("optimizer",),
    "memory": (),
}
ENGINE_SHIFT = (0.05, 0.10)  # an engine-mismatch truth reshapes a few mechanisms by this much
ENGINE_FAMILIES = ("engine-mismatch", "engine-labelled")
TOP = 5
# Effects no mechanism of the cost model prices: each a goodput multiplier of a candidate's layout
# (dp, tp, pp, micro-batches per step) of a given size — "tp-gain(0.12)": every doubling of tp
# 12 % more goodput than priced — given the candidate, the size and the space (:class:`Room`).
# Whole-step factors, so no part of the estimate carries them.
SHAPES = {
    # tensor parallelism more (or less) efficient than priced, per doubling: its larger or
    # smaller GEMMs, the kernels a tp split selects
    "tp-gain": lambda c, size, room: (1 + size) ** math.log2(c.tp),
    "tp-loss": lambda c, size, room: (1 - size) ** math.log2(c.tp),
    # every pipelined layout slower (or faster) by the same share: scheduling, stage imbalance
    "pipeline-loss": lambda c, size, room: 1 - size if c.pp > 1 else 1.0,
    "pipeline-gain": lambda c, size, room: 1 + size if c.pp > 1 else 1.0,
    # small micro-batches run their kernels less efficiently: size less per halving of the
    # samples a micro-batch holds below the space's largest
    "micro-batch": lambda c, size, room: (1 - size) ** room.halvings(c),
    # every step waits for the slowest of its dp replicas: size less per doubling of dp
    "straggler": lambda c, size, room: (1 - size) ** math.log2(c.dp),
    # every layout its own luck (kernel choices, placement): lognormal, sd size, per seed
    "lottery": lambda c, size, room: room.luck(c, size),
}


@dataclass
class Room:
    """What a layout effect needs of its space and truth: the batch and the most samples a
    micro-batch holds in the space, and the lottery's draws (per layout, seed, family)."""

    batch: int
    largest: float
    seed: int
    family: str
    drawn: dict

    def halvings(self, c) -> float:
        return math.log2(self.largest / (self.batch / (c.dp * micro_count(c))))

    def luck(self, c, size: float) -> float:
        layout = layout_key(c)
        if layout not in self.drawn:
            rng = np.random.default_rng([self.seed, zlib.crc32(self.family.encode()), 2, *layout])
            self.drawn[layout] = float(np.exp(size * rng.standard_normal()))
        return self.drawn[layout]


def micro_count(c) -> int:
    """Micro-batches per optimizer step (pipeline micro-batches, else accumulation)."""
    return c.micro_batches if c.pp > 1 else c.grad_accum


def layout_key(c) -> tuple:
    """A candidate's layout: (dp, tp, pp, micro-batches per step)."""
    return c.dp, c.tp, c.pp, micro_count(c)


def shapes_of(family: str) -> dict:
    """``{effect: size}`` of a layout family's name (``tp-gain(0.12)+pipeline-loss(0.2)``)."""
    out = {}
    for term in family.split("+"):
        name, _, size = term.partition("(")
        out[name] = float(size.rstrip(")"))
    return out


@dataclass(frozen=True)
class Structures:
    """One split of truth structures: a single mechanism's part × each of ``factors``; two
    mechanisms × each ``pair_factors`` pair (``ordered``: every ordered pair of mechanisms, else
    every unordered one); an engine-mismatch truth reshaping the ``reshaped`` mechanisms; the
    layout effects of :data:`SHAPES` at the sizes ``shape_sizes`` gives, alone and in the
    combinations ``shape_pairs``; seeds from ``first_seed``."""

    name: str
    factors: tuple
    pair_factors: tuple
    ordered: bool
    reshaped: tuple
    first_seed: int
    shape_sizes: dict
    shape_pairs: tuple

    def families(self) -> list[str]:
        """Every family's name: mild, the engine mismatch (unlabelled, labelled), the single
        mechanisms, the pairs, the layout effects alone and combined."""
        single = [f"{m}×{f:g}" for m in MECHANISMS for f in self.factors]
        combine = itertools.permutations if self.ordered else itertools.combinations
        pairs = [
            f"{a}×{fa:g}+{b}×{fb:g}"
            for fa, fb in self.pair_factors
            for a, b in combine(MECHANISMS, 2)
        ]
        shape = [f"{e}({self.shape_sizes[e]:g})" for e in SHAPES]
        shape += [
            "+".join(f"{e}({self.shape_sizes[e]:g})" for e in pair) for pair in self.shape_pairs
        ]
        return ["mild", *ENGINE_FAMILIES, *single, *pairs, *shape]


STRUCTURES = {
    # one mechanism cheaper and another dearer (every ordered pair); seeds 0, 1, …
    "report": Structures(
        "report",
        (0.6, 1.6),
        ((0.6, 1.6),),
        True,
        ("tp", "pipeline", "dp"),
        0,
        {
            "tp-gain": 0.2,
            "tp-loss": 0.15,
            "pipeline-loss": 0.2,
            "pipeline-gain": 0.2,
            "micro-batch": 0.08,
            "straggler": 0.05,
            "lottery": 0.12,
        },
        (
            ("tp-gain", "pipeline-loss"),
            ("tp-loss", "pipeline-gain"),
            ("micro-batch", "lottery"),
            ("straggler", "tp-gain"),
        ),
    ),
    # two mechanisms both cheaper or both dearer (every unordered pair); seeds 100, 101, …
    "tune": Structures(
        "tune",
        (0.7, 1.4),
        ((0.7, 0.7), (1.4, 1.4)),
        False,
        ("recompute", "optimizer", "tp"),
        100,
        {
            "tp-gain": 0.15,
            "tp-loss": 0.12,
            "pipeline-loss": 0.25,
            "pipeline-gain": 0.15,
            "micro-batch": 0.06,
            "straggler": 0.04,
            "lottery": 0.1,
        },
        (
            ("tp-gain", "micro-batch"),
            ("pipeline-loss", "lottery"),
            ("tp-loss", "straggler"),
            ("pipeline-gain", "lottery"),
        ),
    ),
}


def factors_of(family: str) -> dict:
    """``{mechanism: factor}`` of a structural family's name."""
    out = {}
    for term in family.split("+"):
        name, factor = term.split("×")
        out[name] = float(factor)
    return out


def kind_of(family: str) -> str:
    """``mild``, ``engine``, ``layout`` (whole-step effects of a layout's shape), ``memory`` (the
    peak mispriced) or ``time`` (the peak exact)."""
    if family in ("mild", *ENGINE_FAMILIES):
        return family.split("-")[0]
    if "(" in family:
        return "layout"
    return "memory" if "memory" in factors_of(family) else "time"


def key_of(candidate) -> tuple:
    """A candidate's key in a truth of the benchmark's spaces: its value of every knob."""
    from autotune.spec.knobs import KNOB_NAMES

    return tuple(getattr(candidate, name) for name in KNOB_NAMES)


def _stream(family: str, seed: int, purpose: int) -> np.random.Generator:
    """The random numbers of one family, seed and purpose (0: the truth, 1: the noise); the
    engine-mismatch families share theirs (the same truth and draws, labelled or not)."""
    name = "engine" if family in ENGINE_FAMILIES else family
    return np.random.default_rng([seed, zlib.crc32(name.encode()), purpose])


class Setting:
    """One space as a replay study of it prices its candidates: ``prior`` is ``[(candidate,
    estimate)]`` of every candidate that breaks no constraint, priced with the engine a replay
    study's prior uses (`autotune.costmodel.estimate.default_engine`)."""

    def __init__(self, name: str, model: Path, overrides: dict):
        from autotune.costmodel import SAFETY_MARGIN, resolve_profile
        from autotune.spec.model_yaml import load_spec
        from autotune.spec.space import build_space

        spec = load_spec(model, overrides)
        self.name, self.model, self.overrides = name, model, overrides
        self.spec = replace(spec, cluster=replace(spec.cluster, backend="replay"))
        self.space = build_space(self.spec)
        self.baseline = self.space.baseline()
        profile = resolve_profile(self.spec.cluster)
        self.limit = self.spec.cluster.max_device_memory_gb or profile.memory_gb * SAFETY_MARGIN
        self.prior = self.estimates(self.spec)
        self._engines: dict = {}

    def estimates(self, spec, engine: str | None = None) -> list[tuple]:
        """``[(candidate, estimate)]`` of ``spec`` (this space's, or a world made from it) for
        every candidate that breaks no constraint."""
        from autotune.costmodel import estimate

        found = ((c, estimate(spec, c, engine=engine)) for c in self.space.candidates())
        return [(c, e) for c, e in found if e.breakdown]

    def engine(self, name: str) -> list[tuple]:
        """:meth:`estimates` of this space priced with engine ``name`` (computed once)."""
        if name not in self._engines:
            self._engines[name] = self.estimates(self.spec, name)
        return self._engines[name]


@dataclass
class Truth:
    """A noise-free truth: ``value[key]`` a candidate's goodput (0 when it does not fit),
    ``key`` of a candidate its values of ``columns``; ``step_s`` / ``peak_gb`` per key (a
    measured table's: empty); ``baseline_runs``: whether a study's first run is the baseline
    (the prior's memory screen admits it); ``engine``: the table's engine column (None: none)."""

    columns: tuple
    value: dict
    baseline: tuple
    baseline_runs: bool
    step_s: dict
    peak_gb: dict
    fits: dict
    batch: int
    engine: str | None = None

    @property
    def optimum(self) -> float:
        return max(self.value.values())

    def key(self, knobs: dict) -> tuple:
        """The key of a candidate given as ``{knob: value}`` (inactive knobs at their default:
        `autotune.spec.candidate.Candidate.canonical`)."""
        from autotune.spec.candidate import Candidate

        candidate = Candidate(**knobs).canonical()
        return tuple(getattr(candidate, name) for name in self.columns)

    def best_first(self) -> list[tuple]:
        """The candidates that fit, best first."""
        return sorted((k for k, v in self.value.items() if v > 0), key=lambda k: -self.value[k])


def truth_of(setting: Setting, family: str, seed: int, structures: Structures) -> Truth:
    """``family``'s noise-free truth on ``setting`` for ``seed`` (see the module doc)."""
    from autotune.costmodel import resolve_profile
    from autotune.spec.knobs import KNOB_NAMES

    rng = _stream(family, seed, 0)
    spec, factors, scaled, engine = setting.spec, {}, {}, None
    kind = kind_of(family)
    if kind == "mild":
        profile = resolve_profile(spec.cluster)
        device = {
            "base": profile.name,
            **{k: getattr(profile, k) * rng.uniform(*MILD) for k in PERTURBED},
        }
        world = replace(spec, cluster=replace(spec.cluster, device=device))
        scaled = dict(zip(("recompute", "bubble"), rng.uniform(*MILD, size=2)))
        estimates = setting.estimates(world)
    elif kind == "engine":
        estimates = setting.engine("mindspore")
        shifts = rng.uniform(*ENGINE_SHIFT, size=len(structures.reshaped))
        signs = rng.choice((-1.0, 1.0), size=len(structures.reshaped))
        factors = {m: 1 + s * d for m, s, d in zip(structures.reshaped, signs, shifts)}
        engine = "mindspore" if family == "engine-labelled" else None
    elif kind == "layout":  # MindSpore's engine, as simulate prices it, and the table says so
        estimates, engine = setting.engine("mindspore"), "mindspore"
    else:
        factors, estimates = factors_of(family), setting.prior
    whole = _shape_factor(setting, family, seed) if kind == "layout" else (lambda c: 1.0)
    step_s, peak_gb, fits, value = {}, {}, {}, {}
    batch = spec.train.global_batch_size
    for candidate, est in estimates:
        scale = dict(scaled)
        for mechanism, factor in factors.items():
            if mechanism != "pipeline" or candidate.pp > 1:
                for part in MECHANISMS[mechanism]:
                    scale[part] = scale.get(part, 1.0) * factor
        key = key_of(candidate)
        parts = est.breakdown["time_s"].items()
        step_s[key] = sum(v * scale.get(k, 1.0) for k, v in parts) / whole(candidate)
        peak_gb[key] = est.memory_gb_per_device * factors.get("memory", 1.0)
        fits[key] = peak_gb[key] <= setting.limit * (1 + 1e-9)
        value[key] = batch / step_s[key] if fits[key] else 0.0
    base = key_of(setting.baseline)
    admitted = {key_of(c) for c, e in setting.prior if e.feasible}
    return Truth(
        tuple(KNOB_NAMES), value, base, base in admitted, step_s, peak_gb, fits, batch, engine
    )


def _shape_factor(setting: Setting, family: str, seed: int):
    """The goodput multiplier of a layout family's truth on ``setting``: a function of a
    candidate."""
    batch = setting.spec.train.global_batch_size
    largest = max(batch / (c.dp * micro_count(c)) for c, _ in setting.prior)
    room = Room(batch, largest, seed, family, {})
    effects = shapes_of(family)
    return lambda c: math.prod(SHAPES[name](c, size, room) for name, size in effects.items())


def write_table(truth: Truth, path: Path, family: str, seed: int) -> dict:
    """Write ``truth`` as a replay table of :data:`ROWS` noisy rows per candidate (see the
    module doc); returns each candidate's first measured goodput (0 when out of memory): what a
    study's first run of it measures."""
    rng = _stream(family, seed, 1)
    keys = list(truth.value)
    draws = rng.lognormal(0.0, NOISE_SIGMA, size=(len(keys), ROWS))
    head = [*truth.columns, "goodput", "step_time_ms", "peak_memory_mb", "outcome", "run_s"]
    engine = [truth.engine] if truth.engine else []
    first = {}
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(head + (["detail", "engine"] if engine else ["detail"]))
        for key, noise in zip(keys, draws):
            if not truth.fits[key]:
                first[key] = 0.0
                # one row: every run of it ends so (no draw), and the table loads faster
                out.writerow([*key, "", "", "", "oom", COMPILE_S, "out of memory", *engine])
                continue
            steps = truth.step_s[key] * noise
            first[key] = truth.batch / steps[0]
            mb = f"{truth.peak_gb[key] * 1024:.1f}"
            for s in steps:
                run_s = f"{COMPILE_S + TRIAL_STEPS * s:.1f}"
                out.writerow([*key, truth.batch / s, s * 1000, mb, "ok", run_s, "", *engine])
    return first


def model_reach(truth: Truth, setting: Setting) -> float:
    """The truth's best among the prior's own top :data:`TOP` (feasible by its estimate) over
    the truth's optimum: how far trusting the prior gets (the prior of a study of the truth's
    table: of the engine its ``engine`` column names)."""
    top = prior_top(setting, truth.engine)
    return max(truth.value.get(k, 0.0) for k in top) / truth.optimum


def _priced(setting: Setting, engine: str | None) -> list:
    return setting.engine(engine) if engine else setting.prior


def prior_top(setting: Setting, engine: str | None = None) -> tuple:
    """The keys of the prior's own top :data:`TOP` (feasible by its estimate), best first;
    ``engine``: the prior of a table that says its rows ran that engine."""
    feasible = sorted(
        ((c, e) for c, e in _priced(setting, engine) if e.feasible),
        key=lambda ce: -ce[1].samples_per_s,
    )
    return tuple(key_of(c) for c, _ in feasible[:TOP])


def screen_reach(truth: Truth, setting: Setting) -> float:
    """The truth's best among the candidates the prior's memory screen admits over its optimum:
    what a search that never runs a candidate predicted out of memory can reach."""
    admitted = (key_of(c) for c, e in _priced(setting, truth.engine) if e.feasible)
    return max(truth.value.get(k, 0.0) for k in admitted) / truth.optimum


def real_truth(table_path: Path, model: Path, overrides: dict) -> tuple[Truth, dict]:
    """A measured replay table as a truth (a candidate's value: its mean goodput over its rows,
    0 unless every row is ok) and each candidate's first row (0 unless ok)."""
    from autotune.execution.replay import load_table
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(
        model, {**overrides, "cluster.backend": "replay", "cluster.replay": str(table_path)}
    )
    space = build_space(spec)
    table = load_table(spec, space)
    value = {
        key: statistics.mean(r.metrics["goodput"] for r in rows)
        if all(r.outcome == "ok" for r in rows)
        else 0.0
        for key, rows in table.rows.items()
    }
    first = {
        key: rows[0].metrics["goodput"] if rows[0].outcome == "ok" else 0.0
        for key, rows in table.rows.items()
    }
    base = table.key(space.baseline())
    truth = Truth(table.knobs, value, base, True, {}, {}, {}, spec.train.global_batch_size)
    return truth, first
