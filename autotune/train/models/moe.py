"""The llama family's mixture-of-experts feed-forward, for one rank of a (dp, tp, pp, ep) layout.

Parameters are those `autotune.families.moe.moe_shapes` names: a router ``router.weight`` (E, h),
the routed experts stacked on dim 0 (``experts.w1/w3`` (E, f, h), ``experts.w2`` (E, h, f): each a
SwiGLU ``w2(silu(w1·x) · w3·x)``), and the shared experts as one dense SwiGLU ``shared.w1/w2/w3``
(tp-split as the dense feed-forward).

Routing (deterministic): router logits in float32, a softmax over the E experts, the top
``experts_per_token`` of each token, their probabilities renormalised to sum to 1 — Qwen3-MoE's
``norm_topk_prob`` and Mixtral's softmax over the top-k logits, which are the same weights.
(DeepSeek-V3's sigmoid scores and its routed scaling factor are no model.yaml option: its
parameters are the same.) Dropless: every token reaches its k experts; the output is
``Σ_e gate[t, e] · expert_e(x_t) + shared(x_t)``.

How the experts run: each rank holds experts [i·E/ep, (i+1)·E/ep) of its ep group (ep index i,
`autotune.layout.ep_coords`). Megatron-LM's all-gather token dispatcher: the group's tokens and
gate weights are gathered (`autotune.train.parallel.experts.GatherRows`), each rank runs its
experts over them, and each token's partial outputs are summed back to the rank it came from
(``ReduceRows``). Under tensor parallelism the tokens are first split over the tp group and
joined after (sequence parallelism around the experts), so no token is routed twice; the
router's weight then sees a block of the tokens on each tp rank, and its gradient is summed over
the tp group. Graph mode compiles static shapes, so a local expert computes every gathered token
and the tokens not routed to it are weighted 0 — exact, at E/k times the routed experts' FLOPs
(the cost model prices the routed ones).

The router's load: each forward adds, per expert, how many top-k slots of this rank's tokens
chose it to ``counter.load`` (float32 (E,), held outside the cell's parameters so that weights,
checkpoints and strategy files never see it); the engine reads and clears it after every step
(`autotune.train.step.engine.Engine.take_router_load`) for the trial's ``router_imbalance``
(`autotune.train.metrics.router_imbalance`). Under tensor parallelism a rank counts its block
of the split tokens, so the counts summed over the ranks are the group's tokens counted once,
as one process counts them. That assign is the network's one side effect, and it is what made
tp > 1 train wrong before `autotune.train.parallel.groups.CopyToGroup` copied its input: with a
side effect anywhere in the differentiated graph, MindSpore 2.10 chained the shared experts'
second copy of x (w3's) onto the first's (w1's) output when the copy returned its input node,
and x's gradient summed w3's part over the tp group twice (measured: tp2 losses left one
process's from the second step, 4.1126 against 4.0137).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import initializer
from mindspore.ops.operations._inner_ops import SiLU

from autotune.train.parallel.experts import GatherRows, JoinTokens, ReduceRows, SplitTokens
from autotune.train.parallel.groups import CopyToGroup, Placement

_bmm_nt = ops.BatchMatMul(transpose_b=True)


class Weight(nn.Cell):
    """A cell holding one parameter named ``weight`` (MindFormers' names: ``experts.w1.weight``)."""

    def __init__(self, *shape):
        super().__init__()
        self.weight = ms.Parameter(initializer("zeros", shape, ms.float32))


class Experts(nn.Cell):
    """This rank's E/ep experts, stacked: (N, h) tokens and (N, E/ep) gates → Σ_e gate · expert_e."""

    def __init__(self, local: int, hidden: int, width: int):
        super().__init__()
        self.w1 = Weight(local, width, hidden)  # gate
        self.w2 = Weight(local, hidden, width)  # down
        self.w3 = Weight(local, width, hidden)  # up
        self.silu, self.mul = SiLU(), ops.Mul()
        self.local = local

    def construct(self, tokens, gates):
        x = ops.broadcast_to(tokens.expand_dims(0), (self.local,) + tokens.shape)
        dtype = tokens.dtype
        gate = self.silu(_bmm_nt(x, ops.cast(self.w1.weight, dtype)))
        hidden = self.mul(gate, _bmm_nt(x, ops.cast(self.w3.weight, dtype)))
        out = _bmm_nt(hidden, ops.cast(self.w2.weight, dtype))  # (E/ep, N, h)
        weights = ops.cast(gates.transpose(1, 0).expand_dims(-1), dtype)
        return (out * weights).sum(axis=0)


class Router(nn.Cell):
    """Top-k softmax routing (see the module doc): (T, h) → gates (T, E), the chosen experts'
    renormalised probabilities, 0 elsewhere; adds the choices to ``load``."""

    def __init__(self, experts: int, hidden: int, top_k: int, p: Placement):
        super().__init__()
        self.weight = ms.Parameter(initializer("zeros", (experts, hidden), ms.float32))
        self.copy = CopyToGroup(p.tp_group) if p.tp > 1 else None  # tokens split over tp
        self.experts, self.top_k = experts, top_k
        self.softmax = ops.Softmax(axis=-1)
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, tokens):
        weight = self.weight if self.copy is None else self.copy(self.weight)
        probs = self.softmax(self.matmul(ops.cast(tokens, ms.float32), weight))
        top, chosen = ops.topk(probs, self.top_k)
        top = top / top.sum(axis=-1, keepdims=True)
        one_hot = ops.one_hot(
            chosen, self.experts, ops.ones((), ms.float32), ops.zeros((), ms.float32)
        )
        gates = (one_hot * top.expand_dims(-1)).sum(axis=1)
        return gates, ops.stop_gradient(one_hot.sum(axis=(0, 1)))


