"""A pool of Ray actors that serves the local engine's Messages in parallel.

Each actor owns a fixed set of nodes (partition p goes to actor p mod A), so it decodes the data
and builds the model once and keeps every one of its nodes' ``Context`` across rounds. A round
sends each actor one batch of Messages and waits on the futures: no polling anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import ray
from flwr.app import Message

from fedsim.config import SimulationConfig
from fedsim.engines.local import handle, node_context, node_id_of


class _Worker:
    def __init__(self, run_id: int, partitions: list[int], num_partitions: int) -> None:
        from fedsim.client_app import app  # imported in the actor's process

        self.app = app
        self.contexts = {node_id_of(p): node_context(run_id, p, num_partitions) for p in partitions}

    def execute(self, messages: list[Message]) -> list[Message]:
        return [handle(self.app, m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def pool_size(sim: SimulationConfig, num_clients: int) -> int:
    """As many actors as the cluster's resources fit at ``client_resources`` each, at most one per client."""
    res = ray.cluster_resources()
    fits = int(res.get("CPU", 1) // sim.client_resources.num_cpus)
    if sim.client_resources.num_gpus > 0:
        fits = min(fits, int(res.get("GPU", 0) // sim.client_resources.num_gpus))
    return max(1, min(fits, num_clients))


class RayPoolExecutor:
    def __init__(self, sim: SimulationConfig, run_id: int, num_partitions: int) -> None:
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(
                address=sim.ray_address,
                include_dashboard=False,
                log_to_driver=True,
                logging_level="warning",
                configure_logging=False,
            )
        size = pool_size(sim, num_partitions)
        actor = ray.remote(num_cpus=sim.client_resources.num_cpus, num_gpus=sim.client_resources.num_gpus)(_Worker)
        self.owner = {node_id_of(p): p % size for p in range(num_partitions)}
        self.actors = [
            actor.remote(run_id, list(range(a, num_partitions, size)), num_partitions) for a in range(size)
        ]
        self._nodes = [node_id_of(p) for p in range(num_partitions)]

    def node_ids(self) -> list[int]:
        return list(self._nodes)

    def execute(self, messages: Sequence[Message]) -> list[Message]:
        batches: dict[int, list[Message]] = {}
        for m in messages:
            batches.setdefault(self.owner[m.metadata.dst_node_id], []).append(m)
        futures = [self.actors[a].execute.remote(batch) for a, batch in batches.items()]
        return [reply for replies in ray.get(futures) for reply in replies]

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._owns_ray:  # a cluster we joined or a caller's session stays up
            ray.shutdown()
