"""``simulation.ray_address``: a run joins a Ray cluster that this module starts with ``ray start --head``.

The head runs in its own process group under ``ray start --block``, whose SIGTERM stops every
process of the node; ``ray stop`` is not used because it kills every Ray instance on the machine.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from fedsim.config import RAY_HEAD_WAIT_S, RAY_PROBE_TIMEOUT_S, SimulationConfig
from fedsim.config_file import parse_config
from fedsim.engines.ray_address import check_ray_address
from fedsim.engines.ray_cluster import RAY_SERVICES, head_gone, init_ray, workers_only
from fedsim.engines.runner import OFFLINE_ENV, run
from fedsim.errors import ConfigError
from fedsim.ports import free_port, free_ports
from fedsim.processes import parents
from fedsim.record.checkpoint import Checkpoint
from tests.conftest import REPO, host_address, small_config, write_config
from tests.fault_lines import assert_said, fault_line
from tests.plugins.dying_worker import WORKER_END
from tests.test_engines import metrics_of
from tests.test_lost_workers import fedsim, finished, lost_config, metrics

RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class Head:
    address: str  # the GCS, host:port
    temp_dir: Path
    group: int  # the process group of `ray start --block`, its node's processes

    def jobs(self) -> dict[str, Any]:
        """The cluster's job table (job id -> info): one job per driver that connected."""
        from ray._raylet import GcsClient  # no public job table without the dashboard

        return {job.job_id.hex(): job for job in GcsClient(address=self.address).get_all_job_info().values()}

    def actor_classes(self) -> set[str]:
        """Classes of the actors that ran on this node, from its own worker logs."""
        found = set()
        for log in (self.temp_dir / "session_latest" / "logs").glob("worker-*.out"):
            lines = log.read_text().splitlines()
            found |= {line.split(":actor_name:")[1].strip() for line in lines if ":actor_name:" in line}
        return found


