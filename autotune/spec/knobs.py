"""The one place that defines each tuning knob.

A :class:`Knob` states the knob's name (as stored in the study, and its field of
`autotune.spec.candidate.Candidate`), its value type and domain, its range in the default search
space, what it means, how MindSpore and MindFormers apply it, which compiled graphs hold it, and
whether the cost model can tell its values apart. Everything else (search-space parsing,
sampling, constraints, storage, analysis) reads these definitions instead of repeating them.
Which values a backend executes is the backend's to say (`autotune.spec.backends`). So do the rules
between knobs: which knobs act on a layout (:func:`is_active`) and how the global batch splits
over replicas and micro-batches (:func:`micro_steps`, :func:`batch_split_problems`: the spec's
constraints and the trial program's config check apply the same one).

The code that acts on a knob lives on its own side of the import contracts and registers itself
there by knob name: the trial program's `autotune.train.knob_hooks`, the cost model's
`autotune.costmodel.knob_pricing`, the export's `autotune.export.knob_writers`
(tests/house/test_knob_contracts.py checks that every knob of :data:`KNOBS` has each, or a stated reason
not to). :func:`register_knob` adds a knob from outside the package (a test's, or a plugin's).
"""

from __future__ import annotations

from dataclasses import dataclass

JIT_LEVELS = ("O0", "O1", "O2", "pynative")
RECOMPUTE_MODES = ("none", "selective", "full")
DTYPES = ("float16", "bfloat16", "float32")
# Only float16 is loss-scaled: float32 and bfloat16 have float32's exponent range.
LOSS_SCALED_DTYPES = ("float16",)
# Steps without an overflow before the dynamic loss scaler doubles the scale: MindFormers'
# default scale_window for DynamicLossScaleUpdateCell, which the trial program and every export
# apply alike.
SCALE_WINDOW = 1000


@dataclass(frozen=True)
class Knob:
    """A tuning knob."""

    name: str
    kind: type
    meaning: str
    mindspore: str
    mindformers: str
    default: object = None
    # Whether the cost model's effect of the knob's values is known: where it is not, the
    # simulate backend fixes the knob (a "finding" there would be fixed in advance) and the
    # prior of sampler auto leaves it to the sampler. unestimated_because says why, in notes.
    estimable: bool = True
    unestimated_because: str = ""
    # A knob added after studies were first stored: a study that predates it ran at its default,
    # and neither its fingerprint nor its trials name it (`autotune.study.opening`,
    # `autotune.storage.schema.knobs_of`).
    added_later: bool = False
    # The knob's values: for a str knob the choices (`choices`), for an int knob the least value
    # (`minimum`) and whether only powers of two are allowed (`pow2`).
    choices: tuple = ()
    minimum: int = 1
    pow2: bool = False
    # The knob's domain in the default search space (search_spaces/default.yaml holds the same
    # for the built-in knobs; a search space that leaves the knob out takes this), in the YAML
    # form of `autotune.spec.space.parse_domain`: a list, a range mapping or a scalar.
    default_space: object = None
    # Which compiled graphs of a trial hold the knob's value (`autotune.train.runtime.compile_cache`
    # reuses a graph across the values of a knob it does not hold): "all"; "update", the
    # optimizer update's only (a forward and backward that accumulates, a pipeline stage's
    # cells are the same graph for every value); "none", no graph MindSpore caches (a
    # Parameter's value, or applied by MindSpore's backend after a cached graph loads).
    # docs/mindspore-cpu.md, "Compile cache", has the measurements.
    graphs: str = "all"


_NUMERICS = "the cost model cannot tell its values apart (they change numerics, not work)"

KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "dp",
            int,
            "data-parallel replicas (devices / (tp·pp) when 'auto')",
            "set_auto_parallel_context(parallel_mode=DATA_PARALLEL|SEMI_AUTO_PARALLEL, device_num)",
            "parallel_config.data_parallel",
            default=1,
            default_space="auto",
        ),
        Knob(
            "tp",
            int,
            "tensor parallel ways (Megatron-style: column/row-parallel layers, "
            "vocab-parallel embedding and head)",
            "explicit collectives in the tp group (trial program); operator shard strategies "
            "under SEMI_AUTO_PARALLEL",
            "parallel_config.model_parallel",
            default=1,
            default_space=[1, 2, 4, 8],
        ),
        Knob(
            "pp",
            int,
            "pipeline stages",
            "layers split into stages, 1F1B over micro-batches (trial program); "
            "set_auto_parallel_context(pipeline_stages=pp)",
            "parallel_config.pipeline_stage",
            default=1,
            default_space=[1, 2, 4],
        ),
        Knob(
            "micro_batches",
            int,
            "pipeline micro-batches (used when pp > 1)",
            "1F1B micro-batches per step (trial program); nn.PipelineCell(net, micro_size=micro_batches)",
            "parallel_config.micro_batch_num",
            default=1,
            default_space=[1, 2, 4, 8],
        ),
        Knob(
            "fusion_mb",
            int,
            "AllReduce fusion bucket threshold in MB",
            'set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": MB}})',
            "parallel.comm_fusion",
            default=64,
            graphs="none",
            default_space={"low": 1, "high": 512, "log": True},
        ),
        Knob(
            "grad_accum",
            int,
            "gradient accumulation steps (used when pp == 1)",
            "accumulate grads/K over K micro-steps, one AllReduce and one update per step",
            "runner_config.gradient_accumulation_steps",
            default=1,
            default_space=[1, 2, 4, 8],
        ),
        Knob(
            "loss_scale",
            int,
            "initial value of the dynamic loss scaler (power of two)",
            "DynamicLossScaleUpdateCell(loss_scale_value, scale_factor=2, scale_window)",
            "runner_wrapper.scale_sense.loss_scale_value",
            default=2**16,
            estimable=False,
            unestimated_because=_NUMERICS,
            graphs="none",
            pow2=True,
            default_space={"pow2": [8, 24]},
        ),
        Knob(
            "warmup_steps",
            int,
            "linear warmup steps before cosine decay",
            "LearningRateSchedule: linear warmup then cosine over train.total_steps",
            "lr_schedule.warmup_steps (CosineWithWarmUpLR)",
            default=0,
            estimable=False,
            unestimated_because=_NUMERICS,
            graphs="none",
            minimum=0,
            default_space={"low": 0, "high": 2000, "step": 100},
        ),
        Knob(
            "jit_level",
            str,
            "graph compile level, or PyNative execution",
            "set_context(mode=GRAPH_MODE) and cell.set_jit_config(JitConfig(jit_level=L)), "
            "or set_context(mode=PYNATIVE_MODE)",
            "context.jit_config.jit_level",
            default="O1",
            choices=JIT_LEVELS,
            default_space=["O0", "O1", "pynative"],
            estimable=False,
            unestimated_because="the cost model's jit-level factors on "
            "accelerators are guesses, not measurements (autotune/costmodel/profiles.py)",
        ),
        Knob(
            "recompute",
            str,
            "activation recomputation",
            "Cell.recompute() on each block (full); selective per family: llama — MindFormers' "
            "select_recompute patterns (the SwiGLU's SiLU and product; the attention core when "
            "not fused), transformer — the attention core, mlp — the GeLU; on the layers "
            "model.recompute_layers marks where it marks some",
            "recompute_config.recompute / select_recompute",
            default="none",
            choices=RECOMPUTE_MODES,
            default_space=list(RECOMPUTE_MODES),
        ),
        Knob(
            "parallel_optimizer",
            bool,
            "shard the optimizer over the data-parallel group (MindSpore's parallel optimizer, "
            "level1: weights and optimizer states; acts with dp > 1)",
            "set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config="
            "{'parallel_optimizer_threshold': 64}); the trial program updates each rank's dim-0 "
            "shard of every parameter of 64 KB or more and gathers the shards back with explicit "
            "collectives (docs/parallel.md)",
            "parallel.enable_parallel_optimizer (+ parallel_optimizer_config)",
            default=False,
            added_later=True,
            graphs="update",
            default_space=[False, True],
        ),
        Knob(
            "ep",
            int,
            "expert-parallel ways: the devices a mixture of experts' routed experts are split "
            "over, carved out of dp·tp (acts on a model with experts)",
            "semi-auto parallel layout (dp·tp·cp / ep, ep) of the expert weights, an all-to-all "
            "token dispatch (parallel.enable_alltoall)",
            "parallel_config.expert_parallel",
            default=1,
            added_later=True,
            default_space=[1, 2, 4, 8, 16, 32, 64],
        ),
        Knob(
            "cp",
            int,
            "context-parallel ways: the sequence split across devices for attention, its keys "
            "and values exchanged in a ring (devices = dp·tp·cp·pp)",
            "semi-auto parallel layout (dp, cp, tp) of the activations; flash attention's ring "
            "over the cp group",
            "parallel_config.context_parallel",
            default=1,
            added_later=True,
            default_space=[1, 2, 4, 8],
        ),
        Knob(
            "ulysses",
            int,
            "of the cp ranks, how many split the attention heads instead of the sequence "
            "(DeepSpeed-Ulysses: queries, keys, values and output exchanged all-to-all inside "
            "that group; the cp / ulysses groups of them pass keys and values around; acts "
            "with cp > 1)",
            "semi-auto parallel layout of the attention (dp, cp / ulysses, ulysses·tp) with "
            "all-to-alls inside each ulysses group",
            "parallel_config.context_parallel_algo (ulysses_cp, or hybrid_cp on the legacy "
            "models) and parallel_config.ulysses_degree_in_cp",
            default=1,
            added_later=True,
            default_space=[1, 2, 4, 8],
        ),
    )
}

