"""A process's device memory as the vendor tool reports it: ``nvidia-smi`` (GPU), ``npu-smi``
(Ascend).

Contract: :func:`process_memory_mb` returns the MiB the tool lists for ``pid`` (summed over its
devices), or None when the tool is missing, fails, times out or does not list the process. The
parsers are separate (:func:`parse_nvidia_smi`, :func:`parse_npu_smi`) so their formats are tested
without the tools (docs/accelerators.md, "Peak memory"). It includes what MindSpore's pool does not
count: the CUDA/CANN context and the communicator buffers.
"""

from __future__ import annotations

import shutil
import subprocess

NVIDIA_SMI = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
NPU_SMI = ("npu-smi", "info")
TIMEOUT_S = 10


def parse_nvidia_smi(text: str, pid: int) -> float | None:
    """``pid, used_memory`` rows (MiB) → the sum of ``pid``'s rows, None when absent."""
    total, seen = 0.0, False
    for row in text.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == 2 and cells[0] == str(pid) and cells[1].replace(".", "", 1).isdigit():
            total, seen = total + float(cells[1]), True
    return total if seen else None


def parse_npu_smi(text: str, pid: int) -> float | None:
    """``npu-smi info``'s process table (``| NPU Chip | Process id | Process name | Process
    memory(MB) |``) → the sum of ``pid``'s rows, None when absent."""
    total, seen = 0.0, False
    for row in text.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] == str(pid) and cells[3].isdigit():
            total, seen = total + float(cells[3]), True
    return total if seen else None


def process_memory_mb(device_target: str, pid: int) -> float | None:
    """The vendor tool's reading for ``pid`` on ``device_target`` (see the module doc)."""
    command, parse = {"GPU": (NVIDIA_SMI, parse_nvidia_smi),
                      "Ascend": (NPU_SMI, parse_npu_smi)}.get(device_target, (None, None))
    if command is None or shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse(done.stdout, pid) if done.returncode == 0 else None
