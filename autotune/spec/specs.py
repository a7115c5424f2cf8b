"""The typed spec of a study: what a model.yaml says, once `autotune.spec.model_yaml` validated it.

Contract: frozen dataclasses and the defaults they carry, nothing that reads a file or checks a
value; :class:`Spec` is what every stage downstream (space, cost model, study, export) reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autotune.spec.objectives import length_free

DEFAULT_PRECISION = 0.02  # trial.precision: the mean step time to ±2% (95%)
DEFAULT_MIN_STEPS = 10  # trial.min_steps, or every measured step of a shorter trial


# train.total_steps when a model.yaml leaves it out (and init when a MindFormers config's -1
# cannot be counted: `autotune.spec.mindformers_steps`)
DEFAULT_TOTAL_STEPS = 10000
# trial.program when a model.yaml leaves it out: autotune's own trainer (`autotune.spec.programs`)
DEFAULT_PROGRAM = "autotune"


@dataclass(frozen=True)
class ModelSpec:
    family: str | None
    entry: str | None
    num_layers: int | None  # dimensions are None only for an entry model that omits them
    hidden_size: int | None
    num_heads: int | None
    ffn_hidden_size: int | None
    seq_length: int | None
    vocab_size: int | None
    dtype: str
    num_kv_heads: int | None = None  # llama: grouped-query attention (None: every head)
    head_dim: int | None = None  # llama: each attention head's width (None: hidden / heads)
    qk_norm: bool = False  # llama: an RMSNorm on each query and key head (MindFormers' Qwen3)
    param_dtype: str = "float32"  # parameters (and gradients) as the run keeps them
    optimizer_dtype: str = "float32"  # the optimizer's moments
    flash_attention: bool = False  # fused attention (no s² scores) where the backend has it
    # MindFormers' run of a llama (docs/mindformers.md): parallel_config.use_seq_parallel, the
    # token table under the parallel optimizer (model_config.parallel_optimizer), and the layers
    # its per-stage recompute lists mark ({key: layer indices or true}, layout.layer_recompute)
    sequence_parallel: bool = False
    embedding_parallel_optimizer: bool = False
    recompute_layers: dict = field(default_factory=dict)
    # llama: Megatron-Core's --recompute-modules, what selective recompute rebuilds under the
    # megatron engine (`autotune.families.selective`); () for its own patterns
    recompute_modules: tuple = ()
    # llama: experts, latent attention and multi-token prediction (`autotune.families.moe`;
    # MindFormers' Qwen3-MoE and DeepSeek-V3); None / 0 where the model has none
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_ffn_hidden_size: int | None = None
    shared_ffn_hidden_size: int | None = None
    dense_layers: int = 0
    moe_capacity_factor: float | None = None
    experts_tensor_parallel: bool = False  # each expert split over tp too (legacy MindFormers)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    mtp_layers: int = 0
    # how the run computes and communicates (`autotune.families.moe`): the cost model's only
    fp8_linear: bool = False
    moe_comm_overlap: bool = False
    moe_node_limit: int | None = None
    pipeline_schedule: str | None = None  # None: 1F1B; "dualpipe" (`autotune.costmodel.schedules`)
    pipeline_interleave: int | None = None  # chunks per stage: interleaved 1F1B (schedules)
    fsdp: bool = False  # Megatron-FSDP: parameters and gradients sharded too (costmodel.fsdp)
    tp_rules: dict = field(default_factory=dict)  # parameter-name glob → TP_SPLITS (entry models)
    extra: dict = field(default_factory=dict)  # an entry model's own settings, passed through

    def as_config(self) -> dict:
        """The ``model`` section a trial program receives: the fields plus an entry's extras."""
        fields = asdict(self)
        del fields["tp_rules"]  # for export's layout, not for the trainer
        return {**fields.pop("extra"), **fields}


@dataclass(frozen=True)
class TrainSpec:
    global_batch_size: int
    learning_rate: float
    total_steps: int
    save_every: int = 1000  # steps between checkpoints of the exported run


@dataclass(frozen=True)
class ClusterSpec:
    backend: str
    devices: int
    devices_per_node: int
    device_memory_gb: float | None  # None: the device profile's own memory (16 GB on cpu)
    device: str | dict | None
    replay: str | None = None  # backend replay: the table's path (resolved against model.yaml)
    # backend replay: the devices the replayed pool holds, so trials of `devices` run side by
    # side as on a pool that holds several (None: one trial at a time)
    pool_devices: int | None = None
    # MindSpore's max_device_memory: the memory a run may use, already a cap (None: the
    # device's memory with the cost model's safety margin)
    max_device_memory_gb: float | None = None
    # backend replay: what executed the table's rows (`autotune.spec.backends.ENGINES`; None:
    # the table's engine column says, else autotune's trainer), so the prior prices that program
    replay_engine: str | None = None


@dataclass(frozen=True)
class SearchSpec:
    space: dict
    space_source: str
    n_trials: int
    sampler: str
    objectives: tuple[str, ...]
    seed: int | None


@dataclass(frozen=True)
class TrialSpec:
    steps: int
    measure_after: int
    timeout_s: float
    # in a study whose objectives are all `length_free`: stop measuring once the mean step
    # time's relative 95% half-width (step_time_ci) is within `precision`, after `min_steps`
    # measured steps (`autotune.train.program`)
    precision: float = DEFAULT_PRECISION
    min_steps: int = DEFAULT_MIN_STEPS
    # what a trial runs (`autotune.spec.programs`): autotune's trainer, or MindFormers'
    # run_mindformer.py (absolute) on the user's config in MindFormers' own interpreter, on its
    # dataset or a synthetic one (`autotune.spec.mindformers_trial`)
    program: str = DEFAULT_PROGRAM
    run_mindformer: str | None = None
    python: str | None = None
    data: str | None = None
    register_path: str | None = None  # the user's run_mindformer.py --register_path (absolute)
    # the keys of a program registered from outside the package (TrialSpec names no field for)
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    study: str
    model: ModelSpec
    train: TrainSpec
    cluster: ClusterSpec
    search: SearchSpec
    trial: TrialSpec
    source: str = field(default="")
    raw: dict = field(default_factory=dict, repr=False, compare=False)  # the input mapping
    baseline: dict = field(default_factory=dict)  # knob → value of the user's own configuration
    mindformers_base: str | None = None  # export merges into this MindFormers config (absolute)

    def to_dict(self) -> dict:
        return asdict(self)

    def stated(self, section: str, key: str) -> bool:
        """Whether model.yaml states ``section.key`` (not null): else the field holds its
        default, which no export writes as if it were the user's (``train.total_steps``)."""
        part = self.raw.get(section)
        return isinstance(part, dict) and part.get(key) is not None

    def stop_rule(self) -> dict | None:
        """``{"precision", "min_steps"}`` for a trial's config when its objectives let a trial
        stop measuring early (`autotune.spec.objectives.length_free`), else None: every trial
        runs ``trial.steps`` updates."""
        if not length_free(self.search.objectives):
            return None
        return {"precision": self.trial.precision, "min_steps": self.trial.min_steps}
