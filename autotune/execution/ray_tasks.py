"""What runs inside Ray's workers for `autotune.execution.dispatch`: one node's share of a
fresh trial (:func:`node_task`), the warm workers' actor (:class:`PoolActor`) and the address
rank 0's node listens on (:func:`master_address`). The trial's two return the time they
started with its `autotune.jobs.Result`, so the dispatcher can tell queueing from running.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from autotune.execution.runner import NodeRun, free_port, run_trial


def _assigned_devices(visible_devices: str | None, resource: str | None) -> dict:
    """The backend's visibility variable set to the devices Ray assigned this worker. Ray sets
    it too; said here so that msrun's workers surely inherit it."""
    import ray

    if not visible_devices:
        return {}
    ids = ray.get_runtime_context().get_accelerator_ids().get(resource, [])
    return {visible_devices: ",".join(map(str, ids))}


class PoolActor:
    """A `autotune.execution.warm.WarmPool` inside a Ray actor: the actor holds the pool's
    devices for as long as it lives, and its processes die with it."""

    def __init__(self, root: str, workers: int, visible_devices: str | None, resource: str | None):
        from autotune.execution.warm import WarmPool

        self.pool = WarmPool(Path(root), workers, _assigned_devices(visible_devices, resource))

    def run(self, config: dict, trial_dir: str, timeout_s: float, memory_limit_mb, memory_mb):
        started = time.time()
        return started, self.pool.run(
            config, Path(trial_dir), timeout_s, memory_limit_mb, memory_mb
        )


def _cancellable() -> None:
    """Let the dispatcher's cancel reach this task. Ray's ``cancel(force=False)`` interrupts the
    worker's main thread, which an ignored SIGINT swallows — and a worker inherits that from a
    driver or ``ray start`` run as a script's background job (``nohup autotune search … &``):
    the trial then ran on until the forced cancel (docs/cluster.md, "Measured")."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def node_task(
    config: dict,
    trial_dir: str,
    timeout_s: float,
    memory_limit_mb,
    workers: int,
    launch,
    master,
    visible_devices: str | None,
    resource: str | None,
):
    """One node's share of a trial (all of it on one node), inside Ray."""
    _cancellable()
    started = time.time()
    node = NodeRun(launch, *master) if launch is not None else None
    return started, run_trial(
        config,
        Path(trial_dir),
        timeout_s,
        memory_limit_mb,
        workers,
        node=node,
        env=_assigned_devices(visible_devices, resource),
    )


def master_address() -> tuple[str, int]:
    """Where rank 0's node listens: this node's address and a port free on it now. A node on a
    loopback address (127.0.0.2, …: Ray nodes sharing one host) answers 127.0.0.1: msrun starts
    its scheduler only where ``--master_addr`` is one of the host's own addresses, and the
    loopback interface holds 127.0.0.1 alone (docs/cluster.md)."""
    import ipaddress

    import ray

    address = ray.util.get_node_ip_address()
    if ipaddress.ip_address(address).is_loopback:
        address = "127.0.0.1"
    return address, free_port(address)
