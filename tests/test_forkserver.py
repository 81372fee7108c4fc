"""A SuperNode's fork server (fedsim.deploy.forkserver) behind the ``flwr-clientapp`` shim: what the
SuperExec sees of the shim is what it would see of Flower's own command (output, exit status), and the
run's runtime is built once in the server for the processes it forks next. That deployed runs give
``fedsim run``'s metrics bit for bit through it is tests/test_deploy.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.client import runtime
from fedsim.config import load_config
from fedsim.deploy import forkserver
from fedsim.deploy.supernode import start_fork_server
from fedsim.processes import identity
from tests.conftest import REPO


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


def test_the_shim_is_flowers_command_run_in_a_forked_process(shim_env: dict[str, str]) -> None:
    shim_path = Path(shim_env["PATH"].split(os.pathsep)[0]) / "flwr-clientapp"
    assert shim_path.read_text().startswith(f"#!{sys.executable} -S\n")
    ok = shim(shim_env, "--help")
    assert ok.returncode == 0 and "Run a Flower ClientApp" in ok.stdout, ok
    bad = shim(shim_env, "--no-such-option")
    assert bad.returncode == 2 and "--token --token-file is required" in bad.stderr, bad
    assert "no fork server" not in ok.stderr + bad.stderr  # both served by the fork server


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


def test_a_killed_shim_takes_its_task_with_it(served: tuple[dict[str, str], int], tmp_path: Path) -> None:
    """The SuperExec stopping a task's process stops the task: the forked process gets the signal and ends, or
    begins Flower's exit (it logs "Task stopped." on the shim's stderr, which is the task's)."""
    # a ClientApp whose SuperNode never answers: it retries until stopped
    log = tmp_path / "task.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9", "--token", "t", "--insecure"],
            env=served[0], stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    server = served[1]
    deadline = time.monotonic() + 60
    while not (tasks := children(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tasks, "no forked task"
    proc.terminate()
    # forwarded to the task; or, if it came before the shim had the task's pid, the shim ends (143) and the
    # server stops the task

    def stopping() -> bool:  # ended (the signal came before Flower's handlers), or in Flower's exit
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
    # the shim ends with its task, with its status: the task's own exit, the signal's 143, or the test's SIGKILL
    assert proc.wait(timeout=120) in (0, 128 + signal.SIGTERM, 128 + signal.SIGKILL)


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_the_server_builds_a_run_once_and_never_for_a_gpu() -> None:
    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["simulation.threads=1"])
    runtime.prepare.cache_clear()
    try:
        forkserver.warm(cfg.to_json().encode())
        assert runtime.prepare.cache_info().currsize == 1
        built = runtime.prepare(cfg.to_json())
        assert runtime.prepare.cache_info().hits == 1 and built.device.type == "cpu"
        gpu = cfg.model_copy(deep=True)
        gpu.simulation.device = "cuda"
        forkserver.warm(gpu.to_json().encode())  # a CUDA context cannot cross a fork: children build it
        assert runtime.prepare.cache_info().currsize == 1
    finally:
        runtime.prepare.cache_clear()
