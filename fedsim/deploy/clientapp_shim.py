"""``flwr-clientapp`` as a SuperNode started by ``fedsim-supernode`` sees it: a request to the node's fork
server (:mod:`fedsim.deploy.forkserver`) to run Flower's ``flwr-clientapp`` with these arguments and this
process's stdin, stdout and stderr, in a process forked from one that has already imported torch, Flower
and fedsim. It waits for that process and exits with its status, so the SuperExec that started it sees
what it would see of Flower's own command.

Standard library only, and run with ``python -S``: it starts in milliseconds. The fork server's socket
is named by ``FEDSIM_FORKSERVER``; without one that answers it runs Flower's own ``flwr-clientapp``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "FEDSIM_FORKSERVER"
SHIM_DIR_ENV = "FEDSIM_SHIM_DIR"  # this file's directory on PATH, left out when looking for Flower's command
HEADER = struct.Struct("!I")  # a request: its length, then JSON {"argv": [...]} with stdin/out/err attached
REPLY = struct.Struct("!ii")  # the server's answers: (pid, 0) once forked, then (pid, wait status)


def flower_command() -> list[str]:
    """Flower's own ``flwr-clientapp``: the first on PATH that is not this shim."""
    shim_dir = os.environ.get(SHIM_DIR_ENV, "")
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d, "flwr-clientapp")
        if d and os.path.realpath(d) != os.path.realpath(shim_dir) and os.access(path, os.X_OK):
            return [path]
    raise SystemExit("fedsim: no flwr-clientapp on PATH besides fedsim's")


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the fork server closed the connection")
        data += chunk
    return data


def main() -> None:
    args = sys.argv[1:]
    task: list[int] = []  # the pid of the process doing the task, once the server has said it

    def forward(signum: int, _frame: object) -> None:
        """A signal to this process (the SuperExec stopping a task) goes to the task's process; before
        its pid is known, this process exits, and the server stops a task whose shim is gone."""
        if not task:
            os._exit(128 + signum)
        os.kill(task[0], signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.environ[SOCKET_ENV])
    except (KeyError, OSError) as err:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        print(f"fedsim: no fork server ({err}); starting Flower's flwr-clientapp", file=sys.stderr)
        os.execv(flower_command()[0], ["flwr-clientapp", *args])
    try:
        body = json.dumps({"argv": args}).encode()
        socket.send_fds(sock, [HEADER.pack(len(body)) + body], [0, 1, 2])
        pid, _ = REPLY.unpack(read_exactly(sock, REPLY.size))
    except OSError as err:  # the server went after it took the request: its task may run, so never a second one
        print(f"fedsim: the fork server went ({err})", file=sys.stderr)
        sys.exit(1)
    task.append(pid)
    try:
        _, status = REPLY.unpack(read_exactly(sock, REPLY.size))
    except ConnectionError:  # the fork server died: so did the node; the task's process has its own watch
        sys.exit(1)
    code = os.waitstatus_to_exitcode(status)  # negative: killed by that signal
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
