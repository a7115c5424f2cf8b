"""The one place that spells ``msrun``'s command line: trials and exported ``launch.sh`` alike.

Contract: :func:`msrun_args` returns msrun's options for a job of ``workers`` ranks of which
``local_workers`` run on this node, always in this order::

    --worker_num --local_worker_num --master_addr --master_port [--node_rank] --log_dir
    --join=True --cluster_time_out --tail_worker_log [--bind_core=True]

The caller puts the msrun executable in front and the program behind it (msrun runs its first
positional argument with ``python`` unless it is literally ``python``, ``python3`` or ``pytest``).
The counts are validated here (``ValueError``: a caller's bug, not user input); the address, port,
node rank and log folder are written as given, so a shell script can pass ``"$MASTER_ADDR"``.

What each option does and why it is set is in docs/export.md ("msrun"), read from MindSpore 2.10's
``mindspore/parallel/cluster/run.py`` and ``process_entity/_api.py``.
"""

from __future__ import annotations

# Seconds msrun's processes wait for the whole cluster to join before giving up. A trial's nodes
# are started together by one driver: 120 s (msrun's default, 600 s, would let a worker that never
# starts hold a trial or a node for ten minutes). An exported run's nodes are started by people
# or a scheduler, minutes apart: it keeps msrun's default (docs/export.md, "msrun").
CLUSTER_TIME_OUT_S = 120
MSRUN_DEFAULT_CLUSTER_TIME_OUT_S = 600


def node_count(workers: int, local_workers: int) -> int:
    """Nodes a job of ``workers`` ranks spans at ``local_workers`` per node."""
    return -(-workers // local_workers)


def msrun_args(
    workers: int,
    local_workers: int,
    *,
    master_port: int | str,
    log_dir: str,
    master_addr: str = "127.0.0.1",
    node_rank: int | str | None = None,
    cluster_time_out: int = CLUSTER_TIME_OUT_S,
    bind_core: bool = False,
    tail_worker: int | None = None,
) -> list[str]:
    """msrun's options (see the module doc).

    ``node_rank=None`` leaves rank assignment to msrun (one node); an int node rank numbers this
    node's ranks from ``node_rank · local_workers`` (a smaller last node: `autotune.execution.nodes`). ``tail_worker`` is the global
    rank whose log msrun copies to its console; ``None`` tails none, so msrun starts no ``tail -f``
    per worker (processes that outlive a killed msrun). ``bind_core`` pins each worker to its
    own cores (the CPU backend: docs/export.md).
    """
    if workers < 1 or not 1 <= local_workers <= workers:
        raise ValueError(f"msrun: need 1 ≤ local_workers ({local_workers}) ≤ workers ({workers})")
    if isinstance(node_rank, int):  # msrun numbers this node's ranks node_rank·local + i
        if not 0 <= node_rank * local_workers <= workers - local_workers:
            raise ValueError(
                f"msrun: node_rank {node_rank} of {local_workers} workers holds "
                f"ranks beyond {workers}"
            )
    elif workers % local_workers:  # every node alike (a launch script's "$NODE_RANK")
        raise ValueError(
            f"msrun: workers ({workers}) must be a multiple of local_workers ({local_workers})"
        )
    if cluster_time_out < 1:
        raise ValueError(f"msrun: cluster_time_out must be ≥ 1 s, got {cluster_time_out}")
    if tail_worker is not None and not 0 <= tail_worker < workers:
        raise ValueError(f"msrun: tail_worker {tail_worker} is not a rank of {workers}")
    # msrun tails the workers whose rank is listed: a rank no worker has tails none.
    tail = workers if tail_worker is None else tail_worker
    return [
        f"--worker_num={workers}",
        f"--local_worker_num={local_workers}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
        *([] if node_rank is None else [f"--node_rank={node_rank}"]),
        f"--log_dir={log_dir}",
        "--join=True",
        f"--cluster_time_out={cluster_time_out}",
        f"--tail_worker_log={tail}",
        *(["--bind_core=True"] if bind_core else []),
    ]