class _Counter:
    """Not a cell: its parameter is no parameter of the network (see the module doc)."""

    def __init__(self, experts: int, layer: int):
        self.load = ms.Parameter(
            ms.Tensor(np.zeros(experts, np.float32)),
            name=f"router_load.{layer}",
            requires_grad=False,
        )


class MoEFeedForward(nn.Cell):
    """The routed experts and the shared ones of MoE layer ``index`` (see the module doc)."""

    def __init__(self, cfg: dict, p: Placement, shared_ffn, index: int):
        super().__init__()
        self.index = index
        experts, hidden = cfg["num_experts"], cfg["hidden_size"]
        self.counter = _Counter(experts, index)
        self.router = Router(experts, hidden, cfg["experts_per_token"], p)
        local = experts // p.ep
        self.experts = Experts(local, hidden, cfg["moe_ffn_hidden_size"])
        self.first = p.ep_index * local
        self.local = local
        shared = cfg.get("shared_ffn_hidden_size")
        if shared:
            self.shared = shared_ffn(hidden, shared, p)
        self.has_shared = bool(shared)
        self.split = self.join = self.gather = self.combine = None
        if p.tp > 1:
            self.split = SplitTokens(p.tp_group, p.tp, p.tp_index)
            self.join = JoinTokens(p.tp_group, p.tp, p.tp_index)
        if p.ep > 1:
            self.gather = GatherRows(p.ep_group, p.ep, p.ep_index)
            self.gather_gates = GatherRows(p.ep_group, p.ep, p.ep_index)
            self.combine = ReduceRows(p.ep_group, p.ep, p.ep_index)

    def construct(self, x):
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        if self.split is not None:
            tokens = self.split(tokens)
        gates, chosen = self.router(tokens)
        gates = ops.depend(gates, ops.assign_add(self.counter.load, chosen))
        if self.gather is not None:
            routed = self.gather(tokens).reshape(-1, shape[-1])
            gates = self.gather_gates(gates).reshape(-1, gates.shape[-1])
            out = self.experts(routed, gates[:, self.first : self.first + self.local])
            out = self.combine(out.reshape((-1,) + tokens.shape))
        else:
            out = self.experts(tokens, gates)
        if self.join is not None:
            out = self.join(out)
        y = out.reshape(shape)
        if self.has_shared:
            y = y + ops.cast(self.shared(x), y.dtype)
        return y

    def select_recompute(self):
        """MindFormers' selective recompute patterns, on the experts' SiLU and product."""
        self.experts.silu.recompute()
        self.experts.mul.recompute()
        if self.has_shared:
            self.shared.mul.recompute()
            self.shared.w1.activation.silu.recompute()
