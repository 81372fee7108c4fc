"""Supervised processes (fedsim/processes.py), on real child processes: a process named by (pid, start time), the
tree walked by parent id (sessions of their own included), signals sent to none that has ended or whose pid was
reused, ``stop_tree``'s SIGTERM then SIGKILL, ``run_in_charge``'s child (own process group, Ctrl-C and SIGTERM
passed on, dying with its parent), the listening sockets of a process, the watchdog (stops the tree once the
launcher is gone, spares other watchdogs, ends by itself). The tests that raise signals in their own process
(``run_in_charge`` passing them on, ``sigterm_as_interrupt``, ``handlers_kept``, ``signals_deferred``,
``signals_ignored``) are tests/signals_in_process.py, run here in a pytest of their own. Whole commands under
signals: tests/test_signals.py.

Every process a test starts is ended and reaped at its end (the ``children`` fixture)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fedsim import processes
from fedsim.processes import (
    Process,
    alive,
    describe,
    identity,
    listening_pids,
    listening_sockets,
    parents,
    run_in_charge,
    send,
    stop_tree,
    tree,
    wait_gone,
    watchdog,
)
from tests.conftest import REPO

PY = sys.executable
WAIT_S = 60.0  # for what takes milliseconds: a loaded machine starts a Python in well under a second
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids run below it: never a live process's
SLEEP = "import time; time.sleep(600)"
READY = "print('ready', flush=True); import time; time.sleep(600)"  # says once it runs its own code
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + READY

# a launcher: one grandchild in a session of its own (as Flower detaches its processes), reported by pid
LAUNCHER = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                     stdout=subprocess.DEVNULL)
print(g.pid, flush=True)
time.sleep(600)
"""


# --- the test's own reading of /proc, and the processes it starts ------------------------------------------------


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the state on (the command name, which may hold spaces and ')', skipped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def ended(process: Process) -> bool:
    """True once ``process`` (pid, start time) has exited: no such pid, a zombie, or the pid another's."""
    fields = stat_fields(process[0])
    return fields is None or fields[0] == "Z" or int(fields[19]) != process[1]


def until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.02)


