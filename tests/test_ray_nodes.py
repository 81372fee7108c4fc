"""Two Ray nodes that share nothing but a network: the head in one network namespace, a worker node
(``ray start --address``) in another, joined by a veth pair on a private /24, each with its own CPUs, object
store and temp dir; the data at the same path on both. ``fedsim run`` with ``simulation.ray_address`` (run in
the head's namespace: nothing listens on this host's own network) places the pool's workers on both nodes, as
each worker's line of ``workers.jsonl`` says from Ray's view inside it, and gives the inline run's metrics
bit for bit. Nodes are stopped as tests/test_ray_cluster.py stops its head, never with ``ray stop``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fedsim.engines.runner import OFFLINE_ENV
from fedsim.record.reader import read_workers
from tests.conftest import REPO, ip_command, small_config
from tests.test_engines import metrics_of
from tests.test_lost_workers import metrics
from tests.test_ray_cluster import RAY_CLI, stop_node

PORT = 6379  # Ray's own default: each namespace is a network of its own, where nothing else listens
NODE_WAIT_S = 300  # a node's start on a loaded 2-core machine took 15-40 s


@dataclass
class Cluster:
    namespace: str  # the head's network namespace, where a driver must run to reach it
    address: str  # the head's GCS, host:port
    ips: tuple[str, str]  # the head's address, the worker node's


@contextlib.contextmanager
def linked_namespaces() -> Iterator[tuple[list[str], list[str]]]:
    """Two network namespaces joined by a veth pair: ([namespace, address] of each)."""
    tag = os.getpid() % 10000
    subnet = f"10.232.{tag % 250}"
    ends = [[f"frn{tag}a", f"{subnet}.1"], [f"frn{tag}b", f"{subnet}.2"]]
    made = []
    try:
        for ns, _ in ends:
            ip_command("netns", "add", ns)
            made.append(ns)
    except (PermissionError, FileNotFoundError) as err:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"this machine forbids network namespaces ({err}): the two-node test needs them")
    try:
        (a, _), (b, _) = ends
        ip_command("link", "add", f"{a}v", "type", "veth", "peer", "name", f"{b}v")
        for ns, address in ends:
            ip_command("link", "set", f"{ns}v", "netns", ns)
            ip_command("netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", f"{ns}v")
            ip_command("netns", "exec", ns, "ip", "link", "set", f"{ns}v", "up")
            ip_command("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ends[0], ends[1]
    finally:
        for ns in made:  # the veth pair goes with its ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_namespace(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


@contextlib.contextmanager
def ray_node(ns: str, address: str, head: str | None, temp_dir: Path) -> Iterator[None]:
    """``ray start --block`` in namespace ``ns`` on ``address``, one CPU and a small object store: the head
    (``head`` None) or a worker node joining ``head``; stopped with every process of its node."""
    role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if head is None else [f"--address={head}"]
    args = ["start", "--block", *role, f"--node-ip-address={address}", "--num-cpus=1", "--num-gpus=0"]
    args += ["--object-store-memory=100000000", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(temp_dir / "flwr"), "PYTHONPATH": str(REPO)}
    with (temp_dir.parent / f"{temp_dir.name}.log").open("wb") as out:
        node = subprocess.Popen(
            in_namespace(ns, *RAY_CLI, *args), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield
    finally:
        stop_node(node, temp_dir)


def wait_for_nodes(ns: str, address: str, count: int) -> None:
    """Until ``count`` nodes of the cluster at ``address`` are alive, asked by a driver in namespace ``ns``."""
    probe = (
        "import sys, time, ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        f"deadline = time.monotonic() + {NODE_WAIT_S}\n"
        f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
        "    if time.monotonic() > deadline: sys.exit(f'nodes alive: {ray.nodes()}')\n"
        "    time.sleep(0.5)\n"
    )
    env = {**os.environ, **OFFLINE_ENV}
    res = subprocess.run(in_namespace(ns, sys.executable, "-c", probe), capture_output=True, text=True, env=env,
                         timeout=NODE_WAIT_S + 120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    try:
        with linked_namespaces() as ((ns_a, ip_a), (ns_b, ip_b)):
            head = f"{ip_a}:{PORT}"
            with ray_node(ns_a, ip_a, None, root / "a"), ray_node(ns_b, ip_b, head, root / "b"):
                # the worker node retries until the head answers: both may start at once
                wait_for_nodes(ns_a, head, 2)
                yield Cluster(ns_a, head, (ip_a, ip_b))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.hosts
def test_a_run_places_its_workers_on_both_nodes_and_gives_the_inline_metrics(
    two_nodes: Cluster, tmp_path: Path
) -> None:
    inline = metrics_of(tmp_path, "inline")
    raw = small_config(
        tmp_path,
        name="nodes",
        output={"run_dir": str(tmp_path / "nodes"), "progress": False},
        simulation={"backend": "ray", "ray_address": two_nodes.address, "client_resources": {"num_cpus": 1}},
    )
    config = tmp_path / "nodes.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(tmp_path / "flwr"), "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    res = subprocess.run(
        in_namespace(two_nodes.namespace, sys.executable, "-m", "fedsim.app.cli", "run", str(config)),
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert time.monotonic() - started < 900

    workers = read_workers(tmp_path / "nodes")
    # a CPU each on one-CPU nodes: one worker per node, each seen there by Ray
    assert sorted((w["actor"], w["clients"]) for w in workers) == [(0, [0, 2]), (1, [1, 3])]
    assert sorted(w["node_ip"] for w in workers) == sorted(two_nodes.ips)
    assert len({w["node_id"] for w in workers}) == 2
    assert metrics(tmp_path / "nodes") == inline