# A live view: a knob registered later (:func:`register_knob`) is in it.
KNOB_NAMES = KNOBS.keys()


def register_knob(knob: Knob) -> Knob:
    """Add ``knob`` to :data:`KNOBS` (after the built-in knobs: a study's params and columns keep
    their order). Its name is its Candidate field, so it must be an identifier no knob nor
    Candidate attribute has; it states its ``default_space`` (the default space file does not
    know it) and, a str knob, its ``choices``. The code that applies, prices and exports it
    registers on its own side (see the module doc). ValueError for an entry that breaks this."""
    from autotune.spec.candidate import Candidate

    if not knob.name.isidentifier() or knob.name.startswith("_"):
        raise ValueError(f"knob name {knob.name!r}: must be a public Python identifier")
    if knob.name in KNOBS or hasattr(Candidate, knob.name):
        raise ValueError(f"knob name {knob.name!r}: already taken")
    if knob.default_space is None:
        raise ValueError(f"knob {knob.name!r}: default_space must be given")
    if knob.kind not in (int, str, bool):
        raise ValueError(f"knob {knob.name!r}: kind must be int, str or bool")
    if knob.kind is str and not knob.choices:
        raise ValueError(f"knob {knob.name!r}: a str knob states its choices")
    KNOBS[knob.name] = knob
    return knob


class KnobHooks:
    """One side's code per knob, registered by knob name: the trial program's, the cost model's
    or one export document's (the module doc names them). ``register(name)`` decorates the
    function that does it for knob ``name``, and the side calls :meth:`call` where every knob's
    turn comes, in :data:`KNOBS` order; ``in_place(name, where, why)`` states instead that the
    side handles ``name`` inside the function ``where`` (``"module:qualname"``), for the reason
    ``why`` — a layout knob, or one woven through a computation with others.
    tests/house/test_knob_contracts.py checks that every knob has one or the other, or that its
    :class:`Knob` entry says why the side needs neither."""

    def __init__(self, side: str):
        self.side = side
        self.hooks: dict = {}
        self.places: dict = {}

    def register(self, name: str):
        def decorate(function):
            self._unclaimed(name)
            self.hooks[name] = function
            return function

        return decorate

    def in_place(self, name: str, where: str, why: str) -> None:
        self._unclaimed(name)
        self.places[name] = (where, why)

    def _unclaimed(self, name: str) -> None:
        if self.handles(name):
            raise ValueError(f"{self.side}: knob {name!r} is registered already")

    def unregister(self, name: str) -> None:
        """Forget knob ``name``'s hook or statement (a test restoring the registry)."""
        self.hooks.pop(name, None)
        self.places.pop(name, None)

    def handles(self, name: str) -> bool:
        return name in self.hooks or name in self.places

    def call(self, knobs: dict, *args) -> None:
        """Run the hook of each knob of ``knobs`` (name → value) that has one, in :data:`KNOBS`
        order, as ``hook(value, *args)``."""
        for name in KNOBS:
            if name in self.hooks and name in knobs:
                self.hooks[name](knobs[name], *args)


