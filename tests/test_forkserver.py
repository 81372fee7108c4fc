"""A SuperNode's fork server (fedsim.deploy.forkserver) behind the ``flwr-clientapp`` shim: what the
SuperExec sees of the shim is what it would see of Flower's own command (output, exit status), and a task
never outlives its shim or its server. What the server makes warm is tests/test_warm.py's; that deployed runs
give ``fedsim run``'s metrics bit for bit through it, tests/test_deploy.py's."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.deploy import clientapp_shim
from fedsim.deploy.supernode import start_fork_server
from fedsim.processes import identity


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    """The environment of a SuperExec whose ``flwr-clientapp`` is the shim, and the fork server's pid."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    server, env = start_fork_server(private)
    yield {**os.environ, **env}, server.pid
    server.terminate()
    assert server.wait(timeout=60) is not None


@pytest.fixture
def shim_env(served: tuple[dict[str, str], int]) -> dict[str, str]:
    return served[0]


def shim(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["flwr-clientapp", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_shim_is_flowers_command_run_in_a_forked_process(shim_env: dict[str, str]) -> None:
    shim_path = Path(shim_env["PATH"].split(os.pathsep)[0]) / "flwr-clientapp"
    assert shim_path.read_text().startswith(f"#!{sys.executable} -S\n")
    ok = shim(shim_env, "--help")
    assert ok.returncode == 0 and "Run a Flower ClientApp" in ok.stdout, ok
    bad = shim(shim_env, "--no-such-option")
    assert bad.returncode == 2 and "--token --token-file is required" in bad.stderr, bad
    assert "no fork server" not in ok.stderr + bad.stderr  # both served by the fork server


@pytest.mark.slow
def test_a_fork_starts_in_a_fraction_of_a_fresh_process(shim_env: dict[str, str]) -> None:
    """Served warm, ``flwr-clientapp --help`` takes tens of milliseconds; a fresh one imports Flower first."""
    shim(shim_env, "--help")  # the server is ready (its imports done) once it has served one
    start = time.monotonic()
    shim(shim_env, "--help")
    forked = time.monotonic() - start
    env = {k: v for k, v in shim_env.items() if k != "FEDSIM_FORKSERVER"}
    start = time.monotonic()
    fresh = shim(env, "--help")
    started = time.monotonic() - start
    assert fresh.returncode == 0 and "no fork server" in fresh.stderr and "Run a Flower ClientApp" in fresh.stdout
    assert forked < started, (forked, started)


NEVER_ANSWERED = ["--runtime-api-address", "127.0.0.1:9", "--token", "t", "--insecure"]  # retries until stopped


@pytest.mark.slow
def test_a_killed_shim_takes_its_task_with_it(served: tuple[dict[str, str], int], tmp_path: Path) -> None:
    """The SuperExec stopping a task's process stops the task: the forked process gets the signal and ends, or
    begins Flower's exit (it logs "Task stopped." on the shim's stderr, which is the task's)."""
    log = tmp_path / "task.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["flwr-clientapp", *NEVER_ANSWERED], env=served[0], stdout=subprocess.DEVNULL, stderr=err
        )
    tasks = forked_tasks(served[1])
    proc.terminate()
    # forwarded to the task; or, if it came before the shim had the task's pid, the shim ends (143) and the
    # server stops the task
    assert_stopped(tasks, log)
    # the shim ends with its task, with its status: the task's own exit, the signal's 143, or the test's SIGKILL
    assert proc.wait(timeout=120) in (0, 128 + signal.SIGTERM, 128 + signal.SIGKILL)


@pytest.mark.slow
def test_a_shim_gone_unread_neither_stops_the_server_nor_leaves_its_task(
    served: tuple[dict[str, str], int], tmp_path: Path
) -> None:
    """A shim killed after the server answered but before it read the answer resets its connection: the
    server stops that task and goes on serving (it once died of the reset, and its task lived on)."""
    log = tmp_path / "task.log"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(served[0][clientapp_shim.SOCKET_ENV])
    body = json.dumps({"argv": NEVER_ANSWERED}).encode()
    with open(os.devnull, "rb") as stdin, log.open("wb") as err:
        request = clientapp_shim.HEADER.pack(len(body)) + body
        socket.send_fds(sock, [request], [stdin.fileno(), err.fileno(), err.fileno()])
    assert select.select([sock], [], [], 60)[0], "no answer from the fork server"
    pid, _ = clientapp_shim.REPLY.unpack(sock.recv(clientapp_shim.REPLY.size, socket.MSG_PEEK))  # left unread
    sock.close()
    assert_stopped([pid], log)
    ok = shim(served[0], "--help")
    assert ok.returncode == 0 and "no fork server" not in ok.stderr, ok
    assert identity(served[1])


@pytest.mark.slow
def test_a_connection_that_sends_nothing_or_half_a_request_holds_no_task_up(
    served: tuple[dict[str, str], int],
) -> None:
    """One process serves every task of a node: a peer that connects and sends nothing, or the start of a
    request and then nothing, once held every later task of the node (the server waited on it forever)."""
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(served[0][clientapp_shim.SOCKET_ENV])
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(served[0][clientapp_shim.SOCKET_ENV])
    stalled.settimeout(60)
    body = json.dumps({"argv": ["--help"]}).encode()
    with open(os.devnull, "rb") as stdin:
        socket.send_fds(stalled, [clientapp_shim.HEADER.pack(len(body)) + body[:5]], [stdin.fileno()] * 3)
    try:
        ok = shim(served[0], "--help")
        assert ok.returncode == 0 and "Run a Flower ClientApp" in ok.stdout and "no fork server" not in ok.stderr, ok
        assert stalled.recv(1) == b""  # refused once REQUEST_S passed: closed, nothing forked for it
    finally:
        silent.close()
        stalled.close()
    assert identity(served[1])


@pytest.mark.slow
def test_a_killed_fork_server_takes_its_tasks_with_it(served: tuple[dict[str, str], int], tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["flwr-clientapp", *NEVER_ANSWERED], env=served[0], stdout=subprocess.DEVNULL, stderr=err
        )
    tasks = forked_tasks(served[1])
    os.kill(served[1], signal.SIGKILL)
    assert_stopped(tasks, log)
    assert proc.wait(timeout=120) != 0  # the shim lost its server


def forked_tasks(server: int) -> list[int]:
    """The fork server's children, once it has forked one."""
    deadline = time.monotonic() + 60
    while not (tasks := children(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tasks, "no forked task"
    return tasks


def assert_stopped(tasks: list[int], log: Path) -> None:
    """Each task ended (the signal came before Flower's handlers), or is in Flower's exit (it logged "Task
    stopped." on its stderr)."""

    def stopping() -> bool:
        return not any(identity(pid) for pid in tasks) or "Task stopped." in log.read_text(errors="replace")

    deadline = time.monotonic() + 120
    while not stopping() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert stopping(), log.read_text(errors="replace")[-2000:]
    finally:
        # Flower's exit then pushes the task's status to its SuperNode, which never answers here: its exit
        # handlers may wait out the HTTP retry's backoff before Flower's force exit, so the test ends the task
        for pid in tasks:
            if identity(pid):
                os.kill(pid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
