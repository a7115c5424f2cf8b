"""The networks of the built-in model families, registered by family name
(`autotune.train.models.registry.NETWORKS`): ``transformer`` (GPT-style decoder), ``mlp``, and
``llama`` (MindFormers' legacy LLaMA, `autotune.train.models.llama`).

A network is built for one rank of a layout (`autotune.train.parallel.groups.Placement`; by default the
whole model on one rank): the layers of its pipeline stage, each holding its tensor-parallel
block. Parameter names are the whole model's (``blocks.2.attn.qkv.weight`` on the stage that runs
layer 2), with the full shapes of their `autotune.families` entry, split as `autotune.layout` says (a test
checks every rank of every layout against it). Both families implement
``apply_recompute(mode)`` for the ``recompute`` knob.

- transformer: token ids (batch, seq) → logits (batch, seq, vocab / tp). Token + position
  embedding (first stage), pre-LayerNorm blocks (causal multi-head attention with a fused QKV
  projection, MLP h→ffn→h with GELU), final LayerNorm and untied LM head (last stage). A middle
  or last stage maps the hidden state (batch, seq, h) instead of ids, a non-last stage returns it.
  The fused QKV weight is head-major: its rows are (heads, [q, k, v], head_dim), so tp rank t's
  contiguous block is heads [t·heads/tp, (t+1)·heads/tp) with their own Q, K and V.
- mlp: features (batch, hidden) → logits (batch, classes / tp). Input Dense h→h (first stage),
  residual blocks (LayerNorm, Dense h→ffn, GELU, Dense ffn→h), head Dense h→classes (last stage).

Recompute modes: ``full`` recomputes every block; ``selective`` only the activation-heavy part:
the attention core (scores, mask, softmax, ·V — the (seq × seq) tensors, as Megatron-LM's
selective recompute) for the transformer, the GELU for the mlp.
"""

from autotune.train.models import llama, mlp, transformer  # noqa: F401  (each registers its network)
from autotune.train.models.registry import NETWORKS, SINGLE, build_network, network

__all__ = ["NETWORKS", "SINGLE", "build_network", "network"]