def trial_warmup(warmup_steps: int, total_steps: int, trial_steps: int) -> int:
    """The warmup of a ``train.total_steps`` run's schedule compressed onto a ``trial_steps``
    trial, in trial steps (`autotune.train.step.schedule`): warmups that give the same number here
    train alike in a trial."""
    warmup = round(warmup_steps * trial_steps / total_steps) if total_steps > 0 else 0
    return min(warmup, trial_steps)


def devices_of(dp: int, tp: int, pp: int, cp: int = 1) -> int:
    """The devices a layout takes: dp·tp·cp·pp (expert parallelism is carved out of dp·tp, as
    MindFormers' ``check_rules`` and mcore layouts count them)."""
    return dp * tp * cp * pp


def is_active(name: str, dp: int, pp: int, cp: int = 1) -> bool:
    """Whether knob ``name`` acts on a candidate of data-parallel size ``dp``, ``pp`` stages and
    ``cp`` context-parallel ranks: micro_batches only with pipeline stages, grad_accum only
    without, fusion_mb and parallel_optimizer only with a data-parallel group (gradients to
    all-reduce, states to shard), ulysses only with context parallelism. A knob that does not
    act takes its default, so candidates that differ only in knobs that cannot act on them are
    one candidate, for every sampler."""
    if name == "ulysses":
        return cp > 1
    if name == "micro_batches":
        return pp > 1
    if name == "grad_accum":
        return pp == 1
    if name in ("fusion_mb", "parallel_optimizer"):
        return dp > 1
    return True


def micro_steps(*, pp: int, micro_batches: int, grad_accum: int) -> int:
    """Micro-batches per optimizer step: ``micro_batches`` with pipeline stages, else
    ``grad_accum`` (whichever of the two acts: :func:`is_active`)."""
    return micro_batches if pp > 1 else grad_accum


def batch_split_problems(
    *, global_batch_size: int, dp: int, pp: int, micro_batches: int, grad_accum: int
) -> list[tuple[str, str]]:
    """Why a global batch of ``global_batch_size`` cannot be split into equal micro-batches over
    ``dp`` replicas and the :func:`micro_steps` of one optimizer step, as (field, reason) pairs
    (empty: it can): the batch divides by dp·grad_accum (pp = 1) or dp·micro_batches (pp > 1),
    and with pipeline stages micro_batches ≥ pp. The one rule the spec's constraints and the
    trial program's config check both apply."""
    problems = []
    if pp == 1 and global_batch_size % (dp * grad_accum):
        problems.append(
            (
                "train.global_batch_size",
                f"global_batch_size = {global_batch_size} "
                f"is not divisible by dp·grad_accum = {dp * grad_accum}",
            )
        )
    if pp > 1 and global_batch_size % (dp * micro_batches):
        problems.append(
            (
                "train.global_batch_size",
                f"global_batch_size = {global_batch_size} "
                f"is not divisible by dp·micro_batches = {dp * micro_batches}",
            )
        )
    if pp > 1 and micro_batches < pp:
        problems.append(("knobs.micro_batches", f"micro_batches = {micro_batches} < pp = {pp}"))
    return problems
