"""Where a trial's ranks go: how many nodes, which ranks on each, and whether a cluster can hold it.

Contract:
- :func:`node_plan` splits a trial of ``devices`` ranks into one :class:`NodeLaunch` per node,
  ⌈devices / devices_per_node⌉ of them, each holding ``devices_per_node`` ranks (the last may
  hold fewer). Node ``i`` holds the contiguous ranks from ``first_rank`` on — the export's rank
  order (stage-major, then dp, then tp: `autotune.layout`), so a tp group of adjacent ranks stays
  inside a node whenever tp divides devices_per_node, as the cost model assumes. A split msrun
  cannot number that way is a ``ValueError`` naming why.
- :class:`NodeRun` is one node's part of a trial that spans several, as its launcher on that
  node has it; :func:`free_port` a port for a trial's msrun scheduler.
- :func:`unplaceable` says why the nodes of a cluster (their total resources) cannot hold a
  trial's bundles on distinct nodes (Ray's STRICT_SPREAD), or returns None when they can — the
  difference between a trial that waits for busy devices and one that would wait forever.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from autotune.spec.backends import reserved_ports


@dataclass(frozen=True)
class NodeLaunch:
    """One node's share of a trial: bundle ``index`` of its placement group runs ``local_workers``
    ranks from ``first_rank`` on, launched as msrun ``--node_rank=msrun_node_rank``."""

    index: int
    local_workers: int
    first_rank: int
    msrun_node_rank: int


def node_plan(devices: int, devices_per_node: int) -> list[NodeLaunch]:
    """The nodes a trial of ``devices`` ranks spans (see the module doc)."""
    if devices <= devices_per_node:
        return [NodeLaunch(0, devices, 0, 0)]
    full, rest = divmod(devices, devices_per_node)
    counts = [devices_per_node] * full + ([rest] if rest else [])
    plan, first = [], 0
    for index, local in enumerate(counts):
        # msrun numbers a node's workers node_rank·local_worker_num + i ("We assume that each
        # node has same process number": mindspore/parallel/cluster/process_entity/_api.py), so
        # a smaller last node gets the node rank that makes that product its first rank.
        if first % local:
            raise ValueError(
                f"{devices} ranks in nodes of {devices_per_node}: msrun cannot number "
                f"a last node of {local} ranks from rank {first}"
            )
        plan.append(NodeLaunch(index, local, first, first // local))
        first += local
    return plan


def _fits(bundle: dict, node: dict) -> bool:
    return all(node.get(key, 0) >= amount for key, amount in bundle.items())


def unplaceable(bundles: list[dict], nodes: list[dict]) -> str | None:
    """Why ``bundles`` cannot go to distinct ``nodes`` (each a node's total resources), or None."""
    free = sorted(nodes, key=lambda n: sorted(n.items()))
    for bundle in sorted(bundles, key=lambda b: -max(b.values())):
        # the smallest node that fits, so a larger bundle after it still finds a large node
        fitting = [n for n in free if _fits(bundle, n)]
        if not fitting:
            holding = sum(_fits(bundle, n) for n in nodes)
            needed = sum(_fits(bundle, b) for b in bundles)
            return (
                f"{needed} node(s) each holding {_show(bundle)} are needed, and the Ray "
                f"cluster has {holding} such node(s) of {len(nodes)} alive"
            )
        free.remove(min(fitting, key=lambda n: sum(n.get(k, 0) for k in bundle)))
    return None


def _show(bundle: dict) -> str:
    return ", ".join(f"{amount:g} {key}" for key, amount in bundle.items())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (msrun's scheduler binds it moments later), none
    of the ports a backend's collectives take on the host (``Backend.host_ports``: the OS hands
    out ports up to 60999 unless they are reserved, docs/cluster.md)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not any(first <= port <= last for first, last in reserved_ports()):
            return port


@dataclass(frozen=True)
class NodeRun:
    """This node's part of a trial that spans several: its ranks, and where rank 0's node
    listens (msrun's scheduler)."""

    launch: NodeLaunch
    master_addr: str
    master_port: int
