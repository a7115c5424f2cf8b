"""A trial's memory on a device, as numbers: no MindSpore, so that what reads a MindFormers
trial's recorder (`autotune.mindformers`) computes it as autotune's trainer does.

Contract:

- :func:`memory_settings` are the arguments an accelerator's trial passes to
  ``mindspore.runtime.set_memory`` before ``communication.init()``: ``max_size`` from the config's
  ``device_memory`` section and the backend's ``increase_size`` (None on CPU, or when the config
  names no device memory); the size string is MindFormers' ``context.max_device_memory`` too.
- :func:`trial_peak_mb` is the one formula of a trial's memory on a device — its tensors'
  allocated peak plus :func:`overhead_mb`, what the device holds for the process outside
  MindSpore's pool (the vendor tool's reading less the pool's reserved size at that moment) —
  for autotune's trainer (`autotune.train.runtime.device.DeviceMemory`) and a MindFormers trial
  (`autotune.mindformers.results`) alike.
"""

from __future__ import annotations

# The device memory a config names (``config["device_memory"]``): ``size_gb`` the profile's
# memory, ``max_size_gb`` the cap (`autotune.costmodel.device_memory_cap`: the screen's budget).
DEVICE_MEMORY = "device_memory"


def memory_settings(cfg: dict, backend) -> dict | None:
    """``set_memory``'s arguments for this trial (``max_size`` "57.6GB", the backend's
    ``increase_size``), None off the accelerators or without a size."""
    section = cfg.get(DEVICE_MEMORY) or {}
    if not backend.accelerator or not section.get("max_size_gb"):
        return None
    settings = {"max_size": f"{float(section['max_size_gb']):.2f}GB".replace(".00GB", "GB")}
    if backend.pool_increase:
        settings["increase_size"] = backend.pool_increase
    return settings


def overhead_mb(smi_mb: float | None, reserved_mb: float) -> float:
    """What the device holds for a process outside MindSpore's pool, MiB: the vendor tool's
    reading less the pool's reserved size at the same moment; 0 where the tool did not see the
    process (``smi_mb`` None)."""
    return max(0.0, smi_mb - reserved_mb) if smi_mb is not None else 0.0


def trial_peak_mb(allocated_mb: float, overhead: float) -> float:
    """A trial's memory on a device, MiB: its tensors at their peak plus the overhead — the one
    formula of autotune's trainer (`autotune.train.runtime.device.DeviceMemory`) and a
    MindFormers trial's recorder (`autotune.mindformers.results`)."""
    return allocated_mb + overhead
