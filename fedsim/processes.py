"""Supervised processes: every process fedsim starts ends when the fedsim process that started it ends,
however that one ends.

Three layers. A child fedsim starts directly gets a parent-death signal (:func:`die_with_parent`, the
kernel sends it SIGTERM when its parent dies, even by SIGKILL). What those children start in turn
(Flower's SuperLink starts the ServerApp and a SuperExec in a session of its own, a SuperNode its
ClientApp processes) is watched by a :func:`watchdog` process that keeps the list of the whole tree and
stops it when the launcher is gone. A launcher that ends normally stops its tree itself
(:func:`stop_tree`). Processes are named by (pid, start time), so a pid the system reused is never
signalled. Linux only (``/proc``, ``prctl``), as fedsim's deployments are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_EVERY_S = 0.5
Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def die_with(parent: int) -> None:
    """This process gets SIGTERM when its parent ``parent`` dies; it exits at once if that already happened."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when this process dies."""
    parent = os.getpid()
    return lambda: die_with(parent)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, or None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # gone, or vanished while being read
        return None


def identity(pid: int) -> Process | None:
    """``(pid, start time)`` of a live (not zombie) process, else None."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return None
    return pid, int(fields[19])  # field 22 of stat: starttime


def alive(process: Process) -> bool:
    return identity(process[0]) == process


def parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


def tree(roots: set[int]) -> set[Process]:
    """The live processes among ``roots`` and all their descendants, walked by parent id (not process
    group: Flower detaches some of them into sessions of their own)."""
    links, found = parents(), set(roots)
    while new := {pid for pid, ppid in links.items() if ppid in found and pid not in found}:
        found |= new
    return {p for pid in found if (p := identity(pid)) is not None}


def send(processes: set[Process], sig: signal.Signals) -> None:
    for process in processes:
        if alive(process):
            try:
                os.kill(process[0], sig)
            except ProcessLookupError:
                pass


def wait_gone(processes: set[Process], timeout: float) -> bool:
    """True once none of ``processes`` is alive; False if some still are after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_tree(roots: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM ``roots`` and their descendants, SIGKILL what is left after ``grace_s`` seconds (and what
    they started meanwhile, found from their still-living ancestors)."""
    seen = tree(roots)
    send(seen, signal.SIGTERM)
    if wait_gone(seen, grace_s):
        return
    for _ in range(2):
        seen = {p for p in seen if alive(p)} | tree({pid for pid, _ in seen if identity(pid) is not None})
        send(seen, signal.SIGKILL)
        wait_gone(seen, 10.0)


def listening_pids(port: int) -> set[int]:
    """Pids of the processes (in this network namespace) with a listening TCP socket on ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6 here
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.add(int(proc.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return pids


def describe(pid: int) -> str:
    """``pid`` and its command line, for a message."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = "?"
    return f"pid {pid}: {cmdline[:120]}"


def watchdog(roots: set[int]) -> subprocess.Popen[bytes]:
    """A process that stops ``roots`` and everything they start once this process is gone.

    It runs in a session of its own (a Ctrl-C or a SIGKILL aimed at this process does not reach it)
    and ends by itself when this process and the tree are gone."""
    cmd = [sys.executable, "-m", "fedsim.processes", str(os.getpid()), *map(str, sorted(roots))]
    return subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, close_fds=True)


def _watch(parent: int, roots: set[int]) -> None:
    """The watchdog's loop: remember the tree while ``parent`` lives, stop what is left when it dies."""
    launcher = identity(parent)
    known: set[Process] = set()
    while launcher is not None and alive(launcher):
        known |= tree(roots | {pid for pid, _ in known})
        known = {p for p in known if alive(p)}
        if not known:
            return  # the launcher stopped its tree itself
        time.sleep(WATCH_EVERY_S)
    known |= tree({pid for pid, _ in known if identity(pid) is not None})
    send(known, signal.SIGTERM)
    if not wait_gone(known, 10.0):
        send(known, signal.SIGKILL)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the processes a command started are stopped either way."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """Ctrl-C and SIGTERM cannot cut short what runs inside (stopping processes in order)."""
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: nothing to ignore there
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":  # the watchdog: python -m fedsim.processes <parent pid> <root pid>...
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(sys.argv[1]), {int(a) for a in sys.argv[2:]})
