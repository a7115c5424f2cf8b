"""Megatron-FSDP (``--use-megatron-fsdp`` with its default ``--data-parallel-sharding-strategy
optim_grads_params``: ZeRO-3), as the cost model prices it.

Contract: :func:`applies` says whether a candidate runs it — the model states it
(``model.fsdp``), the engine is ``"megatron"`` (no other engine runs it: the estimate's "not
modelled" says so) and dp > 1. Megatron-FSDP runs on the distributed optimizer (its v1 turns
``--use-distributed-optimizer`` on), so the optimizer states are sharded as the
``parallel_optimizer`` knob shards them under Megatron, whatever the knob says. Then, as
Megatron-LM's docs/user-guide/features/megatron_fsdp.md describes the strategy:

- memory (:func:`stage_memory`): a device keeps its shard of every parameter and of its
  gradient as well as of the optimizer states — the distributed optimizer's shard
  (`autotune.costmodel.memory.distributed_elements`: each local slice split evenly over the
  ranks holding it, the dp group or a routed expert's expert-data-parallel ranks) — and two FSDP
  units' parameters and gradients un-sharded ("at least two FSDP units worth of un-sharded
  weight memory", the same for gradients; its double buffering), a unit being a transformer
  layer, priced at the stage's mean layer;
- time (:func:`exposed`): in each micro-batch every unit's
  parameters are all-gathered for its forward and again for its backward, and its gradients
  reduce-scattered after its backward ("accumulated during every backward pass"), each over the
  ranks holding the same slice, in the 16-bit dtype — three all-gathers' time ((n − 1)/n · S / B
  each: a reduce-scatter moves what an all-gather does); prefetched and overlapped with the
  micro-batch's kernels, so only what outlasts them is exposed (``dp_comm``). The step's own
  gradient reduction is gone: the gradients are already reduced.
"""

from __future__ import annotations

# the kernels of a micro-batch its communication overlaps (`autotune.costmodel.step_time`'s parts)
KERNELS = ("compute", "recompute", "experts", "mla", "mtp")
UNITS_UNSHARDED = 2  # double buffering: two units' parameters (and gradients) whole
# a unit's parameters gathered for its forward and for its backward, its gradients scattered
TRANSFERS = 3


def applies(work, c, engine: str) -> bool:
    """Whether ``c`` runs Megatron-FSDP (see the module doc)."""
    return work.fsdp and engine == "megatron" and c.dp > 1


def stage_memory(parts: dict, local: float, owned: float, layers: int) -> dict:
    """``parts`` (GiB by part, a stage's under the distributed optimizer) with its parameters
    and gradients sharded too: ``local`` elements the stage's device holds unsharded, ``owned``
    its shard, ``layers`` the stage's layers."""
    unit = local / max(1, layers)
    scale = (owned + UNITS_UNSHARDED * unit) / local if local else 0.0
    return {
        **parts,
        "params": parts["params"] * scale,
        "grads": parts["grads"] * scale,
    }


def exposed(n_micro: int, groups: tuple, pace: dict, gather) -> float:
    """Seconds a step waits on FSDP's communication: per micro-batch, what its transfers
    outlast of the micro-batch's kernels (``pace``: its seconds by part). ``groups``: (bytes of
    a device's 16-bit parameters, ranks holding the same slices, their link's GB/s) for the
    dense parameters and the routed experts; ``gather(bytes, ranks, gbps)``: an all-gather's
    seconds."""
    comm = sum(
        gather(TRANSFERS * nbytes, ranks, gbps) for nbytes, ranks, gbps in groups if nbytes > 0
    )
    busy = sum(pace.get(part, 0.0) for part in KERNELS)
    return n_micro * max(0.0, comm - busy)
