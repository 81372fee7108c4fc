"""fedsim.engines.ray_pool's arithmetic and its reading of Ray's tables, without a Ray instance (Ray's node and
actor tables given): how many workers the cluster's nodes fit, and when a node has taken a worker. The pool's
runs (workers lost, replaced, unplaced; a head lost) are end-to-end tests: tests/test_lost_workers.py,
tests/test_ray_cluster.py, tests/test_ray_nodes.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fedsim.config import SimulationConfig
from fedsim.engines import ray_pool
from fedsim.errors import ConfigError


def test_pool_counts_what_fits_node_by_node(monkeypatch: pytest.MonkeyPatch) -> None:
    head = {"Alive": True, "Resources": {"CPU": 16.0}}  # no GPU: holds no GPU client, whatever its CPUs
    gpu_node = {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 4.0}}
    gone = {"Alive": False, "Resources": {"CPU": 16.0, "GPU": 4.0}}
    monkeypatch.setattr(ray_pool.ray, "nodes", lambda: [head, gpu_node, gone])

    def size(num_cpus: float, num_gpus: float, clients: int = 100) -> int:
        sim = SimulationConfig(client_resources={"num_cpus": num_cpus, "num_gpus": num_gpus})
        return ray_pool.pool_size(sim, clients)

    assert size(2, 0.25) == 8  # the GPU node: min(16 / 2, 4 / 0.25); cluster totals would say 16
    assert size(1, 0.1) == 16  # 4 / 0.1 = 40 GPU slots, 16 CPUs
    assert size(2, 0) == 16  # CPU clients on both live nodes
    assert size(2, 0, clients=5) == 5  # at most one per client
    with pytest.raises(ConfigError, match=r"simulation\.client_resources\b"):
        size(1, 8)  # more GPUs than any node has


def test_pool_counts_a_tenth_of_a_gpu_as_ten_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """1.0 // 0.1 is 9.0 in floats: a GPU holds ten clients of a tenth, not nine."""
    monkeypatch.setattr(ray_pool.ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 64.0, "GPU": 1.0}}])
    sim = SimulationConfig(client_resources={"num_cpus": 1, "num_gpus": 0.1})
    assert ray_pool.pool_size(sim, 100) == 10


@pytest.mark.parametrize(
    ("entry", "taken"),
    [
        ({"State": "PENDING_CREATION", "Pid": 0}, False),  # queued: the GCS offers it to a node, none took it yet
        ({"State": "PENDING_CREATION"}, False),
        ({"State": "PENDING_CREATION", "Pid": 4242}, True),  # its worker process starting on a node
        ({"State": "ALIVE", "Pid": 4242}, True),
        ({"State": "DEAD", "Pid": 0}, True),  # a dead one counts as taken: its batch fails at once
    ],
)
def test_a_worker_is_on_a_node_once_the_gcs_gives_it_a_process(
    monkeypatch: pytest.MonkeyPatch, entry: dict[str, Any], taken: bool
) -> None:
    from ray._private import state

    asked: list[str] = []
    monkeypatch.setattr(state, "actors", lambda actor_id: asked.append(actor_id) or entry)
    actor = SimpleNamespace(_actor_id=SimpleNamespace(hex=lambda: "ab12"))
    assert ray_pool.on_a_node(actor) is taken  # type: ignore[arg-type]
    assert asked == ["ab12"]
