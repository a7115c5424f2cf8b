"""The device pool of a MindFormers config (``cluster:`` of ``autotune init --mindformers``).

Contract: :func:`read_cluster` appends to ``reading.cluster`` the backend (``--backend``, else
the config's ``context.device_target``), the devices and devices per node, the device profile —
the config's device where the study stands for it (its own backend or a simulation), else the
backend's own: a CPU study is priced as the CPU it runs on — and, on an accelerator, MindSpore's
``context.max_device_memory`` as the cap the estimate screens against. An unknown device or an
unreadable size is a SpecError naming the key.
"""

from __future__ import annotations

import re

from autotune.spec.backends import backend_of, for_device_target


def _memory_gb(cfg, key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9.]+)\s*(GB|MB)\s*", str(value), re.IGNORECASE)
    if not match:
        cfg.fail(key, f'expected a size such as "58GB", got {value!r}')
    number = float(match.group(1))
    return number / 1024 if match.group(2).upper() == "MB" else number


def read_cluster(
    cfg, r, devices: int, where: str, per_node: int | None, backend: str | None
) -> None:
    target = str(cfg.get("context.device_target", "Ascend")).lower()
    device = for_device_target(target)  # the backend whose MindSpore device target it is
    if device is None:
        cfg.fail("context.device_target", f"unknown device {target!r}")
    chosen = backend_of(backend or device.name)
    r.cluster += [
        ("backend", chosen.name, "--backend" if chosen is not device else "context.device_target"),
        ("devices", devices, where),
        (
            "devices_per_node",
            per_node or min(devices, 8),
            "--devices-per-node" if per_node else "8 per node (Atlas 800T A2)",
        ),
    ]
    # The profile: the config's device where the study stands for it (its own backend or a
    # simulation), else the backend's own: a CPU study is priced as the CPU it runs on. The
    # device's own profile is its backend's default (the published configs' "Atlas 800T A2":
    # ascend-910b).
    if chosen is device or chosen.kind == "estimate":
        r.cluster.append(("device", device.default_profile, f"context.device_target {target}"))
        cap = _memory_gb(cfg, "context.max_device_memory") if device.accelerator else None
        if cap is not None:
            r.cluster.append(
                (
                    "max_device_memory_gb",
                    cap,
                    "context.max_device_memory: the cap the estimate screens against",
                )
            )
    else:
        r.cluster.append(("device", chosen.default_profile, f"--backend {chosen.name}"))
