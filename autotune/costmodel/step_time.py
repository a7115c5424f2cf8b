"""Step time of one candidate, by part, in seconds.

Contract: :func:`step_time` returns ``(breakdown, flops)``: breakdown keys ``compute``,
``recompute``, ``tp_comm``, ``pp_comm``, ``dp_comm``, ``bubble``, ``optimizer``, ``host``
(seconds per training step; their sum is the step time), and ``flops`` with ``model`` (without
recompute) and ``executed`` (with every repeated forward), per step for the whole job.
:func:`crossings` says which communication groups and stage boundaries of a layout span two
nodes.

Model:

- Compute: FLOPs (``workload.py``, Narayanan et al. 2021) at ``peak × achievable``, plus the
  memory-bound kernels (norms, activations, softmax, dropout, residual adds) at
  ``hbm × hbm_efficiency``: forward traffic ≈ reading and writing each kept activation once
  (2 × the un-recomputed activation bytes), backward twice that. The memory-bound share is what
  makes narrow models less efficient than wide ones. Both scale by the jit level's factor.
- Recompute, layer by layer (``workload.py``: the knob refined by ``model.recompute_layers``):
  full repeats each layer's forward (×4/3 of the layer compute, Narayanan et al.); selective
  repeats QKᵀ·V and the softmax in the transformer family (Korthikanti et al. 2022 §5) and, in
  the llama family, MindFormers' patterns (the SwiGLU's SiLU and product, memory-bound) and
  the attention core when it is not fused. Under the ``"trainer"`` engine every pipeline stage
  but the last also runs each micro-batch's forward twice (a forward-only graph to send the
  activation, then forward+backward; see ``memory.py``): one more forward of its layers, on top
  of the ``recompute`` knob, priced under ``recompute`` too. ``"megatron"`` and
  ``"mindspore"`` (MindSpore's pipeline: one forward per micro-batch) run no such forward.
- Sequence parallelism (``"mindspore"``, a llama with ``model.sequence_parallel`` and tp > 1):
  each tensor-parallel all-reduce is a reduce-scatter and an all-gather (the same bytes, one
  more launch), a layer whose norms' communication is recomputed (``select_comm_recompute``)
  all-gathers both norm outputs again in its backward, and a pipeline message is the
  sequence-split hidden state (1/tp).
- Tensor parallel (Megatron, Shoeybi et al. 2019, not overlapped), each an all-reduce over the
  tp group: per layer 2 in forward and 2 in backward of the hidden state (1 and 1 for the MLP;
  repeated forwards repeat theirs); the first stage's vocab-parallel embedding 1 in forward; the
  last stage's vocab-parallel head 1 in backward, and its cross-entropy 3 small float32 ones per
  micro-batch (tp·N floats for the max, N for the sum of exponentials, N for the target logit;
  N = tokens in the micro-batch).
- Ring all-reduce of S bytes over n ranks: 2(n−1)/n · S/B + 2(n−1)·α_hop + α_launch (Patarasuk &
  Yuan 2009; Thakur et al. 2005). B is the intra-node link unless some group of that kind spans
  two nodes (node = rank // devices_per_node, ranks as :mod:`autotune.layout` numbers them: tp
  innermost, then dp, then stage), then the per-device inter-node link.
- Pipeline (1F1B, Narayanan et al. 2021 §2.2): m micro-batches take (m + p − 1) micro-batch
  times of the slowest stage (the last runs the head; the others, under the trainer, the
  second forward; a stage next to a node boundary sends slower); the bubble is the (p − 1)
  extra, a fraction (p − 1)/(m + p − 1) of the step. Each micro-batch's activation goes forward
  and its gradient back; the trainer sends each as a 2-rank all-reduce (the receiver adds
  zeros), so a stage pays two such all-reduces of the hidden state (compute dtype) per
  micro-batch, at the slower of its own boundaries: inter-node only if some pair of
  neighbours across it (``dp·tp`` ranks apart) sits on two nodes. (With nodes and stages both
  contiguous rank blocks, a pipeline over several nodes always has such a boundary somewhere;
  the stages away from it send at the intra-node rate.)
- Gradient accumulation (pp = 1): m = grad_accum micro-steps of compute, one DP all-reduce.
- Data-parallel all-reduce of the gradients (``memory.gradient_bytes``: the trainer's and
  MindSpore's are in the parameters' dtype, 4 bytes per local parameter of the stage with most
  in float32; Megatron's 16-bit ones 2; Megatron-FSDP's per micro-batch: `costmodel.fsdp`), in
  buckets of ``fusion_mb × FUSION_FILL``; each bucket pays the α terms, all pay the bandwidth
  term once. Buckets are reduced while the last micro-batch's backward (⅔ of its compute and
  knob recompute; not the second forward, a graph of its own) still runs: with k buckets,
  (k−1)/k of that window hides communication, the last bucket never hides. One bucket hides
  nothing; many pay latency. The trainer's pipeline stages and its accumulating steps
  (``grad_accum`` > 1) reduce in a graph of their own after the last micro-batch (``ApplyStep``),
  and MindSpore's pipeline reduces its accumulated gradients after the last micro-batch too, so
  there nothing hides. The profile's
  ``comm_overlap`` scales the window: 0.5 on the accelerators (collectives run on their own
  streams; how much they hide is assumed, and calibrated per study), 0 on the CPU backend, which
  runs a graph's kernels in turn.
- Inside a node a collective among g devices runs at ``profile.group_gbps(g)``: the node's rate
  on a switch, fewer links on a full mesh (Ascend 910B's HCCS: one link per pair of NPUs).
- Optimizer: Adam is memory-bound: ≈ 32 bytes per local parameter moved (read and write its
  16 bytes of state) at device memory bandwidth; under the parallel optimizer only the rows a
  device owns (``memory.optimizer_elements``).
- Parallel optimizer, as the trainer runs it (`autotune.train.parallel.sharding`): the gradients keep
  their all-reduce, and after the update each sharded parameter is rebuilt by one all-reduce
  of its tp slice in ``param_dtype`` over the ranks that share it (the dp group, or the
  stage's dp·tp ranks for a replicated parameter), after the step's backward: never hidden,
  added to ``dp_comm``. MindSpore's own parallel optimizer (``"mindspore"``) reduce-scatters
  those gradients instead of all-reducing them (half the volume, overlapped as the all-reduce
  is) and all-gathers the parameters before their use, in the compute dtype when the run casts
  them ((n−1)/n · S/B, priced exposed: an assumption the calibration corrects).
- Host: the profile's per-step overhead. Loss scale and warmup steps have no effect on step time
  or memory (they change numerics, not work), so the model ignores them.
"""