class Children:
    """The processes a test starts: its own children (Popen) and the grandchildren they report (by pid and start
    time, so a pid reused meanwhile is never signalled); :meth:`close` ends and reaps them all."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.others: list[Process] = []
        self._buffers: dict[int, bytes] = {}

    def start(self, code: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stdin", subprocess.DEVNULL)
        return self.own(subprocess.Popen([PY, "-c", code, *args], cwd=REPO, **popen))

    def own(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.popens.append(proc)
        return proc

    def adopt(self, pid: int, start: int | None = None) -> Process:
        """A grandchild to end at the test's end: ``pid``, alive now (or of start time ``start``)."""
        if start is None:
            fields = stat_fields(pid)
            assert fields is not None and fields[0] != "Z", f"pid {pid} is not running"
            start = int(fields[19])
        self.others.append((pid, start))
        return pid, start

    def line(self, proc: subprocess.Popen[bytes]) -> list[str]:
        """The next line ``proc`` writes, in words (fails after WAIT_S, or at its end of output)."""
        assert proc.stdout is not None
        fd, buffer = proc.stdout.fileno(), self._buffers.get(proc.pid, b"")
        deadline = time.monotonic() + WAIT_S
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                pytest.fail(f"no line from pid {proc.pid} within {WAIT_S:.0f} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                pytest.fail(f"pid {proc.pid} ended its output without a line (exit {proc.poll()}): {buffer!r}")
            buffer += chunk
        head, _, self._buffers[proc.pid] = buffer.partition(b"\n")
        return head.decode().split()

    def close(self) -> None:
        for pid, start in self.others:
            if not ended((pid, start)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.popens:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=WAIT_S)
            for stream in (proc.stdout, proc.stdin):
                if stream is not None:
                    stream.close()


@pytest.fixture
def children() -> Iterator[Children]:
    started = Children()
    try:
        yield started
    finally:
        started.close()


# --- naming a process -------------------------------------------------------------------------------------------


def test_identity_is_the_pid_and_its_start_time_in_clock_ticks_since_boot(children: Children) -> None:
    def uptime() -> float:
        return float(Path("/proc/uptime").read_text().split()[0])

    before = uptime()
    proc = children.start(SLEEP)
    after = uptime()
    pid, start = identity(proc.pid)  # type: ignore[misc]
    ticks = os.sysconf("SC_CLK_TCK")
    assert pid == proc.pid and before - 2 / ticks <= start / ticks <= after + 2 / ticks
    own = identity(os.getpid())
    assert own is not None and own[1] <= start and identity(os.getpid()) == own
    assert alive((pid, start)) and not alive((pid, start + 1))  # the same pid started at another time: another
    assert identity(PID_MAX) is None and not alive((PID_MAX, 0))


def test_identity_reads_past_a_command_name_holding_spaces_and_parentheses(children: Children) -> None:
    """A process may name itself ``) Z 1 (x``: its state and start time are read after the last ')'."""
    rename = "import sys; sys.stdin.readline(); open('/proc/self/comm', 'w').write(') Z 1 (x'); print('ok', flush=True)"
    proc = children.start(rename + "; import time; time.sleep(600)", stdin=subprocess.PIPE)
    before = identity(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert children.line(proc) == ["ok"]
    assert Path(f"/proc/{proc.pid}/comm").read_text() == ") Z 1 (x\n"
    assert before is not None and identity(proc.pid) == before and alive(before)
    assert parents()[proc.pid] == os.getpid()


def test_a_zombie_is_no_live_process(children: Children) -> None:
    proc = children.start("pass")
    until(lambda: (stat_fields(proc.pid) or ["?"])[0] == "Z", "the child's exit (not reaped: a zombie)")
    assert Path(f"/proc/{proc.pid}").exists()  # still in the process table
    assert identity(proc.pid) is None and proc.pid not in parents() and tree({proc.pid}) == set()
    assert proc.wait(timeout=WAIT_S) == 0


def test_tree_walks_down_by_parent_id_into_sessions_of_their_own(children: Children) -> None:
    launcher = children.start(LAUNCHER)
    grandchild = children.adopt(int(children.line(launcher)[0]))
    assert os.getsid(grandchild[0]) == grandchild[0] != os.getsid(launcher.pid)  # detached from the launcher
    links = parents()
    assert links[launcher.pid] == os.getpid() and links[grandchild[0]] == launcher.pid
    both = {identity(launcher.pid), grandchild}
    assert tree({launcher.pid}) == both
    assert tree({launcher.pid, PID_MAX}) == both  # a root that is gone adds nothing
    assert tree({grandchild[0]}) == {grandchild}  # downwards only
    assert tree({PID_MAX}) == set()


# --- signalling ---------------------------------------------------------------------------------------------------


def test_send_signals_only_a_process_still_of_its_start_time(children: Children) -> None:
    proc = children.start(SLEEP)
    me = identity(proc.pid)
    assert me is not None
    send({(me[0], me[1] + 1), (PID_MAX, 0)}, signal.SIGKILL)  # its pid started at another time; a pid unused
    send({me}, signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == -signal.SIGTERM  # a SIGKILL sent first would have ended it instead
    send({me}, signal.SIGKILL)  # ended: nothing to send, no error


def test_wait_gone_is_true_once_none_is_alive_and_false_at_its_timeout(children: Children) -> None:
    assert wait_gone(set(), 0.0) and wait_gone({(PID_MAX, 0)}, 0.0)
    proc = children.start("import sys; sys.stdin.read()", stdin=subprocess.PIPE)
    me = identity(proc.pid)
    assert me is not None
    t0 = time.monotonic()
    assert not wait_gone({me}, 0.2)
    assert time.monotonic() - t0 >= 0.2
    assert proc.stdin is not None
    proc.stdin.close()  # it ends
    assert wait_gone({me}, WAIT_S)  # a zombie counts as gone: nobody needs to reap it first
    assert proc.wait(timeout=WAIT_S) == 0


def test_stop_tree_ends_a_tree_that_takes_sigterm_without_waiting_for_the_grace(children: Children) -> None:
    launcher = children.start(LAUNCHER)
    grandchild = children.adopt(int(children.line(launcher)[0]))
    t0 = time.monotonic()
    stop_tree({launcher.pid}, grace_s=WAIT_S)
    assert time.monotonic() - t0 < WAIT_S
    assert launcher.wait(timeout=WAIT_S) == -signal.SIGTERM
    until(lambda: ended(grandchild), "the detached grandchild's end")


STUBBORN_LAUNCHER = """
import signal, subprocess, sys, time
def respawn(signum, frame):  # SIGTERM: start another child, go on
    h = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL)
    print(h.pid, open(f"/proc/{h.pid}/stat").read().rsplit(")", 1)[1].split()[19], flush=True)
signal.signal(signal.SIGTERM, respawn)
g = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True, stdout=subprocess.PIPE)
assert g.stdout.readline() == b"ready\\n"
print(g.pid, flush=True)
while True:
    time.sleep(600)
"""


def test_stop_tree_kills_what_outlives_the_grace_and_what_was_started_meanwhile(
    children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = children.start(STUBBORN_LAUNCHER, STUBBORN)
    grandchild = children.adopt(int(children.line(launcher)[0]))  # ignores SIGTERM
    started_on_sigterm: list[Process] = []
    real_wait_gone = processes.wait_gone

    def grace(seen: set[Process], timeout: float) -> bool:  # the grace begins once the launcher has its new child
        if not started_on_sigterm:
            pid, start = map(int, children.line(launcher))
            started_on_sigterm.append(children.adopt(pid, start))
        return real_wait_gone(seen, timeout)

    monkeypatch.setattr(processes, "wait_gone", grace)
    stop_tree({launcher.pid}, grace_s=0.5)
    assert launcher.wait(timeout=WAIT_S) == -signal.SIGKILL
    assert ended(grandchild) and ended(started_on_sigterm[0])


# --- a child in charge, and dying with the parent ---------------------------------------------------------------


def test_run_in_charge_returns_the_exit_status_and_feeds_stdin(tmp_path: Path) -> None:
    out = tmp_path / "stdin"
    code = "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read()); sys.exit(3)"
    assert run_in_charge([PY, "-c", code, str(out)], stdin=b"line 1\nline 2") == 3
    assert out.read_bytes() == b"line 1\nline 2"
    assert run_in_charge([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) == -signal.SIGKILL


ORPHANED = """
import subprocess, sys, time
from fedsim.processes import die_with_parent
code = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: (open(sys.argv[1], "w").write("SIGTERM"), os._exit(0)))
open(sys.argv[2], "w").close()
time.sleep(600)
'''
g = subprocess.Popen([sys.executable, "-c", code, *sys.argv[1:]], preexec_fn=die_with_parent(),
                     stdout=subprocess.DEVNULL)
print(g.pid, flush=True)
time.sleep(600)
"""


def test_a_child_started_with_die_with_parent_gets_sigterm_when_its_parent_is_killed(
    tmp_path: Path, children: Children
) -> None:
    said, ready = tmp_path / "said", tmp_path / "ready"
    parent = children.start(ORPHANED, str(said), str(ready))
    child = children.adopt(int(children.line(parent)[0]))
    until(ready.exists, "the child's SIGTERM handler")
    parent.kill()  # SIGKILL: the parent runs no code of its own
    assert parent.wait(timeout=WAIT_S) == -signal.SIGKILL
    until(lambda: said.exists() and said.read_text() == "SIGTERM", "the parent-death signal")
    until(lambda: ended(child), "the child's end")


def test_die_with_exits_at_once_when_the_parent_is_already_another_process(children: Children) -> None:
    code = "import os, sys; from fedsim.processes import die_with; die_with(int(sys.argv[1])); print('alive')"
    mine = children.start(code, str(os.getpid()))
    assert mine.communicate(timeout=WAIT_S)[0] == b"alive\n" and mine.returncode == 0
    other = children.start(code, "1")  # not its parent: that one died before, as far as it can tell
    assert other.communicate(timeout=WAIT_S)[0] == b"" and other.returncode == 1


def test_describe_names_the_pid_and_at_most_120_characters_of_its_command_line(children: Children) -> None:
    argv = [PY, "-c", READY, "x" * 200]
    proc = children.start(READY, "x" * 200)
    assert children.line(proc) == ["ready"]  # its command line is set up (right after exec it is still empty)
    assert describe(proc.pid) == f"pid {proc.pid}: " + " ".join(argv)[:120]
    assert describe(PID_MAX) == f"pid {PID_MAX}: ?"


# --- listening sockets ----------------------------------------------------------------------------------------------

SOCKETS = """
import socket, time
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
client = socket.create_connection(tcp.getsockname())  # connected: no way in
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
peer.connect(udp.getsockname())  # a connected UDP socket takes only its peer's datagrams: no way in
try:
    tcp6 = socket.socket(socket.AF_INET6)
    tcp6.bind(("::1", 0))
    tcp6.listen()
    port6 = tcp6.getsockname()[1]
except OSError:  # no IPv6 on this host
    port6 = 0
print(tcp.getsockname()[1], udp.getsockname()[1], port6, flush=True)
time.sleep(600)
"""


def test_listening_sockets_are_the_listening_tcp_and_unconnected_udp_ones(children: Children) -> None:
    proc = children.start(SOCKETS)
    tcp, udp, tcp6 = map(int, children.line(proc))
    expected = {("tcp", "127.0.0.1", tcp), ("udp", "127.0.0.1", udp)} | ({("tcp", "::1", tcp6)} if tcp6 else set())
    assert listening_sockets(proc.pid) == expected
    assert listening_pids(tcp) == {proc.pid}
    proc.kill()
    proc.wait(timeout=WAIT_S)
    assert listening_sockets(proc.pid) == set()


def test_proc_net_addresses_are_read_word_by_word_in_host_order() -> None:
    """x86 is little-endian: each 32-bit word of /proc/net/tcp's address is byte-reversed."""
    assert processes._address("0100007F") == "127.0.0.1"
    assert processes._address("00000000") == "0.0.0.0"
    assert processes._address("00000000000000000000000001000000") == "::1"
    assert processes._address("B80D0120000000000000000001000000") == "2001:db8::1"



UNRAISABLE = "pytest.PytestUnraisableExceptionWarning"


def test_the_signal_tests_pass_in_a_pytest_process_of_their_own() -> None:
    """tests/signals_in_process.py: the tests that raise SIGINT and SIGTERM in their own process."""
    argv = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", f"error::{UNRAISABLE}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not a worker of this suite's
    res = subprocess.run([*argv, "tests/signals_in_process.py"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"\b11 passed\b", res.stdout) and "Unraisable" not in res.stdout, res.stdout[-3000:]


# --- the watchdog -------------------------------------------------------------------------------------------------


def test_the_watchdog_runs_in_a_session_of_its_own_ignoring_ctrl_c_and_ends_with_its_roots(
    children: Children,
) -> None:
    roots = [children.start(SLEEP, stdout=subprocess.DEVNULL) for _ in range(2)]
    dog = children.own(watchdog({roots[1].pid, roots[0].pid}, grace_s=3.0))
    assert os.getsid(dog.pid) == dog.pid != os.getsid(0)

    def ignores_ctrl_c() -> bool:
        status = Path(f"/proc/{dog.pid}/status").read_text()
        ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
        return bool(ignored & 1 << (signal.SIGINT - 1))

    until(ignores_ctrl_c, "the watchdog's SIGINT ignored")  # running its own code: its command line is set up
    pids = sorted(r.pid for r in roots)
    cmdline = Path(f"/proc/{dog.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert cmdline == [PY.encode(), b"-m", b"fedsim.processes", str(os.getpid()).encode(), b"3.0",
                       *(str(p).encode() for p in pids)]  # fmt: skip
    assert dog.poll() is None  # this process and its roots live: it watches
    for root in roots:
        root.kill()
        root.wait(timeout=WAIT_S)
    assert dog.wait(timeout=WAIT_S) == 0  # its roots are gone: nothing left to watch


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], threading.Event]:
    """The watchdog's loop every 20 ms; ``scanned(pid)``: an Event set once the loop has found launcher ``pid``
    alive a second time, i.e. after it has walked the tree once."""
    monkeypatch.setattr(processes, "WATCH_EVERY_S", 0.02)

    def scanned(launcher: int) -> threading.Event:
        event, seen, real = threading.Event(), [0], processes.alive

        def counting(process: Process) -> bool:
            found = real(process)
            if process[0] == launcher and found:
                seen[0] += 1
                if seen[0] >= 2:
                    event.set()
            return found

        monkeypatch.setattr(processes, "alive", counting)
        return event

    return scanned


def watching(parent: int, roots: set[int], grace_s: float) -> threading.Thread:
    """The watchdog's loop (what ``python -m fedsim.processes`` runs) in a thread of this process."""
    thread = threading.Thread(target=processes._watch, args=(parent, roots, grace_s), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("root_code", "ends_by"), [(SLEEP, signal.SIGTERM), (STUBBORN, signal.SIGKILL)],
                         ids=["takes-sigterm", "ignores-sigterm"])  # fmt: skip
def test_the_watchdog_stops_its_roots_once_the_launcher_is_gone(
    children: Children, scanned: Callable[[int], threading.Event], root_code: str, ends_by: signal.Signals
) -> None:
    launcher = children.start(SLEEP, stdout=subprocess.DEVNULL)
    root = children.start(root_code)
    if root_code == STUBBORN:
        assert children.line(root) == ["ready"]
    event = scanned(launcher.pid)
    thread = watching(launcher.pid, {root.pid}, grace_s=0.5)
    assert event.wait(WAIT_S)
    assert root.poll() is None  # untouched while the launcher lives
    launcher.kill()
    launcher.wait(timeout=WAIT_S)
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert root.wait(timeout=WAIT_S) == -ends_by


WHOLE_TREE = """
import subprocess, sys, time
s = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                     stdout=subprocess.DEVNULL)
w = subprocess.Popen([sys.executable, "-c", sys.argv[1], "-m", "fedsim.processes"],
                     stdout=subprocess.PIPE)  # a command line as a watchdog's
assert w.stdout.readline() == b"ready\\n"  # running: its command line is set up
print(s.pid, w.pid, flush=True)
time.sleep(600)
"""


def test_the_watchdog_without_roots_stops_the_launchers_whole_tree_but_another_watchdog(
    children: Children, scanned: Callable[[int], threading.Event]
) -> None:
    launcher = children.start(WHOLE_TREE, READY)
    detached, other = (children.adopt(int(pid)) for pid in children.line(launcher))
    event = scanned(launcher.pid)
    thread = watching(launcher.pid, set(), grace_s=WAIT_S)
    assert event.wait(WAIT_S)
    launcher.kill()  # the launcher's children are PID 1's now: the watchdog knows them from its last walk
    launcher.wait(timeout=WAIT_S)
    thread.join(WAIT_S)
    assert not thread.is_alive()
    until(lambda: ended(detached), "the detached grandchild's end")
    assert not ended(other)  # another watchdog, watching the same tree: never stopped by this one


def test_the_watchdog_ends_by_itself_once_its_roots_end_while_the_launcher_lives(children: Children) -> None:
    launcher, root = children.start(SLEEP, stdout=subprocess.DEVNULL), children.start(SLEEP, stdout=subprocess.DEVNULL)
    thread = watching(launcher.pid, {root.pid}, grace_s=0.5)
    root.kill()
    root.wait(timeout=WAIT_S)
    thread.join(WAIT_S)
    assert not thread.is_alive() and launcher.poll() is None


def test_the_watchdog_of_a_launcher_already_gone_stops_nothing(children: Children) -> None:
    root = children.start(SLEEP, stdout=subprocess.DEVNULL)
    processes._watch(PID_MAX, {root.pid}, 0.5)  # returns: it never saw the launcher alive
    assert root.poll() is None


