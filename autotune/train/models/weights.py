"""Layout-independent initial weights, and a digest of weights.

Contract: :func:`initialize` gives every parameter of a built-in network the value it would have
in the whole model built from the same seed, whatever the layout: each parameter's full tensor is
drawn from its own stream (seed, name) — one tensor at a time — and the rank keeps its block
(`autotune.layout.ParamLayout.local_slice`). So every layout of a model starts from the same
weights and, fed the same data, computes the same losses: what makes a layout testable. It also
checks that the network holds exactly the parameters the layout gives this rank, with the local
shapes the layout promises, and raises RuntimeError otherwise.

Distributions (MindSpore's own defaults for these layers): Dense weight and bias
U(±1/√fan_in), fan_in the full weight's input width (its last dimension, stacked experts'
too); embedding tables N(0, 0.01); norm gains 1
(LayerNorm's ``gamma``, RMSNorm's ``…norm.weight`` / ``norm_out.weight``), shifts 0.
"""

from __future__ import annotations

import hashlib
import zlib

import mindspore as ms
import numpy as np

from autotune import layout


def _stream(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def full_value(name: str, shape: tuple, shapes: dict, seed: int) -> np.ndarray:
    """The initial value of parameter ``name`` of the whole model (``shapes``: all full shapes)."""
    rng = _stream(seed, name)
    if name.endswith((".gamma", "norm.weight", "norm_out.weight")):
        return np.ones(shape, np.float32)
    if name.endswith(".beta"):
        return np.zeros(shape, np.float32)
    if name.endswith(("embedding_table", "embedding_weight")):
        return (0.01 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    weight = name[: -len("bias")] + "weight" if name.endswith(".bias") else name
    bound = 1.0 / np.sqrt(shapes[weight][-1])  # fan_in: the input width (stacked experts too)
    return (bound * (2.0 * rng.random(shape, dtype=np.float32) - 1.0)).astype(np.float32)


def initialize(network, model_cfg: dict, placement, seed: int) -> None:
    """Fill ``network`` (one rank of a built-in family) with its blocks of the whole model's
    initial weights (see the module doc)."""
    place = placement
    layouts, reasons = layout.builtin_layout(model_cfg, place.tp, place.pp, place.ep)
    if reasons:
        raise RuntimeError("; ".join(reasons))
    shapes = {name: p.shape for name, p in layouts.items()}
    expected = {name for name, p in layouts.items() if p.stage == placement.stage}
    held = {param.name: param for param in network.get_parameters()}
    if set(held) != expected:
        raise RuntimeError(
            f"stage {placement.stage} holds {sorted(set(held) - expected)[:3]} "
            f"it should not and lacks {sorted(expected - set(held))[:3]}"
        )
    for name, param in held.items():
        p = layouts[name]
        local = p.local_shape(place.tp, place.ep)
        if tuple(param.shape) != local:
            raise RuntimeError(
                f"{name}: holds {tuple(param.shape)}, the layout says {local} of {p.shape}"
            )
        full = full_value(name, p.shape, shapes, seed)
        block = p.local_slice(place.tp_index, place.tp, place.ep_index, place.ep)
        param.set_data(ms.Tensor(np.ascontiguousarray(full[block])))
        del full


def digest(network) -> str:
    """sha256 over the parameters' names and bytes (bit-identical weights ⇔ equal digests)."""
    h = hashlib.sha256()
    for name, param in network.parameters_and_names():
        h.update(name.encode())
        h.update(np.ascontiguousarray(param.asnumpy()).tobytes())
    return h.hexdigest()
