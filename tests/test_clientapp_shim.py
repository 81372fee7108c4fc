"""fedsim.deploy.clientapp_shim on its own: with no fork server to answer it, the shim is Flower's
``flwr-clientapp`` (the next one on PATH, never itself), arguments and exit status as they are. The shim in
front of a fork server is tests/test_forkserver.py's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.deploy import clientapp_shim

SHIM = Path(clientapp_shim.__file__)


def fake_flower(directory: Path) -> Path:
    """A ``flwr-clientapp`` in ``directory`` that prints its arguments and exits 3."""
    directory.mkdir()
    path = directory / "flwr-clientapp"
    path.write_text(f"#!{sys.executable} -S\nimport sys\nprint(sys.argv[1:])\nsys.exit(3)\n")
    path.chmod(0o700)
    return path


def shim_dir(tmp_path: Path) -> Path:
    """The shim as fedsim-supernode puts it on PATH: ``flwr-clientapp`` in a directory of its own."""
    directory = tmp_path / "shim"
    directory.mkdir()
    (directory / "flwr-clientapp").write_text(f"#!{sys.executable} -S\n" + SHIM.read_text())
    (directory / "flwr-clientapp").chmod(0o700)
    return directory


@pytest.mark.parametrize("server", [None, "gone.sock"])
def test_without_a_fork_server_the_shim_runs_flowers_command(tmp_path: Path, server: str | None) -> None:
    flower, shim = fake_flower(tmp_path / "flower"), shim_dir(tmp_path)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{flower.parent}", clientapp_shim.SHIM_DIR_ENV: str(shim)}
    env.pop(clientapp_shim.SOCKET_ENV, None)
    if server is not None:  # named, but nothing listens there
        env[clientapp_shim.SOCKET_ENV] = str(tmp_path / server)
    res = subprocess.run(["flwr-clientapp", "--insecure", "--token", "7"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 3
    assert res.stdout.strip() == "['--insecure', '--token', '7']"
    assert "no fork server" in res.stderr and "starting Flower's flwr-clientapp" in res.stderr


def test_flowers_command_is_the_first_on_path_that_is_not_the_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flower, shim = fake_flower(tmp_path / "flower"), shim_dir(tmp_path)
    monkeypatch.setenv(clientapp_shim.SHIM_DIR_ENV, str(shim))
    monkeypatch.setenv("PATH", os.pathsep.join(["", str(shim), str(tmp_path / "none"), str(flower.parent)]))
    assert clientapp_shim.flower_command() == [str(flower)]
    monkeypatch.setenv("PATH", str(shim))
    with pytest.raises(SystemExit) as err:
        clientapp_shim.flower_command()
    assert "no flwr-clientapp on PATH besides fedsim's" in str(err.value)


def test_a_reply_is_read_whole_across_chunks_and_a_closed_server_is_an_error() -> None:
    ours, server = socket.socketpair()
    with ours, server:
        reply = clientapp_shim.REPLY.pack(1234, 0)
        server.sendall(reply[:3])
        server.sendall(reply[3:])
        assert clientapp_shim.REPLY.unpack(clientapp_shim.read_exactly(ours, clientapp_shim.REPLY.size)) == (1234, 0)
        server.sendall(reply[:5])
        server.close()
        with pytest.raises(ConnectionError):
            clientapp_shim.read_exactly(ours, clientapp_shim.REPLY.size)