def node_pids(group: int, temp_dir: Path) -> list[int]:
    """Processes of the node still running: its process group, or anything with its temp dir on the command line;
    not the zombies of processes killed with their parent (where PID 1 does not reap them, they stay)."""
    pids = set()
    for args in (["pgrep", "-g", str(group)], ["pgrep", "-f", f"{temp_dir}/"]):
        out = subprocess.run(args, capture_output=True, text=True).stdout
        pids |= {int(p) for p in out.split()}
    return sorted(p for p in pids if not _zombie(p))


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@contextlib.contextmanager
def started_head(num_cpus: int, num_gpus: int) -> Iterator[Head]:
    """A Ray head on this machine declaring ``num_cpus`` CPUs and ``num_gpus`` GPUs (whether it has them or not),
    in a temp dir and on ports of its own; stopped with every process of its node."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths must stay < 108 bytes
    port, client_port = free_ports(["127.0.0.1"] * 2)  # not Ray's fixed defaults: other clusters may hold them
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(temp_dir / "flwr")}  # the workers' environment
    log = temp_dir / "head.log"
    args = ["start", "--head", "--block", f"--port={port}", f"--ray-client-server-port={client_port}"]
    args += [f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    args += ["--include-dashboard=false"]
    with log.open("wb") as out:
        head = subprocess.Popen(
            [*RAY_CLI, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not (temp_dir / "ray_current_cluster").exists():  # `ray start` writes it once the node is up
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield Head(f"127.0.0.1:{port}", temp_dir, head.pid)
    finally:
        stop_node(head, temp_dir)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[Head]:
    with started_head(num_cpus=2, num_gpus=0) as head:
        yield head


def stop_node(head: subprocess.Popen[bytes], temp_dir: Path) -> None:
    head.terminate()  # `ray start --block` stops its node's processes on SIGTERM
    deadline = time.monotonic() + 60
    while (head.poll() is None or node_pids(head.pid, temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = node_pids(head.pid, temp_dir)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    head.wait()
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, "the Ray head's processes outlived it by 60 s:\n" + subprocess.run(
        ["ps", "-o", "pid,ppid,pgid,stat,args", "-p", ",".join(map(str, left))], capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def inline_metrics(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return metrics_of(tmp_path_factory.mktemp("inline"), "inline")


def on_cluster(address: str, engine: str) -> dict[str, Any]:
    sim: dict[str, Any] = {"client_resources": {"num_cpus": 1}, "ray_address": address}
    if engine == "local":
        sim["backend"] = "ray"
    return {"engine": engine, "simulation": sim}


@pytest.mark.slow
@pytest.mark.long  # with the Ray head these four share: first in the queue, where steals come last, so
# one worker runs all four and starts the head once
@pytest.mark.parametrize(("engine", "actor_class"), [("local", "_Worker"), ("flower", "ClientAppActor")])
def test_run_on_existing_cluster_matches_inline(
    ray_head: Head, inline_metrics: list[dict[str, Any]], tmp_path: Path, engine: str, actor_class: str
) -> None:
    before = ray_head.jobs()

    metrics = metrics_of(tmp_path, engine, **on_cluster(ray_head.address, engine))

    assert metrics == inline_metrics
    assert not ray.is_initialized()  # the driver disconnected...
    after = ray_head.jobs()  # ...from a cluster that is still up, where this run was one more job
    assert [after[j].driver_pid for j in after.keys() - before.keys()] == [os.getpid()]
    assert actor_class in ray_head.actor_classes()  # its clients ran in the cluster's workers


def head_lost_mid_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, policy: str
) -> tuple[int, str, float]:
    """``fedsim run`` on ``engine`` joined to a head whose own workers hang as round 3 begins; then every process
    of the head's node is SIGKILLed (as its machine going away would end them), the driver left running: its
    exit status, its stderr, and the seconds it took to end after the node went."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv(WORKER_END, f"3:*:hang:{pids}")  # for the node's workers, not for the driver
    with started_head(num_cpus=2, num_gpus=0) as head:
        raw = lost_config(tmp_path, on_cluster(head.address, engine), "DyingFedAvg", on_client_failure=policy, rounds=5)
        run = fedsim("run", str(write_config(tmp_path, raw)))
        deadline = time.monotonic() + 600
        while not any(pids.glob("*.pid")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.1)
        for pid in node_pids(head.group, head.temp_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        lost = time.monotonic()
        code, err = finished(run)
        took = time.monotonic() - lost
        assert not node_pids(head.group, head.temp_dir)  # nothing of the head's node left running
    run_dir = tmp_path / "run"
    assert [m["round"] for m in metrics(run_dir)] == [1, 2]
    assert Checkpoint.load(run_dir).round == 2 and not (run_dir / "summary.json").exists()
    return code, err, took


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_head_lost_mid_round_stops_the_run_in_one_line_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    # neither policy can go on without a head
    code, err, took = head_lost_mid_round(tmp_path, monkeypatch, "local", policy)

    assert code == 2, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]  # no traceback, none of Ray's lines, no warning of a replaced worker
    kept = fault_line("checkpoint kept", round=2, run_dir=".+")
    assert_said("head lost", lines[0], round=3, gcs=r"[\d.]+:\d+", within=f"{RAY_HEAD_WAIT_S:g}", why=".+",
                kept=kept)  # fmt: skip
    # the bound and the shutdown after it; Ray's own, a minute after the GCS went, would end it in lines of its own
    assert took < RAY_HEAD_WAIT_S + 35, took


@pytest.mark.slow
def test_a_head_lost_under_flowers_runtime_is_said_in_one_line_by_the_process_watching_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the driver shares the head's node, and Ray's core worker ends it with that node, from C++, saying nothing
    # (fedsim.engines.driver_watch): the `fedsim run` the user started says it
    code, err, took = head_lost_mid_round(tmp_path, monkeypatch, "flower", "fail")

    assert code == 2, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    run_dir = re.escape(str(tmp_path / "run"))
    kept = fault_line("checkpoint kept", round=2, run_dir=run_dir) + "; " + fault_line("metrics kept", run_dir=run_dir)
    assert_said("driver silent, head lost", lines[0], how=r"(ended with exit status \d+|was ended by SIG\w+)",
                gcs=r"[\d.]+:\d+", within=f"{RAY_HEAD_WAIT_S:g}", why=".+", kept=kept, run_dir=run_dir)  # fmt: skip
    assert took < RAY_HEAD_WAIT_S + 35, took


