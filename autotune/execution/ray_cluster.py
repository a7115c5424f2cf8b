"""The Ray cluster a study's trials run on: joined or embedded, what it holds, and whether it can
place a trial.

Contract: :func:`connect` joins the Ray cluster at an address, or starts an embedded one on this
machine, and returns it as a :class:`RayCluster`. :meth:`RayCluster.check` refuses, before any
trial, a cluster that cannot place one: no resource of the backend's kind at all (naming it and
the ``ray start`` flag that provides it), or not enough nodes for a trial that spans several (a
SpecError). :meth:`RayCluster.alive_nodes` raises :class:`ClusterLost` once the driver's own
connection to the cluster is gone (the local raylet died).

An embedded Ray is quiet, bound to loopback and shut down (no processes left) on close. If the
driver dies instead (SIGKILL included), nothing of the study outlives it by more than a few
seconds: Ray ends its raylet and GCS with the driver, a running trial's processes die with the
Ray worker that launched them (`autotune.execution.runner`), and an
`autotune.execution.processes.Guard` ends the
rest — Ray's agents, which otherwise wait 60 s on the dead GCS — and removes Ray's temp folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from autotune.execution.nodes import node_plan, unplaceable
from autotune.execution.processes import Guard
from autotune.spec.backends import Backend
from autotune.spec.errors import SpecError


class ClusterLost(RuntimeError):
    """The driver lost its Ray cluster (the local raylet died): nothing more can run."""


class RayCluster:
    """The Ray a driver is connected to (``ray``: Ray's module, initialised), for ``backend``'s
    trials on nodes of ``devices_per_node`` devices."""

    def __init__(
        self,
        ray,
        backend: Backend,
        devices_per_node: int,
        address: str | None,
        temp_dir: str | None = None,
        guard: Guard | None = None,
    ):
        self.ray, self.backend = ray, backend
        self.devices_per_node, self.address = devices_per_node, address
        self._temp_dir, self._guard = temp_dir, guard  # an embedded Ray's

    def close_embedded(self) -> None:
        """End what an embedded Ray left (its processes, its temp folder); nothing when joined."""
        if self._guard:
            self._guard.__exit__(None, None, None)
            self._guard = None
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def where(self) -> str:
        return f"the Ray cluster at {self.address}" if self.address else "the embedded Ray"

    def bundles(self, devices: int) -> list[dict]:
        try:
            plan = node_plan(devices, self.devices_per_node)
        except ValueError as exc:
            raise SpecError(f"cluster.devices_per_node: {exc}") from None
        return [self.backend.resources(launch.local_workers) for launch in plan]

    def alive_nodes(self) -> list[dict]:
        """The total resources of each node alive; ClusterLost when this driver's own node is
        not among them (its raylet died: nothing can be submitted any more)."""
        nodes = [node for node in self.ray.nodes() if node.get("Alive")]
        mine = self.ray.get_runtime_context().get_node_id()
        if not any(node["NodeID"] == mine for node in nodes):
            raise ClusterLost("the Ray cluster is gone (this driver's node is not alive)")
        return [node["Resources"] for node in nodes]

    def capacity(self) -> int:
        """Devices of this backend's kind in the Ray cluster: how many trial devices fit at once
        (embedded on CPU: ``pool_devices``, so trials never share the cores they measure)."""
        return int(self.ray.cluster_resources().get(self.backend.ray_resource, 0))

    def check(self, devices: int) -> None:
        """Refuse a cluster that cannot place a trial of ``devices`` (see the module doc)."""
        kind, name = self.backend.ray_resource, self.backend.name
        if not self.capacity():
            raise SpecError(
                f"cluster.backend: {name} trials need Ray resource {kind} and {self.where()} has "
                f"none: start each Ray node with `ray start {self.backend.ray_start_flag}` "
                "(N: the node's devices) and pass --ray-address"
            )
        bundles = self.bundles(devices)
        reason = unplaceable(bundles, self.alive_nodes())
        if reason:
            spans = (
                f"spans {len(bundles)} nodes of {self.devices_per_node} devices"
                if len(bundles) > 1
                else "needs one node"
            )
            raise SpecError(
                f"cluster.devices: a trial of {devices} devices {spans}: {reason} in "
                f"{self.where()}; start more nodes (`ray start --address=HEAD:PORT "
                f"{self.backend.ray_start_flag}`) and pass --ray-address, or lower "
                "cluster.devices"
            )


def connect(
    backend: Backend, devices_per_node: int, pool_devices: int, address: str | None
) -> RayCluster:
    """Join the Ray cluster at ``address``, or (no address) start an embedded one."""
    # Ray reads these at import and init: no auth-token file or warning, no log spam.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        # An embedded Ray serves this machine only: this switch makes Ray take the loopback
        # address as the node IP, so GCS, raylet and object manager listen on 127.0.0.1.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    common = dict(logging_level="ERROR", log_to_driver=False, configure_logging=True)
    if address:
        ray.init(address=address, **common)
        return RayCluster(ray, backend, devices_per_node, address)
    temp_dir = tempfile.mkdtemp(prefix="autotune-ray-")
    guard = Guard(remove=[temp_dir]).__enter__()
    cluster = RayCluster(ray, backend, devices_per_node, address, temp_dir, guard)
    # On CPU the embedded pool is the study's devices, so trials never share the cores they
    # measure; accelerators are whatever Ray detects.
    pool = {"num_cpus": pool_devices} if backend.host_devices else {}
    try:
        ray.init(include_dashboard=False, _temp_dir=temp_dir, **pool, **common)
    except BaseException:
        cluster.close_embedded()
        raise
    return cluster
