"""The device side of a trial's launch: the order of MindSpore's first calls, the device memory
pool's settings, the chip, and what a trial's memory on a device is.

Contract:

- :func:`launch_step` prints one line per launch call on stderr, ``autotune.train launch: <call>``
  (`LAUNCH_STEP`), before making it: a worker's log shows the order its role made them in.
- :func:`serve_cluster` is all that msrun's scheduler role (``MS_ROLE=MS_SCHED``) runs: device
  target CPU, then ``communication.init()``, which serves the cluster; it never opens the trial's
  device (on GPU a context and a memory pool on the first device, the one rank 0 gets).
- `autotune.train.runtime.device_memory.memory_settings` are the arguments an accelerator's
  trial passes to ``mindspore.runtime.set_memory`` before ``communication.init()``;
  :func:`reported_memory_warning` compares the size the device reports with the profile's;
  :func:`chip_refusal` says why a backend does not run on this chip.
- :class:`DeviceMemory` is what a trial's memory on a device is (the formula of
  `autotune.train.runtime.device_memory`, which a MindFormers trial's memory is read by too):
  the tensor bytes it allocated at its peak beyond what was allocated before it built anything,
  plus the session's *overhead* — what the device held outside MindSpore's pool (the vendor
  tool's reading less the pool's reserved size), measured once, at the session's first trial. Not the pool's reserved peak: on GPU
  ``runtime.empty_cache`` does nothing and a reset reserved peak restarts from the pool's size, so a
  small trial after a big one in a warm pool would read the big one's; on Ascend without virtual
  memory the pool takes its whole cap at start. The readings (reserved peak, the tool's with
  whether the process was visible to it, the overhead) are kept beside it.

docs/accelerators.md says where MindSpore 2.10's source states each of these.
"""

from __future__ import annotations

import sys

from autotune.train.runtime import device_smi
from autotune.train.runtime.device_memory import DEVICE_MEMORY, overhead_mb, trial_peak_mb

LAUNCH_STEP = "autotune.train launch:"
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


def chip_refusal(ms, backend) -> str | None:
    """Why ``backend`` does not run on this process's chip (MindSpore's ``ascend_soc_version``,
    read once the device is up), or None when it does."""
    if not backend.chips:
        return None
    chip = ms._c_expression.MSContext.get_instance().get_ascend_soc_version()
    if chip in backend.chips:
        return None
    return f"chip {chip or 'unknown'!r}: {backend.chip_refusal}"


def reported_memory_warning(cfg: dict, total_bytes: int | None) -> str | None:
    """A warning line when the device reports a total memory other than the profile's size
    (``cluster.device_memory_gb`` or the profile's), else None."""
    expected = (cfg.get(DEVICE_MEMORY) or {}).get("size_gb")
    if not expected or not total_bytes:
        return None
    reported = total_bytes / 2**30
    if abs(reported - expected) <= REPORTED_TOLERANCE * expected:
        return None
    return (
        f"autotune.train warning: the device reports {reported:.1f} GiB, the profile says "
        f"{expected:g} GiB (cluster.device_memory_gb / cluster.device): the memory screen "
        f"and the {cfg[DEVICE_MEMORY]['max_size_gb']:g} GB cap are computed from the profile"
    )


def device_total_bytes(ms) -> int | None:
    """The total memory of this process's device as MindSpore reports it (after init), or None."""
    try:
        device_id = ms.get_current_device().device_id
        return int(ms.hal.get_device_properties(device_id).total_memory)
    except Exception:  # noqa: BLE001  (a report, never a reason to fail the trial)
        return None


MIB = 2**20


class DeviceMemory:
    """One process's device memory across the trials of its session (see the module doc)."""

    def __init__(self, ms, backend, pid: int):
        self.ms, self.backend, self.pid = ms, backend, pid
        self.overhead_mb: float | None = None  # measured at the session's first trial
        self.overhead_seen = ""  # ... and whether the tool saw the process then
        self.base = 0  # bytes allocated before the trial built anything

    def trial_starts(self) -> None:
        """Before the trial builds its model: what earlier trials left allocated is not its."""
        self.base = self.ms.runtime.memory_allocated()

    def reset_peak(self) -> None:
        """Restart the pool's peak statistics (allocated and reserved)."""
        self.ms.runtime.reset_max_memory_allocated()
        self.ms.runtime.reset_max_memory_reserved()

    def peak(self) -> dict:
        """This rank's trial at its peak, MiB: ``peak`` = ``allocated`` (the trial's tensors at
        their peak) + ``overhead``; ``reserved`` (the pool's peak), ``smi`` and ``smi_seen`` (the
        vendor tool's reading now, `autotune.train.runtime.device_smi`) for the record."""
        runtime = self.ms.runtime
        allocated = max(0.0, (runtime.max_memory_allocated() - self.base) / MIB)
        reserved = runtime.max_memory_reserved() / MIB
        reading = device_smi.process_memory(self.backend, self.pid)
        if self.overhead_mb is None:
            outside = overhead_mb(reading.mb, runtime.memory_reserved() / MIB)
            self.overhead_mb, self.overhead_seen = outside, reading.seen
        return {
            "peak": trial_peak_mb(allocated, self.overhead_mb),
            "allocated": allocated,
            "reserved": reserved,
            "smi": reading.mb,
            "smi_seen": reading.seen,
            "overhead": self.overhead_mb,
            "overhead_seen": self.overhead_seen,
        }
