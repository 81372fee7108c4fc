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

import _thread
import ctypes
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

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


def run_in_charge(cmd: list[str], stdin: bytes | None = None, **popen: Any) -> int:
    """Run ``cmd`` as a child in charge of this process's work: in a process group of its own (a terminal's
    Ctrl-C reaches this process alone), Ctrl-C and SIGTERM passed on to it, dying with this process; its
    return code (negative: the signal that ended it). ``stdin``: written to it, then closed."""
    parent = os.getpid()

    def setup() -> None:
        # this process passes Ctrl-C on, so the child must act on it even where this one was started with
        # SIGINT ignored (a script's background job), which it would otherwise inherit
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        die_with(parent)

    if stdin is not None:
        popen["stdin"] = subprocess.PIPE
    child = subprocess.Popen(cmd, preexec_fn=setup, process_group=0, **popen)
    handlers = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if stdin is not None:
            assert child.stdin is not None
            child.stdin.write(stdin)
            child.stdin.close()
        return child.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


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


Socket = tuple[str, str, int]  # (protocol, address, port)
_TABLES = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}  # /proc/net tables: TCP LISTEN, UDP unconnected


def _address(hex_address: str) -> str:
    """An address of a /proc/net table (IPv4: 4 bytes, IPv6: four 32-bit words, each in host order) as text."""
    raw = bytes.fromhex(hex_address)
    return str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))


def _listening_inodes(tables: Path) -> dict[str, Socket]:
    """``socket:[inode]`` -> socket, for every TCP socket listening and UDP socket bound but unconnected in the
    tables under ``tables`` (/proc/net: this process's network namespace; /proc/<pid>/net: that process's)."""
    found = {}
    for name, state in _TABLES.items():
        try:
            rows = (tables / name).read_text().splitlines()[1:]
        except OSError:  # no IPv6 here, or the process ended
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == state:
                address, port = fields[1].split(":")
                found[f"socket:[{fields[9]}]"] = (name.rstrip("6"), _address(address), int(port, 16))
    return found


def _socket_links(pid: int) -> set[str]:
    """What the file descriptors of process ``pid`` point to (``socket:[inode]`` for a socket)."""
    links = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                links.add(os.readlink(fd))
            except OSError:  # closed meanwhile
                continue
    except OSError:  # ended meanwhile, or not ours to read
        pass
    return links


def listening_pids(port: int) -> set[int]:
    """Pids of the processes (in this network namespace) with a listening TCP socket on ``port``."""
    table = _listening_inodes(Path("/proc/net"))
    inodes = {inode for inode, (protocol, _, p) in table.items() if protocol == "tcp" and p == port}
    return {
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and _socket_links(int(proc.name)) & inodes
    }


def listening_sockets(pid: int) -> set[Socket]:
    """Every socket through which process ``pid`` can be reached: its listening TCP sockets and bound, unconnected
    UDP sockets, as (protocol, address, port), read in its own network namespace; empty once it has ended."""
    table = _listening_inodes(Path(f"/proc/{pid}/net"))
    return {table[link] for link in _socket_links(pid) if link in table}