from __future__ import annotations

from functools import lru_cache, partial

from autotune.costmodel import fsdp, schedules
from autotune.costmodel.collectives import allgather_time, allreduce_time, dp_exposed
from autotune.costmodel.memory import (
    distributed_elements,
    distributes_optimizer,
    gathered_bytes,
    gradient_bytes,
    optimizer_elements,
    shards_optimizer,
)
from autotune.costmodel.moe_time import (
    MOE_PARTS,
    expert_replicas,
    fp8_saving,
    moe_parts,
    overlap,
)
from autotune.costmodel.profiles import DeviceProfile
from autotune.families.layers import stage_layers
from autotune.families.workload import Workload
from autotune.layout import DTYPE_BYTES, rank_of

OPTIMIZER_BYTES_PER_PARAM = 32  # read + write of the 16 bytes/param of Adam state
__all__ = ["MOE_PARTS", "allgather_time", "allreduce_time", "crossings", "step_time"]
BACKWARD_SHARE = 2 / 3  # backward = 2 × forward FLOPs (Narayanan et al. 2021)
FLOAT32 = 4  # the cross-entropy's all-reduces are float32 whatever the dtype


@lru_cache(maxsize=1024)
def crossings(dp: int, tp: int, pp: int, per_node: int) -> tuple[bool, bool, tuple[bool, ...]]:
    """``(some tp group spans two nodes, some dp group does, per stage boundary s → s+1: some
    pair of neighbours across it does)``.

    Ranks of a group grow with its index, so a group spans nodes exactly when its first and
    last rank are on different nodes."""

    def node(stage, d, t):
        return rank_of(stage, d, t, dp, tp) // per_node

    tp_crosses = any(node(s, d, 0) != node(s, d, tp - 1) for s in range(pp) for d in range(dp))
    dp_crosses = any(node(s, 0, t) != node(s, dp - 1, t) for s in range(pp) for t in range(tp))
    boundaries = tuple(
        any(node(s, d, t) != node(s + 1, d, t) for d in range(dp) for t in range(tp))
        for s in range(pp - 1)
    )
    return tp_crosses, dp_crosses, boundaries


