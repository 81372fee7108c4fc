"""Two Ray nodes that share nothing but a network: the head in one network namespace, a worker node
(``ray start --address``) in another, joined by a veth pair on a private /24, each with its own CPUs, object
store and temp dir; the data at the same path on both. ``fedsim run`` with ``simulation.ray_address`` (run in
the head's namespace: nothing listens on this host's own network) places the pool's workers on both nodes, as
each worker's line of ``workers.jsonl`` says from Ray's view inside it, and gives the inline run's metrics
bit for bit. Nodes are stopped as tests/test_ray_cluster.py stops its head, never with ``ray stop``."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.config import RAY_HEAD_WAIT_S
from fedsim.engines.ray_pool import CLOSE_LOST_S, HEAD_POLL_S, PLACE_S
from fedsim.engines.runner import OFFLINE_ENV
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.reader import read_workers
from tests.conftest import REPO, ip_command, small_config, write_config
from tests.fault_lines import assert_said, fault_line, said_lines
from tests.plugins.dying_worker import WORKER_END
from tests.test_engines import metrics_of
from tests.test_lost_workers import finished, lost_config, metrics, stopped_in_round_3, uninterrupted
from tests.test_ray_cluster import RAY_CLI, stop_node

PORT = 6379  # Ray's own default: each namespace is a network of its own, where nothing else listens
NODE_WAIT_S = 300  # a node's start on a loaded 2-core machine took 15-40 s


@dataclass
class Cluster:
    namespace: str  # the head's network namespace, where a driver must run to reach it
    address: str  # the head's GCS, host:port
    ips: tuple[str, str]  # the head's address, the worker node's


_PAIRS = itertools.count()


@contextlib.contextmanager
def linked_namespaces() -> Iterator[tuple[list[str], list[str]]]:
    """Two network namespaces joined by a veth pair: ([namespace, address] of each)."""
    tag = f"{os.getpid() % 10000}{next(_PAIRS)}"  # a pair of names per call: the module's cluster and a test's
    subnet = f"10.232.{os.getpid() % 250}"  # each namespace is a network of its own: pairs may share it
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
def ray_node(ns: str, address: str, head: str | None, temp_dir: Path, **env: str) -> Iterator[None]:
    """``ray start --block`` in namespace ``ns`` on ``address``, one CPU and a small object store: the head
    (``head`` None) or a worker node joining ``head``, its workers given ``env`` too; stopped with every process
    of its node."""
    role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if head is None else [f"--address={head}"]
    args = ["start", "--block", *role, f"--node-ip-address={address}", "--num-cpus=1", "--num-gpus=0"]
    args += ["--object-store-memory=100000000", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(temp_dir / "flwr"), "PYTHONPATH": str(REPO), **env}
    with (temp_dir.parent / f"{temp_dir.name}.log").open("wb") as out:
        node = subprocess.Popen(
            in_namespace(ns, *RAY_CLI, *args), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield
    finally:
        stop_node(node, temp_dir)


def wait_for_nodes(ns: str, address: str, count: int) -> None:
    """Until ``count`` nodes of the cluster at ``address`` are alive (a lost node counts until the head has
    marked it dead), asked by a driver in namespace ``ns``."""
    probe = (
        "import sys, time, ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        f"deadline = time.monotonic() + {NODE_WAIT_S}\n"
        f"while sum(n['Alive'] for n in ray.nodes()) != {count}:\n"
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


@dataclass
class LosingCluster:
    """A head and a worker node whose workers hang as they begin round :data:`LOST_IN`, for the test to kill
    the worker node then; ``heal`` starts a worker node again in its namespace."""

    cluster: Cluster
    worker_namespace: str
    pids: Path  # where the hanging worker writes its process id
    heal: Callable[[], None]

    def lose_worker_node(self, run: subprocess.Popen[str]) -> None:
        """Once the worker node's worker hangs in round LOST_IN of ``run``, SIGKILL every process of the node."""
        self._lose_node(run, self.worker_namespace)

    def lose_head(self, run: subprocess.Popen[str]) -> None:
        """Once the worker node's worker hangs in round LOST_IN of ``run``, SIGKILL every process of the head's
        node: every process of its namespace but ``run``, the driver."""
        self._lose_node(run, self.cluster.namespace)

    def _lose_node(self, run: subprocess.Popen[str], namespace: str) -> None:
        deadline = time.monotonic() + 600
        while not any(self.pids.glob("*.pid")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.1)
        # until none is left: a raylet being killed may still start an agent, which no machine gone would
        deadline = time.monotonic() + 60
        while pids := [p for p in namespace_pids(namespace) if not descends_from(p, run.pid)]:
            assert time.monotonic() < deadline, pids
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

