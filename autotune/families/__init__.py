"""Built-in model families: one MindSpore-free module each, and the registry that names them.

Contract: :data:`FAMILIES` maps ``model.family`` names to their
:class:`~autotune.families.base.Family` — shapes, tensor-parallel rules, the cost model's
workload, model.yaml fields, what the parallel optimizer leaves whole, the MindFormers
architectures it stands for; :func:`family` looks one up, :func:`parameter_shapes` lays out a
``model`` section's parameters. Adding a family is a module here, a line below, and its network
registered by name in `autotune.train.models` (docs/architecture.md, "A model family"). Also
here: which layers a stage runs and how each is recomputed (`layers`), the per-sample workload
base the cost model prices (`workload`). Imports nothing of autotune above it.
"""

from autotune.families import llama, mlp, transformer
from autotune.families.base import (
    FAMILIES,
    Family,
    family,
    owners,
    parameter_shapes,
    register,
    takes_tokens,
)

for _module in (transformer, mlp, llama):
    register(_module.FAMILY)

__all__ = ["FAMILIES", "Family", "family", "owners", "parameter_shapes", "register", "takes_tokens"]
