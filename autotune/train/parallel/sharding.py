"""The parallel optimizer as the trial program runs it: each rank updates only its shard of a
parameter, then the shards are gathered back into the parameter every rank computes with.

Which parameters are sharded, over which ranks and along which rows is `autotune.layout`'s
definition (MindSpore's parallel optimizer at its default level; ``ParamLayout.opt_shard``). Per
step, after the dp gradient reduction, unscaling and the overflow verdict (`autotune.train.step.train_step`):

1. every sharded gradient is cut to this rank's rows;
2. the optimizer (its moments allocated for the shards only) updates the shard parameters
   ``shard.<name>``; an unsharded parameter is updated whole, as without the parallel optimizer;
3. each sharded parameter is rebuilt from its shards: every rank writes its updated shard into
   zeros of the parameter's shape and one all-reduce (sum) over the ranks that share it puts the
   whole parameter on each. The CPU backend has AllGather on the world group only and no
   ReduceScatter (docs/mindspore-cpu.md), so the gather is an all-reduce on every backend and the
   gradients keep the dp all-reduce: the trial's traffic is the unsharded traffic plus one
   all-reduce of the sharded parameters, which the cost model prices as such.

The update is element-wise, so it equals the unsharded update exactly; the memory saved is the
moments of the rows a rank does not own, less the shard copies themselves.

Contract: :func:`plan` returns a :class:`Sharding` for a rank (None when nothing is sharded);
``update_params`` is what the optimizer is built over; ``cut(grads)`` and ``gather(token)`` are
graph functions for the step cells; ``refresh_shards()`` re-cuts the shards from the parameters
(after weights were loaded into them) and ``rebuild()`` runs the gather once (after the shards
were restored from a checkpoint).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.parameter import ParameterTuple

from autotune import layout
from autotune.train.checkpoint import SHARD_PREFIX
from autotune.train.parallel.groups import Placement

_rows = ops.MultitypeFuncGraph("rows")


@_rows.register("Tensor", "Number", "Number")
def _cut_rows(grad, start, stop):
    if start < 0:  # not sharded: the whole gradient
        return grad
    return grad[start:stop]


def _rebuild_one(pad, all_reduce, whole, piece, token):
    """One sharded parameter rebuilt from its shards once ``token`` is done (step 3 of the
    module doc)."""
    piece = ops.depend(piece, token)
    return ops.assign(whole, all_reduce(pad(piece)))


class _Host:
    """What the host-side methods need, kept out of the Cell's attributes (a Cell would
    register the parameters it holds)."""

    def __init__(self):
        self.update_params = []
        self.shards = []  # (weight, shard parameter, rows)


class Sharding(nn.Cell):
    """This rank's part of the parallel optimizer (see the module doc)."""

    def __init__(self, weights, layouts: dict, placement: Placement, groups: dict):
        super().__init__(auto_prefix=False)
        p = placement
        self.host = _Host()
        starts, stops, wholes, pieces, pads, reducers = [], [], [], [], [], []
        for weight in weights:
            lay = layouts[weight.name]
            if lay.opt_shard is None:
                self.host.update_params.append(weight)
                starts.append(-1)
                stops.append(-1)
                continue
            rows = lay.shard_rows(p.tp, p.dp_index, p.tp_index, p.ep)
            shard = ms.Parameter(
                ms.Tensor(weight.asnumpy()[rows]), name=f"{SHARD_PREFIX}{weight.name}"
            )
            self.host.update_params.append(shard)
            self.host.shards.append((weight, shard, rows))
            starts.append(rows.start)
            stops.append(rows.stop)
            wholes.append(weight)
            pieces.append(shard)
            pads.append(
                ops.Pad(
                    ((rows.start, weight.shape[0] - rows.stop),)
                    + ((0, 0),) * (len(weight.shape) - 1)
                )
            )
            if lay.ep_split:  # the ranks that hold the same experts
                group = groups["experts"]
            else:
                group = groups["dp"] if lay.shared_by_dp_group(p.tp) else groups["stage"]
            reducers.append(ops.AllReduce(group=group) if group else ops.AllReduce())
        self.starts, self.stops = tuple(starts), tuple(stops)
        # tuples, not cells of their own: a cell container would rename the parameters it holds
        self.wholes, self.pieces = ParameterTuple(wholes), ParameterTuple(pieces)
        self.pads, self.reducers = tuple(pads), tuple(reducers)
        self.hyper_map = ops.HyperMap()

    @property
    def update_params(self) -> list:
        """What the optimizer updates, in the weights' order: a shard or the whole weight."""
        return self.host.update_params

    def cut(self, grads):
        """The gradients of ``update_params`` from those of the weights (graph function)."""
        return self.hyper_map(_rows, grads, self.starts, self.stops)

    def gather(self, token):
        """Rebuild every sharded weight once ``token`` (the optimizer's update) is done, one
        after another, so one parameter's gather buffers are alive at a time (graph function)."""
        for i in range(len(self.pads)):
            token = ops.depend(
                token,
                _rebuild_one(self.pads[i], self.reducers[i], self.wholes[i], self.pieces[i], token),
            )
        return token

    def construct(self, token):
        return self.gather(token)

    def refresh_shards(self) -> None:
        for weight, shard, rows in self.host.shards:
            shard.set_data(ms.Tensor(weight.asnumpy()[rows]))

    def rebuild(self) -> None:
        self(ms.Tensor(np.zeros((), np.float32)))


def plan(weights, model: dict, placement: Placement, element_bytes: int) -> Sharding | None:
    """The parallel optimizer for this rank's ``weights`` (its stage's trainable parameters), or
    None when the layout leaves nothing to shard (dp = 1, every parameter under the threshold)."""
    p = placement
    if p.dp == 1:
        return None
    if model.get("entry"):
        shapes = {w.name: tuple(w.shape) for w in weights}  # tp = pp = 1: local shapes are full
        layouts, _ = layout.plan_layout(shapes, 1, 1, {})
    else:
        layouts, _ = layout.builtin_layout(model, p.tp, p.pp, p.ep)
    layouts = layout.with_optimizer_shards(
        layouts, p.dp, p.tp, element_bytes, whole=layout.optimizer_whole(model), ep=p.ep
    )
    if not any(layouts[w.name].opt_shard for w in weights):
        return None
    groups = {"dp": p.dp_group, "stage": p.stage_group, "experts": p.expert_group}
    return Sharding(weights, layouts, p, groups)
