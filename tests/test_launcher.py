"""fedsim.deploy.launcher's parts that need no deployment: where its SuperLink may listen, how it knows its
SuperLink listens, and how it reads a run's end from the run directory. Deployed runs themselves are
tests/test_deploy.py's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.deploy.launcher import check_address, ended, last_line, wait_for_port
from fedsim.errors import ConfigError, FedsimError
from fedsim.ports import free_port
from tests.conftest import continued_run


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that listens nowhere (a SuperLink that has not bound its port yet)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait(timeout=60)


def test_a_run_that_ended_without_a_summary_names_its_log_and_last_line_only() -> None:
    """The launcher's error for a ServerApp that ended without a summary is one line: the log's path and its
    last line that says something (the traceback's last line), not the log's tail on lines of its own."""
    log = "INFO: starting\nTraceback (most recent call last):\n  File x\nValueError: no data\n\n  \n"
    assert last_line(log) == "ValueError: no data"
    assert last_line("") == last_line("\n\n") == ""


def test_a_run_has_ended_once_its_summary_or_its_error_is_written(tmp_path: Path) -> None:
    assert ended(tmp_path) is None  # the ServerApp is still at work
    (tmp_path / "error.txt").write_text("the data went away\n")
    with pytest.raises(FedsimError, match="the data went away"):
        ended(tmp_path)
    continued_run(tmp_path)  # a finished run's summary.json
    summary = ended(tmp_path)  # a summary wins: a ServerApp writes one of the two, then exits
    assert summary is not None and summary["rounds"] == 1 and summary["final_client_mean_acc"] == 0.5


def test_a_summary_that_is_not_fedsims_ends_the_run_naming_it(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(["a", "list"]))
    with pytest.raises(FedsimError) as err:
        ended(tmp_path)
    assert "summary.json" in str(err.value)


def test_the_superlink_listens_only_on_an_address_of_this_host() -> None:
    check_address("127.0.0.1")
    check_address("0.0.0.0")
    with pytest.raises(ConfigError) as err:
        check_address("192.0.2.1")  # TEST-NET-1: on no host
    assert "deploy.address" in str(err.value) and "'192.0.2.1'" in str(err.value)


def test_the_wait_ends_once_the_superlink_or_a_process_it_started_listens() -> None:
    port = free_port("127.0.0.1")
    listen = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(120)"
    # the listener is the owner's child, as Flower's SuperLink serves from processes it starts
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {listen!r}])"
    owner = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, owner, 60, "the SuperLink")
        assert owner.poll() is None
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(timeout=60)


def test_a_superlink_that_exits_while_starting_is_named(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    with pytest.raises(FedsimError, match="the SuperLink exited during startup"):
        wait_for_port("127.0.0.1", free_port("127.0.0.1"), gone, 60, "the SuperLink")


def test_a_superlink_that_never_listens_names_the_timeout_to_raise(sleeper: subprocess.Popen[bytes]) -> None:
    with pytest.raises(FedsimError) as err:
        wait_for_port("127.0.0.1", free_port("127.0.0.1"), sleeper, 0.5, "the SuperLink")
    assert "deploy.startup_timeout_s" in str(err.value)


def test_another_program_on_the_port_is_never_taken_for_the_superlink(sleeper: subprocess.Popen[bytes]) -> None:
    """A run submitted to whatever listens on the port would go to a stranger: the launcher names it (here
    this test's own process) and the setting to change."""
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with pytest.raises(FedsimError) as err:
            wait_for_port("127.0.0.1", port, sleeper, 60, "the SuperLink")
    message = str(err.value)
    assert f"port {port}" in message and "deploy.port" in message
    assert f"pid {os.getpid()}:" in message  # who holds it, by pid and command line
