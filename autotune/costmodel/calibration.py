"""Per-study correction of the cost model from measured trials.

Contract: :meth:`Calibration.from_pairs` takes ``[(estimate, measured_peak_memory_mb,
measured_step_time_ms), ...]`` and returns multiplicative factors — the median of measured ÷
predicted, separately for memory and for step time (the median, so one odd trial cannot drag the
study). ``estimate(..., calibration=c)`` multiplies its memory and time by them (and re-judges
feasibility on the corrected memory). Pairs whose numbers are missing, NaN or ≤ 0 are skipped;
with none left a factor stays 1.0. An estimate that was itself calibrated is first divided back
by its own factors, so feeding calibrated estimates does not compound.

``as_dict()`` / ``from_dict()`` round-trip through JSON (for Optuna study user attrs).
MB and GB here are MiB and GiB, as RSS (VmHWM) and device allocators report them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Calibration:
    memory_factor: float = 1.0
    time_factor: float = 1.0
    n_memory: int = 0  # pairs each factor was fitted on
    n_time: int = 0

    @classmethod
    def from_pairs(cls, pairs) -> Calibration:
        memory, time = [], []
        for est, memory_mb, step_ms in pairs:
            own = est.calibration or cls()
            predicted_gb = est.memory_gb_per_device / own.memory_factor
            predicted_s = est.step_time_s / own.time_factor
            if _usable(memory_mb) and _usable(predicted_gb):
                memory.append(memory_mb / 1024 / predicted_gb)
            if _usable(step_ms) and _usable(predicted_s):
                time.append(step_ms / 1000 / predicted_s)
        return cls(
            statistics.median(memory) if memory else 1.0,
            statistics.median(time) if time else 1.0,
            len(memory),
            len(time),
        )

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        return cls(
            float(data.get("memory_factor", 1.0)),
            float(data.get("time_factor", 1.0)),
            int(data.get("n_memory", 0)),
            int(data.get("n_time", 0)),
        )


def _usable(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0
