"""The device side of a trial's launch: the order of MindSpore's first calls, the device memory
cap, and what a device holds at its peak.

Contract:

- :func:`launch_step` prints one line per launch call on stderr, ``autotune.train launch: <call>``
  (`LAUNCH_STEP`), before making it: a worker's log shows the order its role made them in.
- :func:`serve_cluster` is all that msrun's scheduler role (``MS_ROLE=MS_SCHED``) runs: device
  target CPU, then ``communication.init()``, which serves the cluster; it never opens the trial's
  device (on GPU a context and a memory pool on the first device, the one rank 0 gets).
- :func:`memory_cap` is the ``max_size`` a GPU/Ascend trial passes to
  ``mindspore.runtime.set_memory`` before ``communication.init()`` (None on CPU, or when the
  config names no device memory); :func:`reported_memory_warning` compares the size the device
  reports with the profile's.
- :func:`device_peak_mb` is the memory a device held at its peak: the pool's reserved peak
  (``max_memory_reserved``: every block the pool took from the device, used or not) and, where the
  vendor tool exists, its per-process reading (`autotune.train.device_smi`), the larger of the two.

docs/accelerators.md says where MindSpore 2.10's source states each of these.
"""

from __future__ import annotations

import sys

from autotune.train import device_smi

LAUNCH_STEP = "autotune.train launch:"
# The device memory a config names (``config["device_memory"]``): ``size_gb`` the profile's
# memory, ``max_size_gb`` the cap (size × the cost model's safety margin).
DEVICE_MEMORY = "device_memory"
# A reported size further than this from the profile's is worth a warning (GiB vs GB, a device's
# own reservations are smaller than this).
REPORTED_TOLERANCE = 0.1


def launch_step(call: str) -> None:
    """Say on stderr that this process is about to make ``call``."""
    print(f"{LAUNCH_STEP} {call}", file=sys.stderr, flush=True)


def serve_cluster() -> int:
    """msrun's scheduler role: serve the cluster without touching the trial's device.

    MindSpore's ``init()`` gives the scheduler role the host's collective library ("mccl")
    whatever the device target, and ``set_device`` itself swaps ``Ascend`` for ``CPU`` in this
    role (``_need_reset_device_target_for_ps``) — but not ``GPU``. The process ends inside
    ``init()`` when the job does (measured on CPU: docs/accelerators.md); 0 if it returns.
    """
    import mindspore as ms

    launch_step("set_device(CPU)")
    ms.set_device("CPU")
    launch_step("communication.init()")
    ms.communication.init()
    return 0


def memory_cap(cfg: dict, device_target: str) -> str | None:
    """``set_memory``'s ``max_size`` for this trial ("57.6GB"), None on CPU or without a size."""
    section = cfg.get(DEVICE_MEMORY) or {}
    if device_target == "CPU" or not section.get("max_size_gb"):
        return None
    return f"{float(section['max_size_gb']):.2f}GB".replace(".00GB", "GB")


def reported_memory_warning(cfg: dict, total_bytes: int | None) -> str | None:
    """A warning line when the device reports a total memory other than the profile's size
    (``cluster.device_memory_gb`` or the profile's), else None."""
    expected = (cfg.get(DEVICE_MEMORY) or {}).get("size_gb")
    if not expected or not total_bytes:
        return None
    reported = total_bytes / 2**30
    if abs(reported - expected) <= REPORTED_TOLERANCE * expected:
        return None
    return (f"autotune.train warning: the device reports {reported:.1f} GiB, the profile says "
            f"{expected:g} GiB (cluster.device_memory_gb / cluster.device): the memory screen "
            f"and the {cfg[DEVICE_MEMORY]['max_size_gb']:g} GB cap are computed from the profile")


def device_total_bytes(ms) -> int | None:
    """The total memory of this process's device as MindSpore reports it (after init), or None."""
    try:
        device_id = ms.get_current_device().device_id
        return int(ms.hal.get_device_properties(device_id).total_memory)
    except Exception:  # noqa: BLE001  (a report, never a reason to fail the trial)
        return None


def reset_device_peak(ms) -> None:
    """Restart the pool's peak statistics (allocated and reserved)."""
    ms.runtime.reset_max_memory_allocated()
    ms.runtime.reset_max_memory_reserved()


def device_peak_mb(ms, device_target: str, pid: int) -> dict:
    """This rank's device memory at its peak, MiB: ``reserved`` (the pool's peak),
    ``allocated`` (tensor bytes, for the record), ``smi`` (the vendor tool's reading for ``pid``
    now, None without the tool) and ``peak`` = the larger of reserved and smi."""
    reserved = ms.runtime.max_memory_reserved() / 2**20
    allocated = ms.runtime.max_memory_allocated() / 2**20
    smi = device_smi.process_memory_mb(device_target, pid)
    return {"reserved": reserved, "allocated": allocated, "smi": smi,
            "peak": max(reserved, smi or 0.0)}