def watched_at_first_checkpoint(head: Head, tmp_path: Path, rounds: int) -> tuple[subprocess.Popen[str], int]:
    """``fedsim run`` under Flower's runtime on ``head``, every round evaluated, a checkpoint every 2, in
    ``tmp_path/run``, once its first checkpoint is written: the process and its driver's pid."""
    run_dir = tmp_path / "run"
    sections = {**on_cluster(head.address, "flower"), "train": {"rounds": rounds}, "eval": {"every": 1}}
    raw = small_config(tmp_path, output={"run_dir": str(run_dir), "checkpoint_every": 2}, **sections)
    run = fedsim("run", str(write_config(tmp_path, raw)))
    deadline = time.monotonic() + 600
    while not (run_dir / "checkpoint.pt").is_file():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.05)
    (driver,) = [pid for pid, parent in parents().items() if parent == run.pid]
    return run, driver


@pytest.mark.slow
@pytest.mark.long
def test_a_driver_killed_under_flowers_runtime_is_said_in_one_line_and_resumes_to_the_uninterrupted_metrics(
    ray_head: Head, tmp_path: Path
) -> None:
    # the driver SIGKILLed from outside (as the OOM killer would) while the head still answers
    uninterrupted = metrics_of(tmp_path / "inline", "inline", train={"rounds": 8}, eval={"every": 1})
    run_dir = tmp_path / "run"
    run, driver = watched_at_first_checkpoint(ray_head, tmp_path, rounds=8)
    os.kill(driver, signal.SIGKILL)
    code, err = finished(run)

    assert code == 2, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    last = Checkpoint.load(run_dir).round
    assert 2 <= last < 8 and not (run_dir / "summary.json").exists()
    where = re.escape(str(run_dir))
    kept = fault_line("checkpoint kept", round=last, run_dir=where) + "; " + fault_line("metrics kept", run_dir=where)
    assert_said("driver killed, head answers", lines[0], how="was ended by SIGKILL", gcs=r"[\d.]+:\d+", kept=kept,
                run_dir=where)  # fmt: skip

    code, err = finished(fedsim("run", "--resume", str(run_dir)))
    assert code == 0, err[-3000:]
    assert metrics(run_dir) == uninterrupted


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_to_a_watched_run_reaches_its_driver_which_says_where_it_stopped(
    ray_head: Head, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run, driver = watched_at_first_checkpoint(ray_head, tmp_path, rounds=50)
    run.send_signal(signal.SIGTERM)
    code, err = finished(run)

    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert err.endswith("\n") and err.count("\n") == 1, err  # the driver's line, once
    assert_said("interrupted after a checkpoint", err[:-1], how=fault_line("interrupted by SIGTERM"), run_dir=".+",
                kept=fault_line("metrics kept", run_dir=re.escape(str(run_dir))))  # fmt: skip
    assert not Path(f"/proc/{driver}").exists()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("engine", ["local", "flower"])
def test_no_address_starts_ray_here_even_beside_a_cluster(
    ray_head: Head, inline_metrics: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # ray.init(address=None) would join the cluster RAY_ADDRESS names (or that `ray start` left here):
    # a run that names no simulation.ray_address must not
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)
    before = ray_head.jobs()

    sections = on_cluster(ray_head.address, engine)
    del sections["simulation"]["ray_address"]
    metrics = metrics_of(tmp_path, engine, **sections)

    assert metrics == inline_metrics
    assert ray_head.jobs().keys() == before.keys()


@pytest.mark.parametrize("engine", ["local", "flower"])
def test_unreachable_address_fails_before_training(tmp_path: Path, engine: str) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    cfg = parse_config(small_config(tmp_path, **on_cluster(address, engine)))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"simulation\.ray_address\b.*'127\.0\.0\.1:\d+'"):
        run(cfg)
    assert time.monotonic() - started < 45  # a refused connection, not a Ray start or connection attempt
    assert not ray.is_initialized()
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_a_watched_drivers_own_error_is_the_one_line_said(tmp_path: Path) -> None:
    # engine flower on a cluster: `fedsim run` runs the driver as its child (fedsim.engines.driver_watch), which
    # says its own error; the watcher adds nothing
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    config = write_config(tmp_path, small_config(tmp_path, **on_cluster(address, "flower")))
    code, err = finished(fedsim("run", str(config)))
    assert code == 2
    assert re.fullmatch(rf"fedsim: error: simulation\.ray_address = '{address}': .+\n", err), err


