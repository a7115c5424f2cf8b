"""The parallel engine's plumbing: where this rank sits in the layout, its process groups, and the
collective operators tensor and pipeline parallelism are built from.

Everything here is explicit collectives on named groups, so the same code runs on CPU, GPU and
Ascend (MindSpore's own operator and pipeline sharding, SEMI_AUTO_PARALLEL, refuses the CPU
backend). What the CPU backend offers, measured (docs/parallel.md): ``AllReduce`` (sum) on
any group, also inside Cells with a custom ``bprop``; ``AllGather`` on the world group only; no
``Send``/``Receive`` kernels. So:

- a gather over a sub-group is an all-reduce of zero-padded rows (:class:`GatherMax`);
- a point-to-point transfer is an all-reduce over the two ranks in which the receiver contributes
  zeros (:class:`Exchange`, :class:`ExchangePair`) — one path for every backend.

Contract: :class:`Placement` (pure) says what a rank runs; :func:`create_groups` creates the
MindSpore groups a placement names (call it after ``communication.init()``, on every rank);
:func:`world_sum` sums a few host numbers over the world.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from autotune import layout


def _group_name(kind: str, ranks: list[int]) -> str:
    return f"{kind}-" + "-".join(map(str, ranks))


def _ranks(name: str) -> list[int]:
    return [int(r) for r in name.split("-")[1:]]


def _expert_group(kind: str, ranks: list[int], world: int, known: tuple) -> str | None:
    """The group of ``ranks`` for expert parallelism: None for one rank or the world, the name
    of a ``known`` group of the same ranks (no second group of them), else a new name."""
    if len(ranks) in (1, world):
        return None
    same = [name for name in known if name and _ranks(name) == ranks]
    return same[0] if same else _group_name(kind, ranks)


@dataclass(frozen=True)
class Placement:
    """One rank of a (dp, tp, pp) layout: its coordinates and the groups it communicates in.

    A group name is None where no communication is needed (a group of one rank). ``dp_group``
    is None for pure data parallelism too: the world group is the dp group then; so are
    ``ep_group`` (the ``ep`` ranks that split the experts, `autotune.layout.ep_coords`) and
    ``expert_group`` (the ``expert_replicas`` ranks that hold the same experts) where they are
    the world. Expert parallelism's groups reuse the name of a tp, dp or stage group of the same
    ranks (with ep = 1 the experts' replicas are the stage's ranks: no new group).
    """

    rank: int
    dp: int
    tp: int
    pp: int
    stage: int
    dp_index: int
    tp_index: int
    tp_group: str | None
    dp_group: str | None
    prev_link: str | None  # pipeline link to the previous stage's rank
    next_link: str | None  # ... and to the next stage's
    # the stage's dp·tp ranks when they are neither the world, the dp group nor the tp group
    stage_group: str | None = None
    ep: int = 1
    ep_index: int = 0
    ep_group: str | None = None
    expert_group: str | None = None
    expert_replicas: int = 1

    @classmethod
    def of(cls, rank: int, dp: int, tp: int, pp: int, ep: int = 1) -> Placement:
        stage, dp_index, tp_index = layout.rank_coords(rank, dp, tp)
        prev_rank, next_rank = layout.pipeline_peers(rank, dp, tp, pp)
        tp_ranks, dp_ranks = layout.tp_group(rank, dp, tp), layout.dp_group(rank, dp, tp)
        stage_ranks = list(range(stage * dp * tp, (stage + 1) * dp * tp))
        placed = cls(
            rank,
            dp,
            tp,
            pp,
            stage,
            dp_index,
            tp_index,
            _group_name("tp", tp_ranks) if tp > 1 else None,
            _group_name("dp", dp_ranks) if dp > 1 and dp < dp * tp * pp else None,
            _group_name("pp", [prev_rank, rank]) if prev_rank is not None else None,
            _group_name("pp", [rank, next_rank]) if next_rank is not None else None,
            _group_name("stage", stage_ranks) if pp > 1 and dp > 1 and tp > 1 else None,
        )
        ep_index, ep_ranks, replicas = layout.ep_coords(rank, dp, tp, ep)
        known = (placed.tp_group, placed.dp_group, placed.stage_group)
        return replace(
            placed,
            ep=ep,
            ep_index=ep_index,
            ep_group=_expert_group("ep", ep_ranks, placed.world, known),
            expert_group=_expert_group("experts", replicas, placed.world, known),
            expert_replicas=len(replicas),
        )

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.pp - 1

    def groups(self) -> dict:
        """``{name: ranks}`` of every group this rank belongs to (besides the world)."""
        named = [
            self.tp_group,
            self.dp_group,
            self.prev_link,
            self.next_link,
            self.stage_group,
            self.ep_group,
            self.expert_group,
        ]
        return {name: _ranks(name) for name in named if name}


def create_groups(placement: Placement, made: set) -> None:
    """Create the groups ``placement`` names that are not in ``made`` (the names this process
    made before), adding them: a group's name is its ranks, so a later trial of another layout
    in the same process reuses the groups it shares."""
    from mindspore.communication import create_group

    for name, ranks in placement.groups().items():
        if name not in made:
            create_group(name, ranks)
            made.add(name)


def world_sum(values) -> np.ndarray:
    """Element-wise sum of ``values`` over all ranks, in float32 (the CPU AllReduce has no integer
    or float64 kernel): one eager AllReduce, 1–6 ms on CPU under msrun, where a one-op compiled
    cell pays its compile, 0.13–0.27 s, on every call (docs/mindspore-cpu.md, "The underflow
    probe and its bound")."""
    return ops.AllReduce()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()


class CopyToGroup(nn.Cell):
    """Megatron's *f*: identity forward; backward, the gradient is summed over the group (each
    rank's part of the graph contributed a partial gradient of the replicated input).

    The forward is MindSpore's ``Identity`` (a copy), not ``return x``: measured on MindSpore
    2.10, when the differentiated graph holds any side effect (an ``assign_add`` anywhere in it)
    and a tensor enters two of these cells (a feed-forward's w1 and w3 both copy x), a cell that
    returns its input node has the second copy chained onto the first's output, so the input's
    gradient became ``AllReduce(dx₁ + AllReduce(dx₃))`` instead of the sum of the two
    all-reduces: the tp ranks' shares of dx₃ counted twice."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)
        self.identity = ops.Identity()

    def construct(self, x):
        return self.identity(x)

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class ReduceFromGroup(nn.Cell):
    """Megatron's *g*: forward, the partial results are summed over the group; backward, the
    (replicated) gradient passes unchanged. MindSpore's AllReduce would all-reduce it again."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class GatherMax(nn.Cell):
    """Element-wise maximum of ``x`` over the group; no gradient flows back through it.

    Each rank writes ``x`` into its own row of zeros and the rows are summed over the group
    (a gather by all-reduce), then the maximum over the rows is taken.
    """

    def __init__(self, group: str, size: int, index: int):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)
        self.own_row = ms.Tensor(np.eye(size, dtype=np.float32)[index])
        self.size = size

    def construct(self, x):
        rows = self.own_row.reshape((self.size,) + (1,) * x.ndim).astype(x.dtype) * x.expand_dims(0)
        return self.all_reduce(rows).max(axis=0)

    def bprop(self, x, out, dout):
        return (ops.zeros_like(x),)


class Exchange(nn.Cell):
    """A point-to-point transfer between the two ranks of a pipeline link: the sender passes the
    tensor, the receiver zeros of its shape, and both get the sender's tensor back."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return self.all_reduce(x)


class ExchangePair(nn.Cell):
    """Both directions of a pipeline link in one transfer: the earlier stage passes
    ``(activation, zeros)``, the later one ``(zeros, gradient)``; both get ``(activation,
    gradient)``. 1F1B's steady phase sends one way while it receives the other."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, forward, backward):
        both = self.all_reduce(ops.stack((forward, backward)))
        return both[0], both[1]
