"""Ray dispatch: place each trial on the device pool and hand back its result.

Contract: a :class:`Dispatcher` runs :func:`autotune.execution.runner.run_trial` as Ray tasks
holding the trial's devices — CPUs, GPUs or Ascend NPUs, as its backend says
(`autotune.spec.backends`). A trial
that fits one node (``devices_per_node``) is one task; a larger one gets a placement group of one
bundle per node (STRICT_SPREAD, `autotune.execution.nodes`) and one task per bundle, each launching
its node's msrun, with rank 0's node as msrun's master. The devices Ray assigns a task reach
msrun and MindSpore through the backend's variable (CUDA_VISIBLE_DEVICES,
ASCEND_RT_VISIBLE_DEVICES). It decides nothing about what to try: the study's loop submits, and
collects each trial's `autotune.jobs.Result` (with its queued and wall seconds) with
:meth:`Dispatcher.wait`.

The Ray it runs on is ``Dispatcher.cluster`` (`autotune.execution.ray_cluster`: embedded, or
joined at ``address``), whose ``check`` refuses, before any trial, a cluster that cannot place
one. A trial Ray could not finish —
the worker or node running it died, its result was lost, any error of Ray or of the runner
itself — comes back as an ``error`` with ``infrastructure`` set: not the candidate's fault. A
failure on one node of a multi-node trial cancels its other nodes at once. Ray does not retry
tasks itself (``max_retries=0``): the study's loop does, once, as a trial of its own
(`autotune.study.retry`). When the driver's own connection to the cluster is gone (the local
raylet died), or a trial can no longer be placed on the nodes alive, no trial can run any
more: :meth:`Dispatcher.submit` or :meth:`Dispatcher.wait` raise
`autotune.execution.ray_cluster.ClusterLost` (:class:`Unplaceable`) instead, and :meth:`Dispatcher.cancel_all` then names every trial that
was running, so the study's loop records them as interrupted and a resume reruns them.
:meth:`Dispatcher.cancel` does not wait: the trial's tasks are told to stop (each stops its
process tree within ``STOP_GRACE_S`` + a few seconds) and its placement group is removed once
they have, checked on each later call; :meth:`Dispatcher.cancel_all` (the driver ending) waits
up to ``CANCEL_WAIT_S`` for them all.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune.execution.nodes import node_plan, unplaceable
from autotune.execution.ray_cluster import ClusterLost, RayCluster, connect
from autotune.execution.ray_tasks import PoolActor, master_address, node_task
from autotune.jobs import Result
from autotune.spec.backends import Backend

CANCEL_WAIT_S = 15  # how long a cancelled trial's tasks get to stop their processes


class Unplaceable(ClusterLost):
    """The nodes alive can no longer hold a trial: it would wait for them forever."""


@dataclass
class _Pool:
    """A Ray actor holding ``devices`` of one node and the warm workers that run on them
    (`autotune.execution.warm`); ``trial``: the number of the trial it runs, None when idle."""

    actor: object
    devices: int
    trial: int | None = None
    layout: tuple | None = None  # (dp, tp, pp) of the trial it ran last
    used: float = 0.0  # when it last took a trial (the idle pool used longest ago goes first)


@dataclass
class _Trial:
    """A submitted trial: its node tasks (one unless it spans nodes) and what they returned."""

    number: int
    submitted: float
    refs: list
    group: object = None  # its placement group, if it spans nodes
    bundles: list = field(default_factory=list)
    results: dict = field(default_factory=dict)  # node index → (started, Result)
    pool: _Pool | None = None  # the warm workers running it, if any


class Dispatcher:
    """Submits trials to Ray and waits for them. Use as a context manager."""

    def __init__(
        self,
        backend: Backend,
        devices_per_node: int,
        pool_devices: int,
        address: str | None = None,
        warm_root: Path | None = None,
    ):
        self.backend, self.devices_per_node = backend, devices_per_node
        self.pool_devices, self.address = pool_devices, address
        self.warm_root = warm_root  # where warm workers keep their files; None: fresh launches
        self._pools: list[_Pool] = []
        self._made = 0  # pools made so far (their folder names)
        self._pool_prefix = f"{socket.gethostname()}-{os.getpid()}-"
        self._trials: dict[int, _Trial] = {}
        # cancelled: (tasks still running, group, when they were asked to stop)
        self._stopping: list[tuple[list, object, float]] = []
        self.cluster: RayCluster | None = None  # the Ray it runs on, once entered

    def __enter__(self) -> Dispatcher:
        self.cluster = connect(self.backend, self.devices_per_node, self.pool_devices, self.address)
        self._ray = ray = self.cluster.ray
        self._remote = ray.remote(node_task)
        self._address_task = ray.remote(master_address)
        self._pool_actor = ray.remote(PoolActor)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.cancel_all()
            for pool in list(self._pools):
                self._retire(pool)
            self._ray.shutdown()
        finally:
            self.cluster.close_embedded()
            if self.warm_root is not None:  # the pools' folders this host can see
                for folder in self.warm_root.glob(f"{self._pool_prefix}*"):
                    shutil.rmtree(folder, ignore_errors=True)

    def submit(
        self,
        number: int,
        config: dict,
        trial_dir: Path,
        devices: int,
        timeout_s: float,
        memory_limit_mb: float | None,
        memory_mb: float | None = None,
    ) -> None:
        """Run trial ``number``: in a warm pool of its size on one node (``memory_mb``: the cost
        model's estimate of its memory per device, which a pool runs one size of:
        `autotune.execution.warm`), else fresh on as many nodes as it spans."""
        plan = node_plan(devices, self.devices_per_node)
        bundles = [self.backend.resources(launch.local_workers) for launch in plan]
        reason = unplaceable(bundles, self.cluster.alive_nodes())
        if reason:
            raise Unplaceable(f"no set of nodes can place trial {number}: {reason}")
        # No Ray retries: a task whose worker died comes back as an infrastructure error, and
        # the search loop runs the candidate again under a new trial number, with the failed
        # attempt on record (a Ray retry would rerun it unseen, into the same trial folder).
        args = (config, str(trial_dir), timeout_s, memory_limit_mb, devices)
        devices_env = (self.backend.visible_devices, self.backend.ray_resource)
        if len(plan) == 1 and self.warm_root is not None:
            knobs = config["knobs"]
            layout = (knobs["dp"], knobs["tp"], knobs["pp"])
            pool = self._pool_for(devices, layout)
            pool.trial, pool.used, pool.layout = number, time.monotonic(), layout
            ref = pool.actor.run.remote(
                config, str(trial_dir), timeout_s, memory_limit_mb, memory_mb
            )
            self._trials[number] = _Trial(number, time.time(), [ref], pool=pool)
            return
        if len(plan) == 1:
            ref = self._remote.options(max_retries=0, **self.backend.task_options(devices)).remote(
                *args, None, None, *devices_env
            )
            self._trials[number] = _Trial(number, time.time(), [ref])
            return
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = self._ray.util.placement_group(bundles, strategy="STRICT_SPREAD")

        def in_bundle(index: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

        # rank 0's node picks msrun's master address and port; each node task waits for it
        master = self._address_task.options(
            num_cpus=0, max_retries=0, scheduling_strategy=in_bundle(0)
        ).remote()
        refs = [
            self._remote.options(
                max_retries=0,
                scheduling_strategy=in_bundle(launch.index),
                **self.backend.task_options(launch.local_workers),
            ).remote(*args, launch, master, *devices_env)
            for launch in plan
        ]
        self._trials[number] = _Trial(number, time.time(), refs, group, bundles)

    def _pool_for(self, devices: int, layout: tuple) -> _Pool:
        """An idle pool of ``devices`` — one that ran ``layout`` last first (on an accelerator
        a pool runs one layout: `autotune.execution.warm`) — else a new one, after retiring
        idle pools of other sizes whose devices it needs (the study's loop submits only what
        its free devices hold, and idle pools hold devices no trial uses)."""
        idle_of_size = [p for p in self._pools if p.trial is None and p.devices == devices]
        if idle_of_size:
            return min(idle_of_size, key=lambda p: p.layout != layout)
        wanted = self.backend.resources(devices)
        available = self._ray.available_resources()
        idle = sorted((p for p in self._pools if p.trial is None), key=lambda p: p.used)
        while idle and any(available.get(k, 0) < v for k, v in wanted.items()):
            pool = idle.pop(0)
            self._retire(pool)
            for key, amount in self.backend.resources(pool.devices).items():
                available[key] = available.get(key, 0) + amount
        self._made += 1
        # a folder of this driver's own: several drivers may share the artifacts folder
        root = self.warm_root / f"{self._pool_prefix}{self._made}"
        actor = self._pool_actor.options(
            max_restarts=0, **self.backend.task_options(devices)
        ).remote(str(root), devices, self.backend.visible_devices, self.backend.ray_resource)
        pool = _Pool(actor, devices)
        self._pools.append(pool)
        return pool

    def _retire(self, pool: _Pool) -> None:
        """End a pool's actor (its workers die with it) without waiting."""
        self._ray.kill(pool.actor, no_restart=True)
        self._pools.remove(pool)

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, Result]]:
        """Block until at least one trial finishes (or ``timeout_s``); return those finished,
        as (number, result) with the result's ``queued_s`` (submit → its task started) and
        ``wall_s`` (submit → its result back here)."""
        self._reap()
        if not self._trials:
            return []
        owner = {
            ref: trial
            for trial in self._trials.values()
            for index, ref in enumerate(trial.refs)
            if index not in trial.results
        }
        ready, _ = self._ray.wait(list(owner), num_returns=1, timeout=timeout_s)
        done = []
        for ref in ready:
            trial = owner[ref]
            if trial.number not in self._trials:
                continue  # finished already by another node's failure
            trial.results[trial.refs.index(ref)] = self._get(ref, trial)
            result = self._result(trial)
            if result is not None:
                done.append(result)
        self._check_pending()
        return done

    def _get(self, ref, trial: _Trial) -> tuple[float, Result]:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.LocalRayletDiedError as exc:  # cancel_all names the trial
            raise ClusterLost(
                f"the Ray cluster is gone ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        except Exception as exc:  # Ray lost the task: its worker or node died, ...
            if trial.pool is not None and trial.pool in self._pools:  # the actor is gone too
                self._retire(trial.pool)
                trial.pool = None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return trial.submitted, Result(
                "error",
                detail=f"infrastructure: Ray: {type(exc).__name__}: {first}",
                infrastructure=True,
            )

    def _result(self, trial: _Trial) -> tuple[int, Result] | None:
        """The trial's result once every node is back, or one failed (the others are then
        cancelled); None while nodes still run."""
        failed = [(i, r) for i, (_, r) in sorted(trial.results.items()) if r.outcome != "ok"]
        if not failed and len(trial.results) < len(trial.refs):
            return None
        if failed:
            index, result = failed[0]
            if len(trial.refs) > 1:
                result.detail = f"node {index} of {len(trial.refs)}: {result.detail}"
        else:
            result = trial.results[0][1]
            result.run_s = max(r.run_s for _, r in trial.results.values())
        self._end(trial)
        now = time.time()
        started = min(s for s, _ in trial.results.values())
        result.queued_s = max(0.0, started - trial.submitted)
        result.wall_s = now - trial.submitted
        return trial.number, result

    def _end(self, trial: _Trial, block: bool = True) -> None:
        """Forget ``trial``, stopping whatever of it still runs, and free its placement — at
        once, or (not ``block``) once its tasks have stopped (:meth:`_reap`)."""
        del self._trials[trial.number]
        running = [ref for i, ref in enumerate(trial.refs) if i not in trial.results]
        if trial.pool is not None:
            if running:  # stopped before it ended: its workers go with their actor
                self._retire(trial.pool)
            else:
                trial.pool.trial = None
            return
        for ref in running:
            self._ray.cancel(ref, force=False)
        self._stopping.append((running, trial.group, time.monotonic()))
        self._reap(block)

    def _reap(self, block: bool = False) -> None:
        """Free the placement of each cancelled trial whose tasks have stopped (``block``: wait
        up to ``CANCEL_WAIT_S`` for them). A task still running ``CANCEL_WAIT_S`` after it was
        asked to stop (Ray's interrupt can miss one) ends with its worker, and the trial's
        processes with their parent (`autotune.train.runtime.lifetime`)."""
        still = []
        for running, group, since in self._stopping:
            if running:
                _, running = self._ray.wait(
                    running, num_returns=len(running), timeout=CANCEL_WAIT_S if block else 0
                )
            if running and (block or time.monotonic() - since > CANCEL_WAIT_S):
                for ref in running:
                    self._ray.cancel(ref, force=True)
                running = []
            if running:
                still.append((running, group, since))
            elif group is not None:
                self._ray.util.remove_placement_group(group)
        self._stopping = still

    def _check_pending(self) -> None:
        """A trial still waiting for its placement that the nodes alive cannot hold any more
        would wait forever: say so (:class:`Unplaceable`)."""
        table = self._ray.util.placement_group_table
        waiting = [
            t
            for t in self._trials.values()
            if t.group is not None and not t.results and table(t.group).get("state") != "CREATED"
        ]
        if not waiting:
            return
        nodes = self.cluster.alive_nodes()
        for trial in waiting:
            reason = unplaceable(trial.bundles, nodes)
            if reason:
                raise Unplaceable(f"no set of nodes can place trial {trial.number}: {reason}")

    def cancel(self, number: int) -> None:
        """Stop one running trial without waiting for it (its processes are stopped); it is
        not reported by wait."""
        self._end(self._trials[number], block=False)

    def cancel_all(self) -> list[int]:
        """Cancel every running trial (their processes are stopped); return their numbers,
        those lost with the cluster (`ClusterLost`) included."""
        numbers = list(self._trials)
        try:
            for trial in list(self._trials.values()):
                self._end(trial)
            self._reap(block=True)
        except Exception:  # noqa: BLE001  (a cluster that is gone cancels nothing: the
            pass  # trials' processes died with their raylet's workers)
        self._trials.clear()
        return numbers
