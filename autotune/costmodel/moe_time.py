"""The step-time parts a mixture of experts, multi-latent attention, MTP modules and context
parallelism add, per micro-batch on one device of a stage, in seconds.

Contract: :func:`moe_parts` returns every key of :data:`MOE_PARTS` (zero where the model or
layout has none of it) and ``tp_comm``, the tensor-parallel seconds an MoE layer adds to the
dense layer's (legacy MoE below); `autotune.costmodel.step_time` adds them to the stage's parts (the
pipeline's pace and bubble include them; the estimate's breakdown shows each). The FLOPs are the
workload's (`autotune.families.moe_workload`), run at the same rate as the rest of the step:

- ``experts``: the routed and shared experts' GEMMs and the router, fwd+bwd — grouped GEMMs
  (MindFormers' ``moe_grouped_gemm``) priced at the dense GEMM rate; with a capacity factor c
  (a padded router: MindFormers' legacy ``moe_config.capacity_factor``) the routed GEMMs run
  on c × the slots.
- ``imbalance``: with a dropless router and ep > 1 the ranks of an expert-parallel group wait
  for the busiest one: the routed experts' time × (:data:`ROUTER_IMBALANCE` − 1). A padded
  router bounds every expert at its capacity, and with ep = 1 every device runs every expert on
  its own tokens: no wait.
- ``mla``: multi-latent attention's projections (its QKᵀ and AV stay in ``compute``).
- ``mtp``: the MTP modules, on the last stage.
- ``ep_comm`` / ``ep_comm_inter``: per MoE layer of the stage the dispatch and the combine
  all-to-all in the forward and again in the backward (4; 6 when the layer is recomputed
  whole), each moving a device's k copies of its tokens (MindFormers splits an MoE layer's
  tokens over dp·tp·cp), of which the (ep − 1) / ep sent to other ranks: to the peers inside the
  node at the node's rate for a group of that size, to those on other nodes at the per-device
  inter-node rate, the two priced one after the other (no overlap with compute, nor with each
  other: an assumption). An expert-parallel group is ep consecutive ranks (MindFormers'
  ``layout_moe``: device matrix (dp·tp·cp / ep, ep)), so it spans nodes once ep exceeds
  ``devices_per_node``.
- MindFormers' legacy MoE (``model.experts_tensor_parallel``: ``MoEV2`` with each expert split
  over ``model_parallel``) carves its ep group out of dp instead: ep consecutive dp indices,
  ``tp`` ranks apart (``dp_moe = dp // ep`` outermost, then ep, then mp), so with tp = the
  node's devices every peer is on another node. Without sequence parallelism (its release 1.3's
  runs) the layer's tokens are split over dp only: each of the tp ranks dispatches the whole of
  its dp share, and the experts' row-parallel output — the dispatched buffer, not the hidden
  state — is all-reduced over tp, in the forward, in the backward (the column-parallel input's
  gradient) and in a whole-layer recompute (``tp_comm``, added to the stage's). Under sequence
  parallelism (MindFormers 1.9: the router's data parallel becomes dp·mp) the tokens split
  over dp·tp as above.
- FP8 (``model.fp8_linear``, on a device with an FP8 peak, not under autotune's trainer):
  the linear layers' GEMMs — projections, feed-forward, experts, MLA's projections, in a
  whole-layer recompute and the MTP modules' projection and layer too — run at
  ``peak_tflops_fp8 × achievable`` (:func:`fp8_saving`; the achievable fraction assumed the
  same as BF16's, unmeasured); the attention core, the router and the logits stay in the
  compute dtype (DeepSeek-V3 §3.3: embedding, output head, gating, norms and attention kept in
  BF16/FP32). The all-to-alls then move
  :data:`FP8_MOVED` bytes per element instead of 2.
- Overlap (``model.moe_comm_overlap``, not under autotune's trainer): the all-to-alls run while
  another micro-batch computes (DualPipe pairs one micro-batch's forward chunk with another's
  backward chunk; DeepSeek-V3 §3.2.1), so only what exceeds the stage's computation of a
  micro-batch stays (:func:`overlap`). An assumption: the report's "fully overlapped"; the
  compute units the communication kernels take (DeepSeek: 20 of 132 SMs) are not priced.
- Node-limited dispatch (``model.moe_node_limit`` M, mcore ep groups over several nodes): a
  token's k experts lie on at most M of the group's n nodes, on m·(1 − (1 − 1/m)^k) of them
  on average (m = min(M, n), experts spread evenly), and the token crosses to each once, (n −
  1)/n of them remote, at the per-device inter-node rate; inside each node it is forwarded to
  its experts' devices, k·(g − 1)/g copies at the node's rate (g = devices per node;
  :func:`node_limited`; DeepSeek-V3 §3.2.2: IB to the same-index GPU, then NVLink). The
  forwarding is pipelined with the IB transfer (§3.2.2: each token forwarded as it arrives,
  "communications via IB and NVLink are fully overlapped"; DeepEP's internode kernels, which
  Megatron's ``--moe-enable-deepep`` runs, do the same), so only the NVLink time beyond the IB
  time is added (``ep_comm``). Without it every copy travels on its own (above).
- autotune's trainer (`autotune.families.llama_workload.Llama.executed_by`): every local expert runs
  every gathered token (``experts`` at E/k × the routed FLOPs; no ``imbalance``: each rank
  computes all its tokens whatever the router chose), and its all-gather dispatcher's gather
  and combine are each an all-reduce of ep blocks of the rank's tokens (this CPU has no
  all-to-all: docs/parallel.md, "Expert parallelism"), 4 per MoE layer (6 recomputed whole).
- ``cp_comm``: context parallelism as a ring over the cp ranks (MindFormers'
  ``colossalai_cp``): per layer the forward passes each rank's share of the keys and values on
  cp − 1 times, the backward passes them and their gradients (twice that), a whole-layer
  recompute the forward's once more — each hop at the rate of one link (inter-node when the
  cp group, which strides by tp, spans nodes), not hidden behind attention (an assumption).
  With a Ulysses group of u of the cp ranks (knob ``ulysses``: MindFormers' ``ulysses_cp`` /
  ``hybrid_cp``, ``ulysses_degree_in_cp``) the ring runs over cp / u of them, and each pass of
  a layer — forward, backward, a whole-layer recompute's forward — adds two all-to-alls inside
  the group (:func:`ulysses_exchange`): the queries, keys and values, then the output, priced as
  the expert all-to-alls are.
"""

