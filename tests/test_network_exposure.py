"""Nothing a fedsim command starts can be reached from another machine unless the config asks: every server
of every process a run starts (Ray's GCS, raylet, object manager, workers, agents and the driver's own;
Flower's SuperLink and SuperNodes) listens on loopback alone, under every engine and ``fedsim deploy``; and
another host's connection to any of them, ``ray.init`` included, is refused."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedsim.processes import Socket, listening_sockets, tree
from tests.conftest import REPO, host_address, small_config, write_config
from tests.test_deploy import deploy_config
from tests.test_signals import assert_all_gone

pytestmark = pytest.mark.slow

MARK = "FEDSIM_EXPOSURE_TEST"  # in the command's environment, so in that of every process it starts
Seen = dict[Socket, str]  # a socket -> the process that held it


def start(tmp_path: Path, command: str, cfg: dict) -> subprocess.Popen[str]:
    """``fedsim <command> cfg`` as a user starts it, marked as this test's."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, MARK: str(tmp_path), "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "fedsim.app.cli", command, str(write_config(tmp_path, cfg))]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def processes(proc: subprocess.Popen[str], mark: str) -> set[int]:
    """The command's processes: its descendants by parent id, and every process carrying its mark in its
    environment (one whose parent ended first, now PID 1's)."""
    pids = {pid for pid, _ in tree({proc.pid})}
    needle = f"{MARK}={mark}\0".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                pids.add(int(entry.name))
        except OSError:  # ended, or not ours to read
            continue
    return pids


def name(pid: int) -> str:
    """The program of process ``pid``: what it calls itself (Ray's workers: ``ray::<class>``), the script a
    Python runs, or ``-m <module>``'s module."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if Path(args[0]).name.startswith("python"):
        args = [arg for arg in args[1:] if arg not in ("-u", "-m")] or args
    script = args[0].split(" ")[0]
    # Ray's own scripts, named as their processes name themselves once started: a loaded machine can see a
    # worker's socket before setproctitle makes it ray::<class>
    for path, title in RAY_SCRIPTS.items():
        if script.endswith(path):
            return title
    return Path(script).name


RAY_SCRIPTS = {"ray/_private/workers/default_worker.py": "ray::", "ray/_private/runtime_env/agent/main.py": "ray-agent"}


def watch(proc: subprocess.Popen[str], mark: str, timeout: float, until: Callable[[Seen], bool] | None = None) -> Seen:
    """The sockets through which the command's processes could be reached, read from /proc every 0.1 s (each
    process's own network namespace: a deploy's SuperLink runs in one of its own) until the command ends, or
    ``until(what was seen)`` holds."""
    seen: Seen = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and not (until and until(seen)):
        for pid in processes(proc, mark):
            for sock in listening_sockets(pid):
                seen.setdefault(sock, name(pid))
        time.sleep(0.1)
    return seen


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (ip.ipv4_mapped or ip).is_loopback if isinstance(ip, ipaddress.IPv6Address) else ip.is_loopback


def exposed(seen: Seen) -> list[str]:
    return sorted(f"{who}: {proto} {address} port {port}" for (proto, address, port), who in seen.items()
                  if not is_loopback(address))  # fmt: skip


def listeners(seen: Seen) -> set[str]:
    """The programs seen listening, Ray's workers as one (``ray::``, whatever class each one serves); Ray's
    runtime-env agent, which a run may or may not catch listening on loopback, left out."""
    return {"ray::" if who.startswith("ray::") else who for who in seen.values()} - {"ray-agent"}


RAY = {"gcs_server", "raylet", "ray::", "fedsim.app.cli"}  # the GCS, the raylet, a worker and the driver


@pytest.mark.long
@pytest.mark.parametrize(
    ("command", "sections", "servers"),
    [
        ("run", {}, set()),  # clients inline: nothing to serve
        ("run", {"simulation": {"backend": "ray", "threads": 1}}, RAY),
        ("run", {"engine": "flower"}, RAY),
        ("deploy", {}, {"flower-superlink", "fedsim-supernode"}),  # in a network namespace of its own
        ("deploy", {"deploy": {"private_network": False}}, {"flower-superlink", "fedsim-supernode"}),
    ],
    ids=["local-inline", "local-ray", "flower", "deploy", "deploy-host-network"],
)
def test_every_server_a_command_starts_listens_on_loopback_only(
    tmp_path: Path, command: str, sections: dict, servers: set[str]
) -> None:
    cfg = deploy_config(tmp_path, **sections) if command == "deploy" else small_config(tmp_path, **sections)
    proc = start(tmp_path, command, cfg)
    seen = watch(proc, str(tmp_path), timeout=600)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 0, err[-3000:]
    assert exposed(seen) == []
    assert listeners(seen) == servers, seen  # every server there is was seen, and nothing else listened


JOIN = """
import sys, ray
ray.init(address=sys.argv[1], include_dashboard=False)
print("joined", flush=True)
write = ray.remote(num_cpus=0)(lambda path: open(path, "w").write("a stranger's task ran here"))
ray.get(write.remote(sys.argv[2]))
"""


@pytest.mark.long
def test_another_host_cannot_join_a_run_on_ray(tmp_path: Path) -> None:
    """From this host's network address, as another machine would: every port the run's processes listen on
    refuses the connection, and ``ray.init`` at its GCS fails (its retries shortened with Ray's own settings,
    so that a refusal takes seconds, not ten minutes) without running the task that writes a file."""
    address = host_address()
    cfg = small_config(tmp_path, train={"rounds": 10_000, "local_steps": 1}, simulation={"backend": "ray"})
    proc = start(tmp_path, "run", cfg)
    mark, written = str(tmp_path), tmp_path / "written-by-a-stranger"
    try:
        seen = watch(proc, mark, timeout=300, until=lambda seen: RAY <= listeners(seen))
        assert RAY <= listeners(seen), proc.stderr.read() if proc.poll() is not None else seen
        answered = {}
        for _, _, port in seen:
            try:
                socket.create_connection((address, port), timeout=10).close()
                answered[port] = "accepted"
            except ConnectionRefusedError:
                continue
            except OSError as err:  # refused is the only answer a port that listens on loopback gives
                answered[port] = str(err)
        (gcs_port,) = {port for (_, _, port), who in seen.items() if who == "gcs_server"}
        retries = {"RAY_py_gcs_connect_timeout_s": "3", "RAY_NUM_REDIS_GET_RETRIES": "2"}
        joiner = subprocess.Popen([sys.executable, "-c", JOIN, f"{address}:{gcs_port}", str(written)],
                                  env={**os.environ, **retries}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        try:
            joined, refusal = joiner.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # joined, and waits on its task, or on Ray's retries
            joiner.kill()
            joined, refusal = joiner.communicate()
        seen |= watch(proc, mark, timeout=1)  # what the run started meanwhile
    finally:
        everything = tree(processes(proc, mark))
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    # no port answered; the stranger's ray.init did not return, and its task did not run
    assert (answered, joined, written.exists()) == ({}, "", False), refusal[-3000:]
    assert joiner.returncode != 0 and f"Failed to connect to Ray cluster at {address}:{gcs_port}" in refusal
    assert exposed(seen) == []
    assert proc.returncode == 128 + signal.SIGTERM
    assert_all_gone(everything)
