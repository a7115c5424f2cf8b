"""autotune's cost model: memory and step time of a candidate, without running it.

API (what the search loop and the CLI call):

- ``estimate(spec, candidate, calibration=None, engine=None) -> Estimate`` — the verdict
  on one candidate (feasible or why not, memory per device, step time, samples/s, TFLOP/s per
  device, MFU and a breakdown) as autotune's trainer runs it, or on the ``simulate`` backend as
  MindSpore runs the export (``engine`` overrides: ``"trainer"``, ``"mindspore"``,
  ``"megatron"``); ``Estimate.as_dict()`` is its strict-JSON form.
- ``format_estimate(estimate) -> str`` — the same as a readable table.
- ``device_memory_cap(cluster) -> dict | None`` — the memory-pool cap a GPU/Ascend trial sets.
- ``resolve_profile(cluster) -> DeviceProfile`` — the hardware numbers a cluster section means
  (``PROFILES`` lists the named ones).
- ``Calibration.from_pairs([(estimate, peak_memory_mb, step_time_ms), ...])`` — per-study
  multiplicative corrections from measured trials; ``as_dict()`` / ``from_dict()``.

Modules: ``workload`` (per-sample FLOPs, activations, messages of a model family), ``collectives``
(the α–β prices), ``moe_time`` (experts, MLA, MTP, ep and cp),
``profiles`` (devices), ``memory`` and ``timing`` (the physics), ``calibration``, ``estimate``.
"""

from autotune.costmodel.calibration import Calibration
from autotune.costmodel.estimate import (
    NOT_ESTIMATED,
    SAFETY_MARGIN,
    Estimate,
    device_memory_cap,
    estimate,
    format_estimate,
)
from autotune.costmodel.profiles import PROFILES, DeviceProfile, resolve_profile

__all__ = [
    "Calibration",
    "DeviceProfile",
    "Estimate",
    "NOT_ESTIMATED",
    "PROFILES",
    "SAFETY_MARGIN",
    "device_memory_cap",
    "estimate",
    "format_estimate",
    "resolve_profile",
]