from __future__ import annotations

from autotune.costmodel.collectives import allreduce_time
from autotune.costmodel.memory import rank_expert_params, rank_params
from autotune.costmodel.profiles import DeviceProfile

# A dropless router's busiest expert-parallel rank over the mean (the others wait for it): an
# assumption, unmeasured — the trainer's router load statistics are to measure it
# (docs/costmodel.md, "Experts").
ROUTER_IMBALANCE = 1.1
MOE_PARTS = ("experts", "imbalance", "mla", "mtp", "ep_comm", "ep_comm_inter", "cp_comm")
# Bytes per element an expert all-to-all moves on average when the linear layers are FP8:
# DeepSeek-V3 (§3.3.2-3.3.3) sends the forward dispatch and the gradient before the experts'
# down-projection (the combine's backward) in FP8, 1 byte plus one float32 scale per 128
# elements, and the combine and the dispatch's backward in BF16: (2·(1 + 4/128) + 2·2) / 4.
FP8_MOVED = (2 * (1 + 4 / 128) + 2 * 2) / 4


def ep_peers(ep: int, per_node: int, stride: int = 1) -> tuple[int, int]:
    """``(peers inside the node, peers on other nodes)`` of a rank in an ep group of ep ranks
    ``stride`` apart (1: consecutive; node-aligned groups)."""
    inside = min(ep, max(1, per_node // stride))
    return inside - 1, ep - inside


def all_to_all(
    nbytes: float, ep: int, per_node: int, profile: DeviceProfile, stride: int = 1
) -> tuple:
    """``(seconds inside the node, seconds across nodes)`` of one all-to-all in which a device
    sends ``nbytes`` spread evenly over its ep group of ranks ``stride`` apart (1/ep stays)."""
    if ep <= 1:
        return 0.0, 0.0
    inside, outside = ep_peers(ep, per_node, stride)
    alpha = (profile.collective_latency_us + (ep - 1) * profile.hop_latency_us) * 1e-6
    rate = profile.link_efficiency * 1e9
    intra = alpha + nbytes * inside / ep / (profile.group_gbps(inside + 1) * rate)
    inter = nbytes * outside / ep / (profile.inter_node_gbps * rate) if outside else 0.0
    return intra, inter


def ulysses_exchange(work, c, micro_batch, nbytes, per_node, profile: DeviceProfile) -> float:
    """One pass of a layer's Ulysses all-to-alls on a device: its tokens' queries, keys and
    values to the ranks of its ulysses group (consecutive cp indices, tp ranks apart), then the
    attention's output back — a rank's share of each split over tp and cp."""
    seconds = 0.0
    for size in work.head_exchange_bytes(nbytes):
        intra, inter = all_to_all(
            micro_batch * size / (c.tp * c.cp), c.ulysses, per_node, profile, c.tp
        )
        seconds += intra + inter
    return seconds


def ring_hops(nbytes: float, hops: int, gbps: float, profile: DeviceProfile) -> float:
    """``hops`` point-to-point sends of ``nbytes`` each over one link."""
    if hops <= 0:
        return 0.0
    alpha = profile.collective_latency_us * 1e-6
    return hops * (alpha + nbytes / (gbps * 1e9 * profile.link_efficiency))


def expert_replicas(work, c, params_per_device: float) -> tuple[float, int]:
    """``(share of the heaviest stage's parameters that are routed experts, ranks holding the
    same experts)``: mcore's (dp·tp·cp / ep) — its experts are whole on every tp rank — or
    the legacy MoE's dp·cp / ep, whose experts split over tp. ``(0, 1)`` without ep-split
    experts; their gradients are all-reduced over those ranks only (`step_time`)."""
    if not work.top_k or params_per_device <= 0:
        return 0.0, 1
    stage_params = rank_params(work, c.tp, c.pp, c.ep)
    heaviest = max(range(c.pp), key=stage_params.__getitem__)
    experts = rank_expert_params(work, c.tp, c.pp, c.ep)[heaviest]
    holders = c.dp * c.cp * (1 if work.legacy_experts else c.tp) // c.ep
    return experts / stage_params[heaviest], max(1, holders)


def fp8_saving(work, profile: DeviceProfile, dtype: str, engine: str) -> float:
    """The share of a linear layer's GEMM time FP8 saves against ``dtype`` (0: not FP8)."""
    if not work.fp8_linear or engine == "trainer" or profile.peak_tflops_fp8 <= 0:
        return 0.0  # autotune's trainer computes in the compute dtype; so does a non-FP8 device
    return max(0.0, 1 - profile.peak(dtype) / (profile.peak_tflops_fp8 * 1e12))


def overlap(parts: dict, busy: float) -> None:
    """Hide the expert all-to-alls of ``parts`` (one micro-batch's) behind ``busy`` seconds of
    the stage's own computation, in place: what it cannot cover stays, split as it was."""
    comm = parts["ep_comm"] + parts["ep_comm_inter"]
    if comm <= 0:
        return
    left = max(0.0, comm - busy - parts["experts"] - parts["mla"] - parts["imbalance"]) / comm
    parts["ep_comm"] *= left
    parts["ep_comm_inter"] *= left


def node_limited(copy: float, work, ep: int, per_node: int, profile: DeviceProfile) -> tuple:
    """``(seconds inside the node beyond the IB time, seconds across nodes)`` of one dispatch
    (or combine) of a token's ``copy`` bytes to its k experts when they may be on
    ``work.node_limit`` of the ep group's nodes and the token crosses to each once, then is
    forwarded inside it while IB still delivers (module doc)."""
    nodes = ep // per_node
    reach = min(work.node_limit, nodes)
    k = work.top_k
    distinct = reach * (1 - (1 - 1 / reach) ** k)  # nodes k experts land on, of ``reach``
    rate = profile.link_efficiency * 1e9
    inter = copy * distinct * (nodes - 1) / nodes / (profile.inter_node_gbps * rate)
    forwarded = copy * k * (per_node - 1) / per_node  # to the experts' devices of each node
    intra = profile.collective_latency_us * 1e-6 + forwarded / (profile.group_gbps(per_node) * rate)
    return max(0.0, intra - inter), inter  # the forwarding runs while IB delivers


def moe_parts(
    work, c, profile, per_node, micro_batch, nbytes, stage, kernels, tp_allreduce, fp8=False
):
    """The :data:`MOE_PARTS` and the added ``tp_comm`` of one micro-batch on a device of
    ``stage`` (see the module doc); ``kernels(flops, traffic, linear)`` prices work per sample
    as the stage's other kernels are, ``tp_allreduce(nbytes)`` an all-reduce over its tp group;
    ``fp8``: the linear layers run in FP8."""
    modes = work.stage_modes(c.recompute, c.pp, stage)
    layers = sum(n for _, n in modes)
    full = sum(n for (mode, _), n in modes if mode == "full") / max(1, layers)
    last = stage == c.pp - 1
    parts = work.part_flops()
    routed = layers * work.routed_flops()
    padded = routed * (work.capacity - 1) if work.capacity > 1 else 0.0
    out = dict.fromkeys((*MOE_PARTS, "tp_comm"), 0.0)
    experts = layers * parts.get("experts", 0.0) + padded
    out["experts"] = kernels(experts, 0.0, experts - layers * work.router_flops())
    if c.ep > 1 and not work.capacity and not work.gathered_experts:
        out["imbalance"] = kernels(routed, 0.0, routed) * (ROUTER_IMBALANCE - 1)
    out["mla"] = kernels(layers * parts.get("mla", 0.0), 0.0, layers * parts.get("mla", 0.0))
    if last:
        out["mtp"] = kernels(work.mtp_flops(), 0.0, work.mtp_flops(linear=True))
    moe_layers = work.stage_moe_layers(c.pp, stage)
    # legacy MoE without sequence parallelism: every tp rank holds its dp share's tokens whole
    whole = work.legacy_experts and not work.sequence_parallel
    buffer = micro_batch * work.dispatch_bytes(nbytes) / (c.cp if whole else c.tp * c.cp)
    if moe_layers and c.ep > 1 and work.gathered_experts:
        # autotune's trainer: each dispatch and combine an all-reduce of the group's rows, ep
        # blocks of the rank's tokens (split over tp) — forward, backward, a full recompute's
        rows = c.ep * micro_batch * work.hidden_state_bytes(nbytes) / (c.tp * c.cp)
        _, outside = ep_peers(c.ep, per_node)
        gbps = profile.inter_node_gbps if outside else profile.group_gbps(c.ep)
        part = "ep_comm_inter" if outside else "ep_comm"
        out[part] = moe_layers * (4 + 2 * full) * allreduce_time(rows, c.ep, gbps, profile)
    elif moe_layers and c.ep > 1:
        stride = c.tp if work.legacy_experts else 1
        moved = buffer * (FP8_MOVED / nbytes if fp8 and nbytes == 2 else 1.0)
        if work.node_limit and not work.legacy_experts and c.ep > per_node:
            intra, inter = node_limited(moved / work.top_k, work, c.ep, per_node, profile)
        else:
            intra, inter = all_to_all(moved, c.ep, per_node, profile, stride)
        count = moe_layers * (4 + 2 * full)
        out["ep_comm"], out["ep_comm_inter"] = count * intra, count * inter
    if moe_layers and whole and c.tp > 1:
        out["tp_comm"] = moe_layers * (2 + full) * tp_allreduce(buffer)
    if c.cp > 1:
        share = micro_batch * work.kv_bytes(nbytes) / (c.tp * c.cp)
        crosses = c.tp * c.cp > per_node
        gbps = profile.inter_node_gbps if crosses else profile.group_gbps(2)
        passes = layers * (3 + full)  # forward, backward twice, a full recompute's forward
        ring = c.cp // c.ulysses  # the ranks that pass keys and values around
        out["cp_comm"] = passes * ring_hops(share, ring - 1, gbps, profile)
        if c.ulysses > 1:
            out["cp_comm"] += (
                layers
                * (2 + full)
                * ulysses_exchange(work, c, micro_batch, nbytes, per_node, profile)
            )
    return out
