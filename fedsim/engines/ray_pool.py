"""A pool of Ray actors that serves the local engine's Messages in parallel.

Each actor owns a fixed set of nodes (partition p goes to actor p mod A), so it decodes the data
and builds the model once and keeps every one of its nodes' ``Context`` across rounds. A round
sends each actor one batch of Messages and waits on the futures: no polling anywhere.

A worker whose batch brings no replies (its process died: killed, out of memory, ``os._exit``; or it raised
outside the ClientApp) answers every message of the batch with an error reply saying so; one silent past
the round's timeout answers none. Either way the round loop applies ``train.on_client_failure`` to those
clients, and the worker is stopped and replaced by a fresh one before its next batch: its clients' state
(``Context.state``) went with it, so theirs starts empty again, as a client's that never trained (a warning
says so once).

A replacement worker that no node of the cluster takes within PLACE_S (its node was
lost, and no other has room for ``simulation.client_resources``) is not waited on round after round: its
clients fail that phase of the round, the worker is stopped, and the pool shrinks: its clients go to the
pool's placed workers, round robin, their client state empty again (a warning says so once). With no placed
worker left, they fail every round, at once, until a node takes the queued worker.

Each worker, as it starts, says where Ray placed it (its node, the GPUs Ray assigned it, the
``CUDA_VISIBLE_DEVICES`` Ray set, the device torch computes on); the pool appends that to the run's
``workers.jsonl`` (:class:`fedsim.record.schemas.WorkerRecord`), a replacement's line naming how the worker it
took over from was lost.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from flwr.app import Message
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import RayError

from fedsim import wire
from fedsim.config import SimulationConfig
from fedsim.engines.local import deliver, node_id_of, node_states
from fedsim.engines.lost_workers import how_lost
from fedsim.engines.ray_cluster import head_gone, init_ray
from fedsim.errors import ClusterLost, ConfigError, FedsimWarning
from fedsim.record.writer import append_workers

START_S = 600.0  # a new worker's time to start, as discovery (fedsim.server.discovery) gives every node
PLACE_S = 120.0  # a replacement's time to be taken by a node: seconds where a node has room, on a loaded machine too
CLOSE_S = 30.0  # the workers' time to remove their spilled client states as the pool shuts down
CLOSE_LOST_S = 5.0  # the same once the cluster's head is lost: its own workers are gone, others may hang
HEAD_POLL_S = 5.0  # while a round waits on its workers, how often the cluster's head is asked to answer
PLACE_POLL_S = 0.5  # Ray has no future for "placed": the worker's entry in the GCS's actor table is read


class ReplacedWorker(FedsimWarning):
    """A Ray worker of the pool was lost and a fresh one serves its clients, their client state empty."""


class UnplacedWorker(FedsimWarning):
    """No node of the Ray cluster has room for a worker of the pool: the others serve its clients, or with none
    placed, its clients fail until a node has room."""


def on_a_node(actor: ActorHandle) -> bool:
    """Whether a node has taken ``actor`` (its worker process starting or started), from the GCS's actor table
    (Ray's state API, ``ray.util.state``, needs the dashboard, which a cluster may run without): a worker no
    node has taken yet has no process id, even while the GCS offers it to a node (one that may be gone). A dead
    one counts as taken: its batch fails at once, as a lost worker's."""
    from ray._private.state import actors

    entry = actors(actor._actor_id.hex())  # a worker queued for a node has no "Pid" or address yet
    return entry.get("Pid", 0) != 0 or entry.get("State") in ("ALIVE", "DEAD")


class _Worker:
    def __init__(self, run_id: int, partitions: list[int], num_partitions: int, state_memory_mb: float) -> None:
        from fedsim.client.app import app  # imported in the actor's process

        self.app = app
        self.run_id, self.num_partitions = run_id, num_partitions
        self.nodes = node_states(run_id, partitions, num_partitions, state_memory_mb)

    def adopt(self, partitions: list[int]) -> None:
        """Serve ``partitions`` too, their state empty (their worker was lost and no node has room for another)."""
        self.nodes.adopt([node_id_of(p) for p in partitions])

    def execute(self, messages: list[Message]) -> list[Message]:
        return deliver(self.app, messages, self.nodes)

    def placement(self, device: str) -> dict[str, Any]:
        """Where Ray placed this worker, from Ray's view inside it, and the torch device (``simulation.device``)
        its clients compute on."""
        on = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device(device)
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "gpu_ids": ray.get_gpu_ids(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": str(on),
        }

    def close(self) -> None:
        self.nodes.close()


def _fits(have: float, need: float) -> int:
    return int(have / need + 1e-9)  # 1.0 // 0.1 is 9.0


def pool_size(sim: SimulationConfig, num_clients: int) -> int:
    """As many actors as the cluster's nodes fit at ``client_resources`` each, at most one per client.

    Counted node by node, as Flower does: an actor cannot span nodes, so a head node without GPUs
    holds no GPU actor however many CPUs it has. An actor that fits nowhere would wait forever.
    """
    need = sim.client_resources
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive") and n.get("Resources")]
    fits = 0
    for have in nodes:
        on_node = _fits(have.get("CPU", 0), need.num_cpus)
        if need.num_gpus > 0:
            on_node = min(on_node, _fits(have.get("GPU", 0), need.num_gpus))
        fits += on_node
    if fits == 0:
        offered = "; ".join(f"{h.get('CPU', 0):g} CPUs, {h.get('GPU', 0):g} GPUs" for h in nodes)
        raise ConfigError(
            f"simulation.client_resources (num_cpus {need.num_cpus:g}, num_gpus {need.num_gpus:g}) fit on no "
            f"node of the Ray cluster (its nodes: {offered or 'none'}); ask for less"
        )
    return min(fits, num_clients)


class RayPoolExecutor:
    def __init__(self, sim: SimulationConfig, run_id: int, num_partitions: int, run_dir: Path) -> None:
        self._device, self._run_dir = sim.device, run_dir
        self.head_lost = False  # the cluster's head stopped answering (ClusterLost)
        self._placing: list[tuple[ObjectRef, dict[str, Any]]] = []  # workers' placements, workers.jsonl's lines
        self._owns_ray = init_ray(sim)
        try:
            size = pool_size(sim, num_partitions)
        except ConfigError:
            self.actors = []
            self.shutdown()
            raise
        res = self._actor_resources = sim.client_resources
        self._actor = ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus)(_Worker)
        self._args = (run_id, num_partitions, sim.state_memory_mb / size)  # the memory budget is the whole pool's
        self.partitions = [list(range(a, num_partitions, size)) for a in range(size)]
        self.owner = {node_id_of(p): a for a, ps in enumerate(self.partitions) for p in ps}
        self.actors: list[ActorHandle] = [self._start(a) for a in range(size)]
        self.lost: dict[int, str] = {}  # actor -> how its worker was lost; replaced before its next batch
        self.starting = set(range(size))  # actors whose first batch is still to come
        self.placing: set[int] = set()  # replacements no node was seen to take yet (the first workers: START_S)
        self.unplaced: set[int] = set()  # of those, the ones past their PLACE_S: their clients fail at once
        self.where: dict[int, str] = {}  # actor -> its worker's node, as workers.jsonl names it
        self.gone: set[int] = set()  # actors stopped as the pool shrank, their clients served by others
        self._nodes = [node_id_of(p) for p in range(num_partitions)]

    def _start(self, a: int, replaces: str | None = None) -> ActorHandle:
        """A worker for actor ``a``, asked where it was placed (answered before its first batch runs);
        ``replaces``: how the worker it takes over from was lost."""
        run_id, num_partitions, memory = self._args
        actor = self._actor.remote(run_id, self.partitions[a], num_partitions, memory)
        line = {"actor": a, "clients": self.partitions[a], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "replaces": replaces}  # fmt: skip
        self._placing.append((actor.placement.remote(self._device), line))
        return actor

    def _record_placements(self) -> None:
        """Append to ``workers.jsonl`` the workers that have said where they were placed since the last call. One
        that died before it said so has no line; its replacement's names how it was lost."""
        if not self._placing:
            return
        ready = set(ray.wait([ref for ref, _ in self._placing], num_returns=len(self._placing), timeout=0)[0])
        placed = []
        for ref, line in self._placing:
            if ref in ready:
                try:
                    placed.append({**line, **ray.get(ref)})
                except RayError:  # died first: _lose says how, and the replacement's line
                    pass
        self._placing = [(ref, line) for ref, line in self._placing if ref not in ready]
        self.where.update((w["actor"], f"{w['node_ip']} (id {w['node_id']})") for w in placed)
        if placed:
            append_workers(self._run_dir, placed)

    def node_ids(self) -> list[int]:
        return list(self._nodes)

    def execute(self, messages: Sequence[Message], timeout: float | None = None) -> list[Message]:
        """The replies to ``messages``, in their order: a worker's own, or for each message of a batch whose
        worker was lost meanwhile an error reply saying how; none for a batch still running after ``timeout``
        seconds (that worker is stopped); for each message of a worker that no node takes (PLACE_S), an error reply
        saying so. A lost worker is replaced before its next batch. A cluster head that does not answer, before
        the batches or once one is lost, raises ClusterLost."""
        self._check_head()  # one connection: a head holding none of the workers is seen gone here
        self._replace_lost()
        batches: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            batches.setdefault(self.owner[m.metadata.dst_node_id], []).append(i)
        replies: dict[int, Message] = {}
        unplaced = self._unplaced(batches)
        reason = self._unplaced_reason()
        for i in (i for a in unplaced for i in batches.pop(a)):
            replies[i] = wire.failure_reply(messages[i], reason, wire.CLIENT_APP_CRASHED)
        futures = {a: self.actors[a].execute.remote([messages[i] for i in idx]) for a, idx in batches.items()}
        ready = self._wait(futures, timeout)
        for a, future in futures.items():
            idx = batches[a]
            if future not in ready:  # the round loop finds these replies missing and says after how long
                self._lose(a, f"their Ray worker sent no reply within train.round_timeout_s = {timeout:g} s")
                continue
            try:
                replies.update(zip(idx, ray.get(future), strict=True))
            except RayError as err:
                self._lose(a, how_lost(err, self.where.get(a)))
                replies.update((i, wire.failure_reply(messages[i], self.lost[a], wire.CLIENT_APP_CRASHED)) for i in idx)
        if self.lost:  # with the head gone, no worker can be replaced, nor any round go on
            self._check_head()
        self._record_placements()  # a worker that served its batch answered where it was placed before it
        return [replies[i] for i in sorted(replies)]

    def _check_head(self) -> None:
        if gone := head_gone(ray.get_runtime_context().gcs_address):  # this driver's own record of it
            self.head_lost = True
            raise ClusterLost(gone)

    def _unplaced(self, actors: Iterable[int]) -> set[int]:
        """Of ``actors``, those whose worker no node has taken: one started since it was last asked about is
        given PLACE_S to be taken, one already past its PLACE_S is asked once."""
        waiting = [a for a in actors if a in self.placing]
        deadline = time.monotonic() + (PLACE_S if set(waiting) - self.unplaced else 0.0)
        while True:
            self.placing -= {a for a in waiting if on_a_node(self.actors[a])}
            waiting = [a for a in waiting if a in self.placing]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(PLACE_POLL_S)
        if new := sorted(set(waiting) - self.unplaced):
            clients = ", ".join(str(p) for a in new for p in self.partitions[a])
            to = "the pool's other workers serve them from now on, their client state (Context.state) starting empty"
            warnings.warn(
                f"clients {clients}: {self._unplaced_reason()}; "
                f"{to if self._shrink(new) else 'the run goes on without them until a node takes it'}",
                UnplacedWorker,
                stacklevel=3,
            )
        self.unplaced = ((self.unplaced & self.placing) | set(waiting)) - self.gone
        return set(waiting)

    def _shrink(self, unplaced: list[int]) -> bool:
        """Stop the queued workers of ``unplaced`` and hand their clients to the placed ones, round robin; False
        (nothing done) when no worker is placed."""
        placed = [a for a in range(len(self.actors)) if a not in self.placing | self.gone | self.lost.keys()]
        if not placed:
            return False
        for a in unplaced:
            ray.kill(self.actors[a])
            for i, p in enumerate(self.partitions[a]):
                to = placed[i % len(placed)]
                self.actors[to].adopt.remote([p])  # before its next batch: an actor runs its calls in order
                self.partitions[to].append(p)
                self.owner[node_id_of(p)] = to
            self.partitions[a] = []
        self.gone |= set(unplaced)
        self.placing -= self.gone
        return True

    def _unplaced_reason(self) -> str:
        res = self._actor_resources
        return (
            f"no node of the Ray cluster took their Ray worker within {PLACE_S:g} s (none has room for "
            f"simulation.client_resources: num_cpus {res.num_cpus:g}, num_gpus {res.num_gpus:g})"
        )

    def _wait(self, futures: dict[int, ObjectRef], timeout: float | None) -> set[ObjectRef]:
        """The batches done within ``timeout`` seconds, or a new worker's first within START_S more: its start-up
        (its process, imports and data) is not the round's, or a replacement slower to start than a round
        would be replaced again every round."""
        ready = self._wait_for(list(futures.values()), timeout)
        if starting := [f for a, f in futures.items() if a in self.starting and f not in ready]:
            ready |= self._wait_for(starting, START_S)
        self.starting -= futures.keys()
        return ready

    def _wait_for(self, refs: list[ObjectRef], timeout: float | None) -> set[ObjectRef]:
        """Those of ``refs`` done within ``timeout`` seconds (None: all of them), the head asked after each
        HEAD_POLL_S still waiting: a head lost while workers on other nodes run on is seen within the round."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ready: set[ObjectRef] = set()
        while refs:
            step = HEAD_POLL_S if deadline is None else min(HEAD_POLL_S, max(deadline - time.monotonic(), 0.0))
            try:
                done, refs = ray.wait(refs, num_returns=len(refs), timeout=step)
            except OSError as err:  # this driver's own node is gone (Broken pipe): with the head, or alone
                self._check_head()
                raise ClusterLost(f"this process's Ray node went away ({type(err).__name__}: {err})") from None
            ready.update(done)
            if not refs or (deadline is not None and time.monotonic() >= deadline):
                break
            self._check_head()
        return ready

    def _lose(self, a: int, how: str) -> None:
        """Stop worker ``a`` (one that raised or hangs still runs, its clients' state no longer what the server
        knows of them) for a fresh one before its next batch; ``how`` it was lost."""
        ray.kill(self.actors[a])
        self.lost[a] = how

    def _replace_lost(self) -> None:
        for a, how in sorted(self.lost.items()):
            self.actors[a] = self._start(a, replaces=how)
            self.starting.add(a)
            self.placing.add(a)
            clients = ", ".join(map(str, self.partitions[a]))
            warnings.warn(
                f"clients {clients}: {how}; a new one serves them, their client state (Context.state) starting empty",
                ReplacedWorker,
                stacklevel=2,
            )
        self.lost.clear()

    def shutdown(self) -> None:
        try:
            self._record_placements()
            # each worker removes its spilled states, all at once; a worker queued or stopped has no process to
            # ask. After a head was lost, briefly: Ray ends this driver a minute after its GCS went
            asked = [a for i, a in enumerate(self.actors) if i not in self.unplaced | self.gone]
            closing = [a.close.remote() for a in asked]
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_LOST_S if self.head_lost else CLOSE_S)
            for a in self.actors:
                with contextlib.suppress(Exception):  # one already gone has nothing left to stop
                    ray.kill(a)
            self.actors = []
        finally:  # a process left joined to a cluster is ended by Ray when that cluster stops
            if self._owns_ray:  # stops a Ray started here; from a joined cluster, only disconnects
                ray.shutdown()