def namespace_pids(namespace: str) -> list[int]:
    """The processes of network namespace ``namespace`` still running (not zombies)."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    return [p for p in map(int, pids) if proc_stat(p)[0] not in ("Z", "gone")]


def proc_stat(pid: int) -> tuple[str, int]:
    """A process's state letter and parent's pid (("gone", 0) once it ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return "gone", 0
    return fields[0], int(fields[1])


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        pid = proc_stat(pid)[1]
    return False


LOST_IN = 3  # the round in which the worker node is lost (tests.test_lost_workers.stopped_in_round_3)


@pytest.fixture
def losing_cluster(tmp_path: Path) -> Iterator[LosingCluster]:
    root = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    pids = tmp_path / "pids"
    pids.mkdir()
    try:
        with linked_namespaces() as ((ns_a, ip_a), (ns_b, ip_b)), contextlib.ExitStack() as nodes:
            head = f"{ip_a}:{PORT}"
            nodes.enter_context(ray_node(ns_a, ip_a, None, root / "a"))
            nodes.enter_context(ray_node(ns_b, ip_b, head, root / "b", **{WORKER_END: f"{LOST_IN}:*:hang:{pids}"}))
            wait_for_nodes(ns_a, head, 2)

            def heal() -> None:
                wait_for_nodes(ns_a, head, 1)  # the lost node marked dead: a pool sized now would count it
                nodes.enter_context(ray_node(ns_b, ip_b, head, root / "healed"))
                wait_for_nodes(ns_a, head, 2)

            yield LosingCluster(Cluster(ns_a, head, (ip_a, ip_b)), ns_b, pids, heal)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fedsim_in(cluster: Cluster, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``fedsim ARGS`` in the head's namespace, in a process of its own."""
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(tmp_path / "flwr"), "PYTHONPATH": str(REPO)}
    env.pop(WORKER_END, None)
    cmd = in_namespace(cluster.namespace, sys.executable, "-m", "fedsim.app.cli", *args)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def node_lost_config(tmp_path: Path, cluster: Cluster, strategy: str, policy: str) -> Path:
    raw = lost_config(tmp_path, {}, strategy, on_client_failure=policy, rounds=5)
    raw["simulation"] = {"backend": "ray", "ray_address": cluster.address, "client_resources": {"num_cpus": 1}}
    return write_config(tmp_path, raw)


def lost_worker(run_dir: Path, ip: str) -> dict[str, Any]:
    """The line of ``workers.jsonl`` of the worker that ran on the node at ``ip``."""
    (worker,) = [w for w in read_workers(run_dir) if w["node_ip"] == ip]
    return worker


@pytest.mark.hosts
def test_skip_goes_on_with_the_remaining_node_serving_all(losing_cluster: LosingCluster, tmp_path: Path) -> None:
    cluster = losing_cluster.cluster
    config = node_lost_config(tmp_path, cluster, "DyingFedAvg", "skip")
    started = time.monotonic()
    run = fedsim_in(cluster, tmp_path, "run", str(config))
    losing_cluster.lose_worker_node(run)
    code, err = finished(run)
    assert code == 0, err[-3000:]
    # the replacement's wait for a node, PLACE_S, once (each of rounds 3-5 waiting would add 2 more); then the
    # head's worker serves every client
    assert time.monotonic() - started < 2 * PLACE_S + 240, err[-3000:]

    lost = lost_worker(tmp_path / "run", cluster.ips[1])
    clients = lost["clients"]
    lines = metrics(tmp_path / "run")
    assert [m["round"] for m in lines] == [1, 2, 3, 4, 5]
    assert [m.get("failed_clients") for m in lines] == [None, None, {str(LOST_IN): clients}, None, None]
    assert all(acc is not None for m in lines[LOST_IN:] for acc in m["client_acc"])
    assert Checkpoint.load(tmp_path / "run").round == 4  # the lost clients' state saved by the head's worker
    said = said_lines(err)
    listed = ", ".join(map(str, clients))
    where = rf"on node {re.escape(cluster.ips[1])} \(id {lost['node_id']}\)"
    assert len(said) == 3, err[-3000:]
    assert_said("worker died, replaced", said[0], clients=listed, node=where + " ", error=r"Actor\w*Error")
    assert_said("worker unplaced", said[1], clients=listed, within=f"{PLACE_S:g}", resources="num_cpus 1, num_gpus 0")
    assert_said("rounds skipped", said[2], rounds=f"round {LOST_IN}: {listed}")
    assert "Traceback" not in err


@pytest.mark.hosts
def test_fail_names_the_lost_node_and_resume_on_the_healed_cluster_finishes_the_run(
    losing_cluster: LosingCluster, tmp_path: Path
) -> None:
    cluster = losing_cluster.cluster
    config = node_lost_config(tmp_path, cluster, "DyingScaffold", "fail")  # SCAFFOLD: client state restored
    run = fedsim_in(cluster, tmp_path, "run", str(config))
    losing_cluster.lose_worker_node(run)
    code, err = finished(run)
    assert code == 2, err[-3000:]
    run_dir = tmp_path / "run"
    lost = lost_worker(run_dir, cluster.ips[1])
    node = rf"on node {re.escape(cluster.ips[1])} \(id {lost['node_id']}\) "
    stopped_in_round_3(err, run_dir, f"clients {', '.join(map(str, lost['clients']))}", node)

    losing_cluster.heal()
    code, err = finished(fedsim_in(cluster, tmp_path, "run", "--resume", str(run_dir)))
    assert code == 0, err[-3000:]
    assert metrics(run_dir) == uninterrupted(tmp_path, yaml.safe_load(config.read_text()))
    resumed = read_workers(run_dir)[-2:]  # the resumed pool's workers, on both nodes again
    assert sorted(w["node_ip"] for w in resumed) == sorted(cluster.ips) and not any(w["replaces"] for w in resumed)


@pytest.mark.hosts
def test_a_head_lost_while_the_round_waits_on_the_worker_node_stops_in_one_line(
    losing_cluster: LosingCluster, tmp_path: Path
) -> None:
    # the head's worker ends with its node, the worker node's hangs on: the pool sees the head gone from its wait
    # (HEAD_POLL_S), not from the hanging worker, and stops before Ray's own minute ends the driver
    cluster = losing_cluster.cluster
    run = fedsim_in(cluster, tmp_path, "run", str(node_lost_config(tmp_path, cluster, "DyingFedAvg", "skip")))
    losing_cluster.lose_head(run)
    lost = time.monotonic()
    code, err = finished(run)
    assert code == 2, err[-3000:]
    assert time.monotonic() - lost < HEAD_POLL_S + RAY_HEAD_WAIT_S + CLOSE_LOST_S + 30, err[-3000:]
    (line,) = err.splitlines()  # no traceback, none of Ray's lines
    assert_said("head lost", line, round=LOST_IN, gcs=re.escape(cluster.address), within=f"{RAY_HEAD_WAIT_S:g}",
                why=".+", kept=fault_line("checkpoint kept", round=2, run_dir=".+"))  # fmt: skip
    assert [m["round"] for m in metrics(tmp_path / "run")] == [1, 2]
    # a worker node whose head is gone keeps its agents retrying the GCS, deaf to SIGTERM, for over a minute:
    # what stays of the cluster is ended as a lost node
    losing_cluster.lose_worker_node(run)