def step_time(
    work: Workload,
    c,
    profile: DeviceProfile,
    cluster,
    micro_batch: int,
    n_micro: int,
    dtype: str,
    params_per_device: float,
    engine: str = "trainer",
    param_dtype: str = "float32",
) -> tuple[dict, dict]:
    """Seconds per step by part, and FLOPs per step (see module doc)."""
    replicas = c.dp * c.cp  # the ranks that hold the same slices: cp splits tokens, not weights
    per_node = cluster.devices_per_node
    tp_crosses, dp_crosses, boundaries = crossings(replicas, c.tp, c.pp, per_node)

    def gbps(crossed: bool, group: int) -> float:
        return profile.inter_node_gbps if crossed else profile.group_gbps(group)

    stages = {}  # stages that differ only in their index cost the same: price each kind once
    kinds = []
    # its own one or two boundaries; interleaved, the last stage sends on to the first too
    wraps = schedules.chunks(work, c, engine) > 1 and any(boundaries)
    for stage in range(c.pp):
        crossed = any(boundaries[max(0, stage - 1) : stage + 1]) or wraps and stage in (0, c.pp - 1)
        kind = (
            stage == 0,
            stage == c.pp - 1,
            crossed,
            work.stage_modes(c.recompute, c.pp, stage),
            work.stage_moe_layers(c.pp, stage),
        )
        kinds.append(kind)
        if kind not in stages:
            # a pipeline transfer joins two devices: one link of a mesh
            stages[kind] = _stage_micro_batch(
                work,
                c,
                profile,
                gbps(tp_crosses, c.tp),
                gbps(crossed, 2),
                micro_batch,
                dtype,
                stage,
                engine,
                per_node,
            )
    ranks = list(stages.values())
    dual = schedules.dualpipe(work, c, engine)
    if dual:  # rank r runs stage r and stage pp − 1 − r, half the micro-batches each
        ranks = [
            (
                schedules.paired(stages[kinds[r]][0], stages[kinds[-1 - r]][0]),
                (stages[kinds[r]][1] + stages[kinds[-1 - r]][1]) / 2,
            )
            for r in range(c.pp // 2)
        ]
    pace, window = max(ranks, key=lambda s: sum(s[0].values()))
    if engine != "megatron" and c.pp > 1 or engine == "trainer" and n_micro > 1:
        window = (
            0.0  # the update (and its all-reduce) runs after the last micro-batch, in its own graph
        )
    per_grad = gradient_bytes(engine, dtype, param_dtype)
    grad_bytes = params_per_device * per_grad
    sharded_data = fsdp.applies(work, c, engine)  # Megatron-FSDP
    updated, gather = params_per_device, 0.0
    if shards_optimizer(c, engine):
        param_bytes = DTYPE_BYTES[param_dtype]
        sharded = optimizer_elements(work, c.dp, c.tp, c.pp, param_bytes, c.ep)
        updated = max(owned for owned, *_ in sharded)  # the stage with the most owned rows
        moved = param_bytes if engine == "trainer" else gathered_bytes(dtype, param_dtype)
        gather = max(
            _sharded_traffic(
                c,
                profile,
                gbps(dp_crosses, c.dp),
                gbps(dp_crosses or tp_crosses, c.dp * c.tp),
                on_dp * moved,
                on_stage * moved,
                engine,
            )
            for _, _, on_dp, on_stage in sharded
        )
        if engine == "mindspore":  # reduce-scatter: half an all-reduce's volume for those rows
            grad_bytes -= max(on_dp + on_stage for *_, on_dp, on_stage in sharded) * per_grad / 2
    elif distributes_optimizer(c, engine) or sharded_data:  # ZeRO-1: an all-reduce's traffic
        updated = max(distributed_elements(work, c.dp, c.tp, c.pp, c.ep))
    # the routed experts' gradients are reduced over the ranks holding the same experts only
    share, n_experts = expert_replicas(work, c, params_per_device)
    experts = grad_bytes * share
    # the dense and the expert groups' links (the experts' ranks stride over the stage's dp·tp)
    links = (gbps(dp_crosses, replicas), gbps(dp_crosses or tp_crosses, n_experts))
    if sharded_data:  # gathered and reduce-scattered per micro-batch, behind its kernels
        nbytes = params_per_device * DTYPE_BYTES[dtype]
        groups = ((nbytes * (1 - share), replicas, links[0]), (nbytes * share, n_experts, links[1]))
        exposed = fsdp.exposed(n_micro, groups, pace, partial(allgather_time, profile=profile))
    else:
        exposed = dp_exposed(
            c, profile, links[0], grad_bytes - experts, window * (1 - share), replicas
        ) + (dp_exposed(c, profile, links[1], experts, window * share, n_experts) if experts else 0)
    breakdown = {
        **{part: n_micro * seconds for part, seconds in pace.items()},
        "dp_comm": exposed + gather,
        "bubble": schedules.bubble(c.pp, sum(pace.values()))
        if dual
        else schedules.bubble_1f1b(c.pp, sum(pace.values()), schedules.chunks(work, c, engine)),
        "optimizer": updated
        * OPTIMIZER_BYTES_PER_PARAM
        / (profile.hbm_gbps * 1e9 * profile.hbm_efficiency),
        "host": profile.step_overhead_ms * 1e-3,
    }
    batch = micro_batch * n_micro * c.dp
    model = batch * (work.layers * work.layer_flops() + work.last_stage_flops() + work.mtp_flops())
    executed = model + batch * sum(
        n * work.recompute_flops(mode)
        for stage in range(c.pp)
        for (mode, _), n in work.stage_modes(c.recompute, c.pp, stage)
    )
    if _forwards_twice(engine, c.pp):  # each of the pp − 1 stages but the last, once more
        before_last = work.layers - len(stage_layers(work.layers, c.pp, c.pp - 1))
        executed += batch * before_last * work.forward_layer_flops()
    if work.capacity > 1:  # the padded expert slots run too
        executed += batch * work.layers * work.routed_flops() * (work.capacity - 1)
    return breakdown, {"model": model, "executed": executed}


def _sharded_traffic(
    c,
    profile: DeviceProfile,
    dp_gbps: float,
    stage_gbps: float,
    on_dp: float,
    on_stage: float,
    engine: str,
) -> float:
    """Seconds a step spends rebuilding the sharded parameters (``on_dp`` bytes shared by the dp
    group, ``on_stage`` by the stage's dp·tp ranks): the trainer's all-reduce of zero-padded
    shards, or MindSpore's all-gather before their use (see the module doc)."""
    collective = allreduce_time if engine == "trainer" else allgather_time
    return (collective(on_dp, c.dp, dp_gbps, profile) if on_dp else 0.0) + (
        collective(on_stage, c.dp * c.tp, stage_gbps, profile) if on_stage else 0.0
    )


def _forwards_twice(engine: str, pp: int) -> bool:
    """Whether the stages before the last run each micro-batch's forward twice: the trainer's
    (MindSpore's own pipeline and Megatron's run one forward per micro-batch)."""
    return engine == "trainer" and pp > 1


def _stage_micro_batch(
    work: Workload,
    c,
    profile: DeviceProfile,
    tp_gbps: float,
    pp_gbps: float,
    micro_batch: int,
    dtype: str,
    stage: int,
    engine: str,
    per_node: int = 1,
) -> tuple[dict, float]:
    """``({compute, recompute, tp_comm, pp_comm, MOE_PARTS…}, backward window)``: seconds one
    micro-batch costs a device of ``stage``, and how long its backward runs (DP overlap)."""
    nbytes = DTYPE_BYTES[dtype]
    rate = profile.peak(dtype) * profile.achievable / profile.jit_factor(c.jit_level)
    hbm = profile.hbm_gbps * 1e9 * profile.hbm_efficiency / profile.jit_factor(c.jit_level)
    modes = work.stage_modes(c.recompute, c.pp, stage)
    layers = sum(n for _, n in modes)
    first, last = stage == 0, stage == c.pp - 1
    twice = _forwards_twice(engine, c.pp) and not last
    split = work.sequence_parallel and c.tp > 1

    # FP8 linear layers (`moe_time.fp8_saving`): the share of their GEMMs' time saved
    saved = fp8_saving(work, profile, dtype, engine)

    def kernels(flops_per_sample: float, traffic_per_sample: float, linear: float = 0.0) -> float:
        # tp splits the work, cp the tokens (`autotune.costmodel.moe_time` prices its ring);
        # ``linear`` of the FLOPs are the linear layers' GEMMs, FP8 where the model says so
        flops = flops_per_sample - saved * linear
        return micro_batch * (flops / c.tp / c.cp / rate + traffic_per_sample / hbm)

    def forward_traffic(comm: bool) -> float:  # each kept activation written and read once
        return 2 * work.layer_activations(c.tp, "none", nbytes, comm)

    def redone_traffic(mode: str, comm: bool) -> float:
        if mode == "full":
            return forward_traffic(comm)
        if mode == "selective":
            return 2 * (
                work.layer_activations(c.tp, "none", nbytes, comm)
                - work.layer_activations(c.tp, "selective", nbytes, comm)
            )
        return 0.0

    own_parts = sum(work.part_flops().values())  # experts and MLA: parts of their own
    compute = kernels(
        layers * (work.layer_flops() - own_parts) + (work.last_stage_flops() if last else 0.0),
        sum(n * 3 * forward_traffic(comm) for (_, comm), n in modes),
        layers * (work.linear_flops() - own_parts + work.router_flops()),
    )
    extra = moe_parts(
        work,
        c,
        profile,
        per_node,
        micro_batch,
        nbytes,
        stage,
        kernels,
        lambda size: allreduce_time(size, c.tp, tp_gbps, profile),
        saved > 0,
    )
    moe_tp = extra.pop("tp_comm")
    knob_recompute = kernels(
        sum(n * work.recompute_flops(mode) for (mode, _), n in modes),
        sum(n * redone_traffic(mode, comm) for (mode, comm), n in modes),
        sum(n for (mode, _), n in modes if mode == "full") * work.linear_flops() / 3,
    )
    if work.moe_comm_overlap and engine != "trainer":
        overlap(extra, compute + knob_recompute)
    second_forward = (
        kernels(
            layers * work.forward_layer_flops(),
            sum(n * forward_traffic(comm) for (_, comm), n in modes),
        )
        if twice
        else 0.0
    )

    message = micro_batch * work.hidden_state_bytes(nbytes) / c.cp
    # hidden states travel in the compute dtype; a 16-bit reduction may be slower (profile)
    slower = profile.half_collective_factor if nbytes == 2 else 1.0
    count = sum(n * work.tp_allreduces(mode) for (mode, _), n in modes) + (
        layers * work.tp_forward_allreduces() if twice else 0
    )
    if first and work.vocab_parallel_embedding:
        count += 2 if twice else 1
    gather = allgather_time(message, c.tp, tp_gbps, profile)
    # sequence parallel: a reduce-scatter and an all-gather for each all-reduce, and the norms'
    # all-gathers again in the backward of a layer whose communication is recomputed
    slot = 2 * gather if split else allreduce_time(message, c.tp, tp_gbps, profile)
    tp_comm = count * slower * slot + slower * moe_tp
    if split:
        tp_comm += slower * 2 * gather * sum(n for (_, comm), n in modes if comm)
    if last:
        tokens = micro_batch * work.tokens / c.cp
        tp_comm += (
            slower * allreduce_time(message, c.tp, tp_gbps, profile)  # head, backward
            + allreduce_time(c.tp * tokens * FLOAT32, c.tp, tp_gbps, profile)
            + 2 * allreduce_time(tokens * FLOAT32, c.tp, tp_gbps, profile)
        )
    sent = message / c.tp if split else message
    pp_comm = 2 * slower * allreduce_time(sent, 2, pp_gbps, profile) if c.pp > 1 else 0.0
    kernels_run = compute + knob_recompute + extra["experts"] + extra["mla"]
    if (v := schedules.chunks(work, c, engine)) > 1:  # v times the sends, behind the chunks
        pp_comm = schedules.exposed_sends(v * pp_comm, kernels_run)
    times = {
        "compute": compute,
        "recompute": knob_recompute + second_forward,
        "tp_comm": tp_comm,
        "pp_comm": pp_comm,
        **extra,
    }
    return times, BACKWARD_SHARE * kernels_run
