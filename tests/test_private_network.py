"""fedsim.deploy.private_network: when a deployment on loopback moves into a network namespace of its own, what
it says where none can be made, and what the launcher inside receives (the planned config, loopback up). That
a deployed run goes through it is tests/test_deploy.py's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.deploy import private_network
from tests.conftest import small_config


def config(tmp_path: Path, **deploy: object) -> RunConfig:
    return parse_config({**small_config(tmp_path), "deploy": deploy})


def test_a_deployment_on_loopback_asks_for_a_namespace_and_one_across_hosts_does_not(tmp_path: Path) -> None:
    assert private_network.wanted(config(tmp_path)) and private_network.wanted(config(tmp_path, address="::1"))
    assert not private_network.wanted(config(tmp_path, address="0.0.0.0"))  # across hosts: nothing to hide it in
    assert not private_network.wanted(config(tmp_path, private_network=False))


def test_inside_the_namespace_no_second_one_is_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(private_network.ENV, "1")
    assert private_network.inside() and not private_network.wanted(config(tmp_path))


def test_without_unshare_the_deploy_says_why_it_runs_in_the_host_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert private_network.unavailable() == "no unshare program (util-linux)"


def test_the_launcher_inside_gets_the_planned_config_and_a_loopback_no_one_outside_reaches(tmp_path: Path) -> None:
    """As fedsim deploy starts its launcher inside: under unshare, the config on stdin. Inside, loopback is up
    (a socket bound there takes a connection) and it is not this host's: a port listened on outside is not
    listened on inside."""
    if why := private_network.unavailable():
        pytest.skip(f"no network namespace can be made here: {why}")
    cfg = config(tmp_path)
    cfg.name = "planned-outside"
    with socket.socket() as outside:
        outside.bind(("127.0.0.1", 0))
        outside.listen()
        port = outside.getsockname()[1]
        inside = (
            "import socket\n"
            "from fedsim.deploy.private_network import received_config\n"
            "cfg = received_config()\n"
            "with socket.socket() as server, socket.socket() as client, socket.socket() as probe:\n"
            "    server.bind(('127.0.0.1', 0)); server.listen()\n"
            "    client.connect(server.getsockname())\n"
            f"    print(cfg.name, probe.connect_ex(('127.0.0.1', {port})) != 0)\n"
        )
        env = {**os.environ, private_network.ENV: str(os.getpid())}
        res = subprocess.run(
            [*private_network.UNSHARE, sys.executable, "-c", inside], input=cfg.to_json(), capture_output=True,
            text=True, env=env, timeout=120,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["planned-outside", "True"]
