"""``fedsim-supernode``: Flower's ``flower-supernode`` (same arguments) with warm ClientApp processes and
short waits; the SuperNode command of ``fedsim deploy`` and ``fedsim compose``.

Before it runs Flower's SuperNode in this process it
- starts the node's fork server (:mod:`fedsim.deploy.forkserver`) on a Unix socket in a directory only
  this user can enter, and puts :mod:`fedsim.deploy.clientapp_shim` first on the PATH the SuperNode's
  SuperExec inherits, as ``flwr-clientapp``: every ClientApp process is then forked from a warm one;
- puts :mod:`fedsim.deploy.superexec` there as ``flower-superexec``, the SuperExec the SuperNode starts,
  and rings it through a doorbell in the same directory whenever a Message is stored: the SuperExec looks
  for its task at once instead of polling;
- shortens the SuperNode loop's fixed sleeps, its object pulls' first retry and its heartbeat interval
  (:mod:`fedsim.deploy.flower_waits`).

The fork server gets SIGTERM when this process dies, however it dies; the directory goes when it exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from fedsim.deploy import clientapp_shim, flower_waits, superexec
from fedsim.processes import die_with_parent


def write_commands(directory: Path) -> None:
    """``directory/flwr-clientapp``, the shim, run by this interpreter without site-packages; and
    ``directory/flower-superexec``, fedsim's SuperExec, run by this interpreter."""
    directory.mkdir(mode=0o700)
    for name, text in [
        ("flwr-clientapp", f"#!{sys.executable} -S\n" + Path(clientapp_shim.__file__).read_text()),
        ("flower-superexec", f"#!{sys.executable}\nfrom fedsim.deploy.superexec import main\n\nmain()\n"),
    ]:
        (directory / name).write_text(text)
        (directory / name).chmod(0o700)


def start_fork_server(private: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """Start a fork server on a socket in ``private`` (a directory only this user may enter); returns it
    and the environment that points a SuperExec (its ``flwr-clientapp``) at it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(private / "forkserver.sock"))
    listener.listen(64)
    write_commands(private / "bin")
    server = subprocess.Popen(  # noqa: S603 (this interpreter, a fedsim module)
        [sys.executable, "-m", "fedsim.deploy.forkserver", str(listener.fileno())],
        pass_fds=[listener.fileno()], preexec_fn=die_with_parent(),
    )  # fmt: skip
    listener.close()
    return server, {
        clientapp_shim.SOCKET_ENV: str(private / "forkserver.sock"),
        clientapp_shim.SHIM_DIR_ENV: str(private / "bin"),
        "PATH": os.pathsep.join([str(private / "bin"), os.environ.get("PATH", "")]),
    }


def main() -> None:
    private = Path(tempfile.mkdtemp(prefix="fedsim-supernode-"))  # mode 0700
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    server, env = start_fork_server(private)
    atexit.register(server.terminate)  # before the directory goes (atexit runs last in, first out)
    os.environ.update(env)  # the SuperExec this SuperNode starts inherits it
    if flower_waits.ring_when_stored(flower_waits.Doorbell.make(str(private / "doorbell"))):
        os.environ[superexec.DOORBELL_ENV] = str(private / "doorbell")
    flower_waits.shorten_node_loop()
    flower_waits.shorten_object_pulls()
    flower_waits.shorten_heartbeat()
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *sys.argv[1:]]
    flower_supernode()


if __name__ == "__main__":
    main()
