"""A process's device memory as the vendor tool reports it (``nvidia-smi`` on GPU, ``npu-smi`` on
Ascend: the backend's ``memory_tool``, `autotune.spec.backends`).

Contract: :func:`process_memory` returns a :class:`Reading`: the MiB the tool lists for ``pid``
(summed over its devices) and whether the process was visible to the tool — ``read`` (listed),
``not listed`` (the tool ran and listed other processes or none: the tools list *host* PIDs, so
inside a container's PID namespace a worker's own pid is never among them), or ``no tool``
(missing, failed, timed out). The parsers are separate (:func:`parse_nvidia_smi`,
:func:`parse_npu_smi`) so their formats are tested without the tools (docs/accelerators.md,
"Peak memory"). A reading includes what MindSpore's pool does not count: the CUDA/CANN context
and the communicator buffers.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 10
READ, NOT_LISTED, NO_TOOL = "read", "not listed", "no tool"


@dataclass(frozen=True)
class Reading:
    """The tool's reading for one process: ``mb`` (None unless ``seen`` is ``read``)."""

    mb: float | None
    seen: str


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


PARSERS = {"csv": parse_nvidia_smi, "table": parse_npu_smi}


def process_memory(backend, pid: int) -> Reading:
    """The vendor tool's reading for ``pid`` on ``backend`` (see the module doc)."""
    command = backend.memory_tool
    if not command or shutil.which(command[0]) is None:
        return Reading(None, NO_TOOL)
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return Reading(None, NO_TOOL)
    if done.returncode != 0:
        return Reading(None, NO_TOOL)
    mb = PARSERS[backend.memory_tool_format](done.stdout, pid)
    return Reading(mb, NOT_LISTED if mb is None else READ)