class _NoPages(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass  # every request is answered 501, and none is worth a line in the test's output


@contextlib.contextmanager
def web_server(host: str) -> Iterator[int]:
    """A plain HTTP server (it serves no page) on ``host``; its port."""
    server = http.server.ThreadingHTTPServer((host, 0), _NoPages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_listener(host: str) -> Iterator[int]:
    """A port on ``host`` whose connections the kernel accepts and nobody ever answers."""
    with socket.socket() as listener:
        listener.bind((host, 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@contextlib.contextmanager
def old_ray_gcs(host: str, token: bool = False) -> Iterator[int]:
    """A GCS on ``host`` as Ray 1.13 serves it, as far as joining asks (its cluster id, then its versions);
    ``token``: one that refuses callers without its token, as Ray's token authentication does."""
    import grpc
    from ray.core.generated import gcs_service_pb2 as pb
    from ray.core.generated import gcs_service_pb2_grpc as rpc

    metadata = {"ray_version": "1.13.0", "python_version": platform.python_version()}

    class Nodes(rpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):  # noqa: ANN001, ANN201, N802 (gRPC's names)
            if token:  # as Ray 2.55 words it
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
            return pb.GetClusterIdReply(cluster_id=os.urandom(28))

    class Kv(rpc.InternalKVGcsServiceServicer):
        def InternalKVGet(self, request, context):  # noqa: ANN001, ANN201, N802
            return pb.InternalKVGetReply(value=json.dumps(metadata).encode())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_NodeInfoGcsServiceServicer_to_server(Nodes(), server)
    rpc.add_InternalKVGcsServiceServicer_to_server(Kv(), server)
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


# what listens, on this host's network address (where ray.init dials a GCS: it dials its own address for
# 127.0.0.1) unless on loopback; the address's form; and how fedsim refuses it ({at}: where it listens)
FOREIGN = {
    "web-server": (web_server, False, "", r"{at} answers, but not as a Ray cluster's GCS"),
    "silent": (
        silent_listener,
        False,
        "",
        rf"{{at}} gave no answer in Ray's protocol within {RAY_PROBE_TIMEOUT_S:g} s",
    ),
    "old-ray": (
        old_ray_gcs,
        False,
        "",
        r"the cluster at {at} runs Ray 1\.13\.0 on Python [\d.]+, and fedsim here Ray ",
    ),
    "web-server-ray-client": (web_server, False, "ray://", r"{at} answers, but not as a Ray Client server"),
    "gcs-as-ray-client": (old_ray_gcs, False, "ray://", r"{at} answers, but not as a Ray Client server"),
    "token-wanted": (functools.partial(old_ray_gcs, token=True), False, "", r"the cluster at {at} wants a token"),
    "web-server-on-loopback": (
        web_server,
        True,
        "",
        r"no Ray cluster answers at {at} \(Ray dials it at this host's address, [\d.]+:\d+\)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("listener", FOREIGN)
def test_an_address_that_is_not_a_ray_cluster_is_one_line_within_the_bound(tmp_path: Path, listener: str) -> None:
    """``simulation.ray_address`` at something else: the check ends within its bound (timed in this process:
    a command's start takes a minute on a busy machine), and `fedsim run`, as a user starts it, says why in one
    line naming the field (Ray's own retries took 11 minutes and heard no Ctrl-C)."""
    serve, on_loopback, scheme, cause = FOREIGN[listener]
    host = "127.0.0.1" if on_loopback else host_address()
    with serve(host) as port:
        address = f"{scheme}{host}:{port}"
        cfg = small_config(tmp_path, simulation={"backend": "ray", "ray_address": address})
        started = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            check_ray_address(parse_config(cfg))
        took = time.monotonic() - started
        cmd = [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg))]
        proc = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=RAY_PROBE_TIMEOUT_S + 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"fedsim run still waited on {address} {RAY_PROBE_TIMEOUT_S + 300:g} s later")
    assert took < RAY_PROBE_TIMEOUT_S + 5
    at = re.escape(f"{host}:{port}")
    line = rf"simulation\.ray_address = {re.escape(repr(address))}: [^\n]*{cause.format(at=at)}[^\n]*"
    assert re.fullmatch(line, str(refused.value))
    assert (proc.returncode, err) == (2, f"fedsim: error: {refused.value}\n")
    assert not (tmp_path / "runs").exists()


def test_address_with_inline_clients_is_an_error(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, simulation={"ray_address": "127.0.0.1:6379"}))
    with pytest.raises(ConfigError, match=r"simulation\.ray_address\b.*simulation\.backend: ray"):
        run(cfg)


def test_a_head_is_gone_once_nothing_answers_at_its_gcs_for_the_whole_bound() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert head_gone(address, within=5) is None
    started = time.monotonic()
    why = head_gone(address, within=1.5)
    assert time.monotonic() - started >= 1.5  # retried for the whole bound, not given up at the first refusal
    assert why is not None
    assert_said("head unanswered", why, gcs=re.escape(address), within=1.5, why="Connection refused")


def test_a_head_back_within_the_bound_is_not_gone() -> None:
    # a restarting head: its port refuses, then listens again half a second later
    with socket.create_server(("127.0.0.1", 0)) as listener:
        host, port = listener.getsockname()
    back: list[socket.socket] = []
    timer = threading.Timer(0.5, lambda: back.append(socket.create_server((host, port))))
    timer.start()
    try:
        assert head_gone(f"{host}:{port}", within=30) is None
    finally:
        timer.join()
        for server in back:
            server.close()


@pytest.mark.parametrize("address", ["localhost", "http://head:6379", "head:port"])
def test_malformed_address_fails_at_parse(tmp_path: Path, address: str) -> None:
    with pytest.raises(ConfigError, match=r"simulation\.ray_address"):
        parse_config(small_config(tmp_path, **on_cluster(address, "local")))


def forwarded(pid: int | str, line: str) -> dict[str, Any]:
    """A log line as Ray's log monitor hands it to the driver: ``pid`` a worker's, or the name of a Ray process."""
    return {"ip": "127.0.0.1", "localhost": "127.0.0.1", "pid": pid, "job": "", "is_err": True, "lines": [line],
            "actor_name": "_Worker" if isinstance(pid, int) else "", "task_name": ""}  # fmt: skip


def test_only_workers_lines_are_forwarded() -> None:
    seen: list[str] = []
    forward = workers_only(lambda data: seen.extend(data["lines"]))
    for pid in (*sorted(RAY_SERVICES), 4242):
        forward(forwarded(pid, f"from {pid}"))
    assert seen == ["from 4242"]


@pytest.mark.slow
def test_a_ray_instance_of_a_run_prints_its_workers_lines_not_its_raylets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    assert init_ray(SimulationConfig())
    try:
        capsys.readouterr()
        dispatcher.emit(forwarded("raylet", "worker.cc:237: Failed to send wait complete: RpcError"))
        dispatcher.emit(forwarded("gcs_server", "gcs_server.cc: a fatal check of Ray's"))
        dispatcher.emit(forwarded(4242, "a plugin's print"))
        err = capsys.readouterr().err
    finally:
        ray.shutdown()
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in err.splitlines()] == ["(_Worker pid=4242) a plugin's print"]
