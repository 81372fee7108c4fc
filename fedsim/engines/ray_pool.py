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

Each worker, as it starts, says where Ray placed it (its node, the GPUs Ray assigned it, the
``CUDA_VISIBLE_DEVICES`` Ray set, the device torch computes on); the pool appends that to the run's
``workers.jsonl`` (:class:`fedsim.record.schemas.WorkerRecord`), a replacement's line naming how the worker it
took over from was lost.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
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
from fedsim.engines.ray_cluster import init_ray
from fedsim.errors import ConfigError, FedsimWarning
from fedsim.record.writer import append_workers

START_S = 600.0  # a new worker's time to start, as discovery (fedsim.server.discovery) gives every node


class ReplacedWorker(FedsimWarning):
    """A Ray worker of the pool was lost and a fresh one serves its clients, their client state empty."""


class _Worker:
    def __init__(self, run_id: int, partitions: list[int], num_partitions: int, state_memory_mb: float) -> None:
        from fedsim.client.app import app  # imported in the actor's process

        self.app = app
        self.nodes = node_states(run_id, partitions, num_partitions, state_memory_mb)

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
        self._placing: list[tuple[ObjectRef, dict[str, Any]]] = []  # workers' placements, workers.jsonl's lines
        self._owns_ray = init_ray(sim)
        try:
            size = pool_size(sim, num_partitions)
        except ConfigError:
            self.actors = []
            self.shutdown()
            raise
        res = sim.client_resources
        self._actor = ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus)(_Worker)
        self._args = (run_id, num_partitions, sim.state_memory_mb / size)  # the memory budget is the whole pool's
        self.partitions = [list(range(a, num_partitions, size)) for a in range(size)]
        self.owner = {node_id_of(p): a for a, ps in enumerate(self.partitions) for p in ps}
        self.actors: list[ActorHandle] = [self._start(a) for a in range(size)]
        self.lost: dict[int, str] = {}  # actor -> how its worker was lost; replaced before its next batch
        self.starting = set(range(size))  # actors whose first batch is still to come
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
        if placed:
            append_workers(self._run_dir, placed)

    def node_ids(self) -> list[int]:
        return list(self._nodes)

    def execute(self, messages: Sequence[Message], timeout: float | None = None) -> list[Message]:
        """The replies to ``messages``, in their order: a worker's own, or for each message of a batch whose
        worker was lost meanwhile an error reply saying how; none for a batch still running after ``timeout``
        seconds (that worker is stopped). A lost worker is replaced before its next batch."""
        self._replace_lost()
        batches: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            batches.setdefault(self.owner[m.metadata.dst_node_id], []).append(i)
        futures = {a: self.actors[a].execute.remote([messages[i] for i in idx]) for a, idx in batches.items()}
        ready = self._wait(futures, timeout)
        replies: dict[int, Message] = {}
        for a, future in futures.items():
            idx = batches[a]
            if future not in ready:  # the round loop finds these replies missing and says after how long
                self._lose(a, f"their Ray worker sent no reply within train.round_timeout_s = {timeout:g} s")
                continue
            try:
                replies.update(zip(idx, ray.get(future), strict=True))
            except RayError as err:
                self._lose(a, how_lost(err))
                replies.update((i, wire.failure_reply(messages[i], self.lost[a], wire.CLIENT_APP_CRASHED)) for i in idx)
        self._record_placements()  # a worker that served its batch answered where it was placed before it
        return [replies[i] for i in sorted(replies)]

    def _wait(self, futures: dict[int, ObjectRef], timeout: float | None) -> set[ObjectRef]:
        """The batches done within ``timeout`` seconds, or a new worker's first within START_S more: its start-up
        (its process, imports and data) is not the round's, or a replacement slower to start than a round
        would be replaced again every round."""
        ready = set(ray.wait(list(futures.values()), num_returns=len(futures), timeout=timeout)[0] if futures else [])
        if starting := [f for a, f in futures.items() if a in self.starting and f not in ready]:
            ready |= set(ray.wait(starting, num_returns=len(starting), timeout=START_S)[0])
        self.starting -= futures.keys()
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
            clients = ", ".join(map(str, self.partitions[a]))
            warnings.warn(
                f"clients {clients}: {how}; a new one serves them, their client state (Context.state) starting empty",
                ReplacedWorker,
                stacklevel=2,
            )
        self.lost.clear()

    def shutdown(self) -> None:
        self._record_placements()
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=30)  # its spilled states
            except Exception:  # noqa: BLE001 (an actor that died has nothing left to remove)
                pass
            ray.kill(a)
        self.actors = []
        if self._owns_ray:  # stops a Ray started here; from a joined cluster, only disconnects
            ray.shutdown()
