"""GPU shares placed as Ray places them, on a machine without a GPU: a Ray head declaring two GPUs
(``ray start --num-gpus 2``), clients asking a quarter of one each, the arithmetic on the CPU
(``simulation.device: cpu``); where each worker ran is read back from the run's ``workers.jsonl``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.record.reader import read_workers
from tests.conftest import small_config
from tests.test_engines import metrics_of
from tests.test_ray_cluster import Head, started_head

CLIENTS = 8  # one per worker: 8 CPUs at 1 each, and 2 GPUs at a quarter each, hold 8


@pytest.fixture(scope="module")
def gpu_head() -> Iterator[Head]:
    with started_head(num_cpus=8, num_gpus=2) as head:
        yield head


def on_gpu_shares(address: str, num_gpus: float) -> dict[str, Any]:
    return {
        "train": {"num_clients": CLIENTS},
        "simulation": {
            "backend": "ray",
            "ray_address": address,
            "device": "cpu",
            "client_resources": {"num_cpus": 1, "num_gpus": num_gpus},
        },
    }


@pytest.mark.slow
@pytest.mark.long
def test_quarter_gpus_place_four_workers_on_each_declared_gpu(gpu_head: Head, tmp_path: Path) -> None:
    inline = metrics_of(tmp_path, "inline", train={"num_clients": CLIENTS})

    metrics = metrics_of(tmp_path, "shares", **on_gpu_shares(gpu_head.address, 0.25))

    assert metrics == inline  # the arithmetic stayed on the CPU, as inline
    (run_dir,) = (tmp_path / "runs").glob("shares-*")
    workers = read_workers(run_dir)
    assert sorted(w["actor"] for w in workers) == list(range(CLIENTS))
    assert all(w["clients"] == [w["actor"]] and w["replaces"] is None for w in workers)
    assert len({w["pid"] for w in workers}) == CLIENTS  # a process each
    assert len({w["node_id"] for w in workers}) == 1  # the head, the cluster's one node
    assert Counter(tuple(w["gpu_ids"]) for w in workers) == {(0,): 4, (1,): 4}
    assert all(w["cuda_visible_devices"] == str(w["gpu_ids"][0]) for w in workers)  # Ray's own setting
    assert {w["device"] for w in workers} == {"cpu"}


@pytest.mark.slow
@pytest.mark.long  # a second of its own, but beside the test above in the queue: one worker starts the head once
def test_gpu_shares_no_node_holds_are_refused_before_round_one(gpu_head: Head, tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, **on_gpu_shares(gpu_head.address, 3)))

    with pytest.raises(ConfigError) as refused:
        run(cfg)

    assert str(refused.value) == (
        "simulation.client_resources (num_cpus 1, num_gpus 3) fit on no node of the Ray cluster (its nodes: "
        "8 CPUs, 2 GPUs); ask for less"
    )
    assert not ray.is_initialized()  # disconnected again
    assert not list((tmp_path / "runs").iterdir())  # the run directory it made, taken back
