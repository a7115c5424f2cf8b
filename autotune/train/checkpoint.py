"""Per-rank checkpoints of a run: what is saved, where, and how a run starts from one.

Layout on disk: ``<dir>/rank_<r>/step_<8-digit step>.ckpt`` (MindSpore's ``save_checkpoint``
format), the latest being the last in lexicographic order — the same rule
``mindspore.parallel.transform_checkpoints`` applies, so a run's checkpoint folder can be handed
to it as is. A file is written under a temporary name and renamed, so a crash never leaves half a
checkpoint that looks complete.

A checkpoint holds this rank's slice of every parameter of its stage (whole-model names), the
optimizer's moments of each (``adam_m.<name>``, ``adam_v.<name>``, sliced like the parameter —
the export's ``strategy.ckpt`` lays them out; under the parallel optimizer a sharded parameter
and its moments hold this rank's shard of that slice), and, whole on every rank, the optimizer's
``global_step``, the loss scale and its updater's counters, and ``step``: the steps completed.
Gradient accumulators are zero between steps and are not saved.

Contract: :func:`state_tensors` names what is saved; :func:`save`; :func:`latest`; :func:`restore`
loads the tensors it is given from a file that must hold them all: every state tensor when a run
resumes, only the network's parameters when a run starts from given weights
(``checkpoint/rank_<r>/`` of an export, e.g. resharded from a full checkpoint; the optimizer then
starts fresh at step 0). Mismatched names or shapes raise :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import mindspore as ms

from autotune.layout import OPTIMIZER_STATES

STEP = "step"
SHARD_PREFIX = (
    "shard."  # the parallel optimizer's shard parameters (autotune.train.parallel.sharding)
)


class CheckpointError(ValueError):
    """A checkpoint cannot be used for this run (an input error)."""


def rank_dir(folder, rank: int) -> Path:
    return Path(folder) / f"rank_{rank}"


def state_tensors(network, optimizer, state, step_counter) -> dict:
    """``{name: Parameter}`` of everything a checkpoint holds (see the module doc). Under the
    parallel optimizer a sharded parameter and its moments are saved as this rank's shard
    (`autotune.train.parallel.sharding`'s ``shard.<name>``) under the parameter's own names, as MindSpore
    saves them and as strategy.ckpt's ``opt_weight_shard_size`` describes."""
    tensors = {p.name: p for p in network.get_parameters()}
    for p in optimizer.get_parameters():
        # the moments strategy.ckpt lays out (one name rule: autotune.layout), and the step
        if (
            p.name.startswith(tuple(f"{prefix}." for prefix in OPTIMIZER_STATES))
            or p.name == "global_step"
        ):
            tensors[p.name.replace(f".{SHARD_PREFIX}", ".", 1)] = p
        elif p.name.startswith(SHARD_PREFIX):
            tensors[p.name[len(SHARD_PREFIX) :]] = p
    tensors["loss_scale"] = state.scale
    tensors["loss_scale.cur_iter"] = state.updater.cur_iter
    tensors["loss_scale.last_overflow_iter"] = state.updater.last_overflow_iter
    tensors[STEP] = step_counter
    return tensors


def save(folder, rank: int, step: int, tensors: dict) -> Path:
    """Write ``tensors`` as ``step_<step>.ckpt`` in this rank's folder; returns the file."""
    target = rank_dir(folder, rank)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"step_{step:08d}.ckpt"
    # beside the rank folders, not in one: a half-written file there would look like the latest
    tmp = Path(folder) / f".rank_{rank}.tmp{os.getpid()}.ckpt"
    ms.save_checkpoint([{"name": name, "data": p} for name, p in tensors.items()], str(tmp))
    os.replace(tmp, path)
    return path


def latest(folder, rank: int) -> Path | None:
    """The rank's newest checkpoint (last in lexicographic order), or None."""
    files = sorted(rank_dir(folder, rank).glob("*.ckpt"))
    return files[-1] if files else None


def restore(path: Path, tensors: dict) -> None:
    """Load every tensor of ``tensors`` from ``path`` (see the module doc)."""
    try:
        saved = ms.load_checkpoint(str(path))
    except Exception as exc:  # a corrupt or foreign file: the user's input
        raise CheckpointError(f"{path}: cannot load: {type(exc).__name__}: {exc}") from None
    missing = [n for n in tensors if n not in saved]
    if missing:
        raise CheckpointError(
            f"{path}: lacks {', '.join(missing[:4])}" + (" …" if len(missing) > 4 else "")
        )
    for name, param in tensors.items():
        value = saved[name]
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(value.shape)}, this rank holds "
                f"{tuple(param.shape)} (a checkpoint of another layout?)"
            )
        param.set_data(ms.Tensor(value.asnumpy().astype(ms.dtype_to_nptype(param.dtype))))
