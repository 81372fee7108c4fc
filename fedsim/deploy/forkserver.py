"""A SuperNode's fork server: each ClientApp process forked from a warm one instead of started afresh.

Flower 1.41's SuperExec starts a fresh ``flwr-clientapp`` process for every Message, and each paid
interpreter start-up, the imports of torch, Flower and fedsim (about 3 s of CPU) and the run's data and
model (1.4 s for CIFAR-10) before its few steps of work. Under ``fedsim-supernode``
(:mod:`fedsim.deploy.supernode`) the ``flwr-clientapp`` the SuperExec starts is
:mod:`fedsim.deploy.clientapp_shim`, which hands its arguments and stdio to this server; the server
forks a child that runs Flower's own ``flwr-clientapp`` code. Each task is still a process of its own that
serves one Message and exits, as in Flower, but it starts with everything imported; and once a child
has built a run's runtime (data, split, model), its ClientApp (:mod:`fedsim.deploy.clientapp`) tells the
server, which builds the same runtime so that the children it forks next inherit it (:mod:`fedsim.deploy.warm`).

The server itself never starts a thread pool, CUDA or a network connection, which a forked child could
not use.

One process serves every task of the node, so no connection may hold it: a connection's request is read once
it has sent something, and must then come whole within :data:`REQUEST_S` (a shim sends it in one go).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import traceback

from fedsim.deploy import flower_waits
from fedsim.deploy.clientapp_shim import HEADER, REPLY
from fedsim.deploy.warm import keep_warm, preload
from fedsim.processes import die_with

MAX_REQUEST = 1 << 20  # bytes of one request's JSON (its command line)
MAX_CONFIG = 1 << 22  # bytes of a run config a child announces
REQUEST_S = 10.0  # how long the rest of a request may take once its first bytes came
REQUEST = "request"  # the selector's mark of a connection whose request has not come yet
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what stops a task (the SuperExec, a shim forwarding)


def read_request(conn: socket.socket) -> tuple[list[str], list[int]]:
    """The command line of one task, and the shim's stdin, stdout and stderr."""
    data, fds, _, _ = socket.recv_fds(conn, HEADER.size + MAX_REQUEST, 3)
    if len(fds) != 3 or len(data) < HEADER.size:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request without its header and three file descriptors")
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        raise ValueError(f"a request of {size} bytes")
    body = data[HEADER.size :]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("a request cut short")
        body += chunk
    argv = json.loads(body)["argv"]
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise ValueError("a request whose argv is not a list of strings")
    return argv, fds


def run_task(argv: list[str], fds: list[int], announce: socket.socket, server: int) -> None:
    """In a forked child of ``server``: become ``flwr-clientapp argv`` on the shim's stdio; never returns."""
    code: int = 1
    try:
        for sig in (*STOPS, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        die_with(server)  # a fork server that ends, however it ends, takes its tasks with it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # blocked by the server across the fork: now delivered
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

        from fedsim.deploy.clientapp import app

        app.announce = lambda config_json: announce.send(config_json.encode()[:MAX_CONFIG])
        sys.argv = ["flwr-clientapp", *argv]
        flwr_clientapp()
        code = 0
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (a task's process reports every failure, as flwr-clientapp would)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(listener: socket.socket) -> None:
    """Fork a ClientApp process for every request on ``listener``, until this process is stopped."""
    preload()
    announced, announce = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    announced.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_CONFIG)
    announce.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_CONFIG)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(announced, selectors.EVENT_READ)
    tasks: dict[int, socket.socket] = {}  # each task's pid: the connection of the shim waiting for it
    server = os.getpid()
    while True:
        for key, _ in sel.select(timeout=0.05):
            if key.fileobj is listener:
                try:
                    conn, _ = listener.accept()
                except OSError as err:  # out of file descriptors, say: that shim runs Flower's own command
                    print(f"fedsim fork server: refused a connection: {err}", file=sys.stderr)
                    continue
                conn.settimeout(REQUEST_S)
                sel.register(conn, selectors.EVENT_READ, REQUEST)  # read once its request begins to come
            elif key.data is REQUEST:
                sel.unregister(key.fileobj)
                start_task(key.fileobj, sel, tasks, announce, server)  # type: ignore[arg-type]
            elif key.fileobj is announced:
                keep_warm(announced.recv(MAX_CONFIG))
            elif key.data in tasks and shim_gone(key.fileobj):  # type: ignore[arg-type]
                os.kill(key.data, signal.SIGTERM)  # so is whoever waited for the task
                sel.unregister(key.fileobj)
        reap(tasks, sel)


def start_task(
    conn: socket.socket, sel: selectors.BaseSelector, tasks: dict[int, socket.socket], announce: socket.socket,
    server: int,
) -> None:  # fmt: skip
    """Fork the task that ``conn``'s request asks for, and tell its shim the task's pid; a request that is not
    whole within :data:`REQUEST_S`, or not a request, is refused."""
    try:
        argv, fds = read_request(conn)
    except (OSError, ValueError) as err:  # a shim gone or broken is that shim's failure, not the node's
        print(f"fedsim fork server: refused a request: {err}", file=sys.stderr)
        conn.close()
        return
    # the stop signals wait while the child is forked and its handlers become the defaults, so a stop that comes
    # in between is neither run by the server's handler in the child nor lost: the child's task stops by it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    pid = os.fork()
    if pid == 0:  # no socket of the server's stays open in a task: a shim waits for the end of its own alone
        for open_socket in [key.fileobj for key in sel.get_map().values()] + [conn, *tasks.values()]:
            open_socket.close()  # type: ignore[union-attr]
        sel.close()
        run_task(argv, fds, announce, server)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in fds:
        os.close(fd)
    tasks[pid] = conn
    try:
        conn.sendall(REPLY.pack(pid, 0))
    except OSError:  # the shim went before it heard the pid: nobody waits for the task
        os.kill(pid, signal.SIGTERM)
        return
    sel.register(conn, selectors.EVENT_READ, pid)


def shim_gone(conn: socket.socket) -> bool:
    """A shim's connection became readable: the shim sends nothing after its request, so it closed; a
    shim killed before it read the server's reply resets the connection instead."""
    try:
        return not conn.recv(1)
    except OSError:
        return True


def reap(tasks: dict[int, socket.socket], sel: selectors.BaseSelector) -> None:
    """Tell each finished task's shim its wait status."""
    while tasks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = tasks.pop(pid, None)
        if conn is None:
            continue
        if conn in sel.get_map():  # not when its shim went first
            sel.unregister(conn)
        try:
            conn.sendall(REPLY.pack(pid, status))
        except OSError:
            pass  # the shim is gone
        conn.close()


def main() -> None:
    """``python -m fedsim.deploy.forkserver FD``: serve on the listening Unix socket inherited as FD."""
    listener = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    flower_waits.shorten_object_pulls()  # the children pull their Message's objects
    serve(listener)


if __name__ == "__main__":
    main()