def describe(pid: int) -> str:
    """``pid`` and its command line, for a message."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = "?"
    return f"pid {pid}: {cmdline[:120]}"


def watchdog(roots: set[int] | None = None, grace_s: float = 10.0) -> subprocess.Popen[bytes]:
    """A process that stops ``roots`` and everything they start once this process is gone (SIGTERM, then
    SIGKILL after ``grace_s`` seconds); ``roots`` None: every process this one starts from now on (its
    whole tree but the watchdog).

    It runs in a session of its own (a Ctrl-C or a SIGKILL aimed at this process does not reach it)
    and ends by itself when this process, or the tree it has seen, is gone."""
    cmd = [sys.executable, "-m", __spec__.name, str(os.getpid()), str(grace_s), *map(str, sorted(roots or ()))]
    return subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, close_fds=True)


def _is_watchdog(process: Process) -> bool:
    """True for a watchdog (another one, watching the same parent's tree: never stopped by this one)."""
    try:
        return f"\0-m\0{__spec__.name}\0".encode() in Path(f"/proc/{process[0]}/cmdline").read_bytes()
    except OSError:  # gone
        return False


def _watch(parent: int, roots: set[int], grace_s: float) -> None:
    """The watchdog's loop: remember the tree while ``parent`` lives, stop what is left when it dies.
    No ``roots``: the parent's whole tree, which may still be empty when the watch begins."""
    launcher = identity(parent)
    if launcher is None:
        return
    known: set[Process] = set()
    seen = bool(roots)
    while alive(launcher):
        found = tree((roots or {parent}) | {pid for pid, _ in known}) - {launcher}
        known = {p for p in known | found if alive(p) and not _is_watchdog(p)}
        if seen and not known:
            return  # the launcher stopped its tree itself
        seen = seen or bool(known)
        time.sleep(WATCH_EVERY_S)
    known |= tree({pid for pid, _ in known if identity(pid) is not None})
    send(known, signal.SIGTERM)
    if not wait_gone(known, grace_s):
        send(known, signal.SIGKILL)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: it unwinds the same way (every ``finally``
    runs, the processes a command started are stopped), and the command exits 128 + 15 instead of 130."""


# Set once SIGTERM has been raised as Terminated: code that re-raises a KeyboardInterrupt of its own (ray.get
# turns any into a plain one) must not turn SIGTERM's exit status into Ctrl-C's
_sigterm_raised = threading.Event()


def sigterm_raised() -> bool:
    """True if this process has raised SIGTERM as :class:`Terminated` (what ended it, if it is ending)."""
    return _sigterm_raised.is_set()


def _interrupt(signum: int) -> KeyboardInterrupt:
    if signum != signal.SIGTERM:
        return KeyboardInterrupt()
    _sigterm_raised.set()
    return Terminated()


def _raise_terminated(signum: int, frame: object) -> NoReturn:
    raise _interrupt(signum)


def _deliver_again(unraisable: Any) -> None:
    """``sys.unraisablehook`` while :func:`sigterm_as_interrupt` runs: a Ctrl-C or SIGTERM raised where Python
    ignores exceptions (a weakref callback of the import system, a ``__del__``) is printed and dropped, and the
    command would go on as if no signal had come (a SIGTERM during start-up once was). It is delivered again,
    to be raised in the main thread once this hook has returned (from a thread: the handler would otherwise run
    inside this hook, where its exception is dropped again); any other unraisable exception goes to the hook
    before it."""
    global _in_hook
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        _in_hook = True
        threading.Thread(target=_interrupt_main_after_hook, args=(signum,), daemon=True).start()
        _in_hook = False  # no check for signals follows in this hook: the handler runs after it has returned
        return
    _hook_before(unraisable)


_in_hook = False  # _deliver_again is still at a step where a signal's handler would run inside it


def _interrupt_main_after_hook(signum: int) -> None:
    while _in_hook:  # the handler must run after the hook: raised inside it, its exception is dropped again
        time.sleep(0.001)
    _thread.interrupt_main(signum)


_hook_before = sys.unraisablehook


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (as :class:`Terminated`) while the block runs, and neither is lost where
    Python ignores exceptions (:func:`_deliver_again`)."""
    global _hook_before
    _sigterm_raised.clear()  # one that an earlier block raised (and its caller handled) is not this one's
    hook = sys.unraisablehook
    if hook is not _deliver_again:  # not in a block of its own already (fedsim run's inside the CLI's)
        _hook_before, sys.unraisablehook = hook, _deliver_again
    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # after the hook: no SIGTERM comes before it
    try:
        yield
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def handlers_kept() -> Iterator[None]:
    """This process's SIGINT and SIGTERM handlers as they were before the block, whatever it installed."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # where handlers can be set at all
            for sig, handler in saved.items():
                if handler is not None:  # None: one set outside Python, which Python cannot put back
                    signal.signal(sig, handler)


@contextmanager
def signals_deferred(wind_down: Callable[[], None]) -> Iterator[None]:
    """The first Ctrl-C or SIGTERM while the block runs calls ``wind_down`` (which asks what runs inside to
    end soon) and is raised once the block has ended, however it ends; a second one is raised at once.

    For code that cannot be interrupted at an arbitrary point: Flower's simulation, stopped in its main
    thread, shuts Ray down under its own worker threads, which then wait forever.
    """
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread alone
        yield
        return
    caught: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if caught:
            raise _interrupt(signum)
        caught.append(signum)
        wind_down()

    with handlers_kept():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)
        try:
            yield
        except Exception:  # what winding down raised in there: the signal is the reason
            if not caught:
                raise
    if caught:
        raise _interrupt(caught[0])


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


if __name__ == "__main__":  # the watchdog: python -m fedsim.processes <parent pid> <grace s> <root pid>...
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(sys.argv[1]), {int(a) for a in sys.argv[3:]}, float(sys.argv[2]))
