"""SIGTERM ends every command as Ctrl-C does (one line, status 143 = 128 + 15; Ctrl-C stays 130), from
its first moment to its last, on every engine; and a run on Ray leaves no Ray process behind however it
ends, SIGKILL included (Ray's agents once lived on for a minute under PID 1)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsim.processes import Process, Terminated, alive, sigterm_as_interrupt, tree
from tests.conftest import REPO, host_address, small_config, write_config
from tests.fault_lines import assert_said, fault_line

STOPPED = fault_line("interrupted by SIGTERM")


def default_sigint() -> None:
    """Ctrl-C's default in a child, as a shell starts a command in the foreground (a suite started in the
    background has SIGINT ignored, and its children with it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(tmp_path: Path, **sections: dict) -> subprocess.Popen[str]:  # type: ignore[type-arg]
    cfg = small_config(tmp_path, train={"rounds": 10_000, "local_steps": 1}, eval={"every": 1}, **sections)
    cmd = [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg))]
    return subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)  # fmt: skip


def handles_sigterm(pid: int) -> bool:
    """True once process ``pid`` has a handler of its own for SIGTERM (its caught-signals mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & 1 << (signal.SIGTERM - 1))


def run_until(proc: subprocess.Popen[str], condition, timeout: float) -> set[Process]:  # type: ignore[no-untyped-def]
    """Wait for ``condition(the processes proc started so far, itself included)``; those processes."""
    seen: set[Process] = set()
    deadline = time.monotonic() + timeout
    while not condition(seen) and time.monotonic() < deadline and proc.poll() is None:
        seen |= tree({proc.pid})
        time.sleep(0.05)
    return seen


def trained(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A condition: the run under ``tmp_path`` has recorded a round its clients trained (its first line of
    metrics.jsonl is whole), so Ray's workers and their actors are up: what they did, not what their processes
    are titled (Ray's to set; the run's processes are found by descent, whatever their titles)."""

    def found(_: set[Process]) -> bool:
        return any(m.read_text().count("\n") for m in (tmp_path / "runs").glob("*/metrics.jsonl"))

    return found


def why_not_yet(proc: subprocess.Popen[str], seen: set[Process]) -> str:  # type: ignore[type-arg]
    """What a run that did not get as far as awaited was doing: the processes it had started (their command
    lines), its Ray instance's logs (in the temp directory Ray picks, as fedsim.environment checks it: the
    raylet's and GCS's warnings and errors, the ends of the others), then (stopped by SIGTERM,
    or SIGKILL where that is not heeded) its stderr."""
    from ray._common.utils import get_default_ray_temp_dir  # on a failure only: the module loads no Ray

    started = sorted(cmdline(p[0]).replace(b"\0", b" ").decode(errors="replace")[:100] for p in seen if alive(p))
    logs = []
    for session in Path(get_default_ray_temp_dir()).glob(f"session_*_{proc.pid}"):
        for log in sorted((session / "logs").glob("*")):
            if log.is_file() and log.stat().st_size and log.name != "debug_state.txt":  # counters only
                lines = log.read_text(errors="replace").splitlines()
                if log.name.startswith(("raylet", "gcs_server")):  # their warnings and errors, not their routine
                    lines = [line for line in lines if re.match(r"\[\S+ \S+ [WEF] ", line)]
                logs.append(f"{log.name}: " + "\n".join(lines)[-1500:])
    proc.send_signal(signal.SIGTERM)
    try:
        err = proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        err = proc.communicate()[1]
    return "\n".join(["running:", *started, *logs, f"stderr: {err[-3000:]}"])


def has_thread(pid: int, name: str) -> bool:
    """True while process ``pid`` has a thread named ``name``."""
    try:
        return any((task / "comm").read_text().strip() == name for task in Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # ended, or a thread ended while being read
        return False


def assert_all_gone(seen: set[Process]) -> None:
    """Every process in ``seen`` ends within seconds of the run (Ray's agents too: not a minute later)."""
    deadline = time.monotonic() + 15
    while (left := {p for p in seen if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [cmdline(pid).split(b"\0")[0] for pid, _ in left]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended
        return b""


def test_sigterm_during_start_up_is_one_line_and_143(tmp_path: Path) -> None:
    proc = start_run(tmp_path)
    run_until(proc, lambda _: handles_sigterm(proc.pid), timeout=10)  # fedsim's handler: before heavy imports
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # still starting: nothing was written, and the line names no run directory or metrics
    assert (proc.returncode, err) == (128 + signal.SIGTERM, STOPPED + "\n")
    assert not (tmp_path / "runs").exists()


# SIGTERM on Flower's runtime (which once hung) and SIGKILL on the Ray pool (only the watchdog can stop Ray's
# agents then); SIGTERM on the Ray pool takes the same path as on Flower's runtime (fedsim.app.cli, handlers_kept),
# and is left out for the suite's time
@pytest.mark.parametrize(
    ("engine", "sig"),
    [({"simulation": {"backend": "ray", "threads": 1}}, signal.SIGKILL), ({"engine": "flower"}, signal.SIGTERM)],
    ids=["ray-pool-sigkill", "flower-sigterm"],
)
@pytest.mark.slow
def test_a_run_on_ray_stopped_mid_way_leaves_nothing_running(
    tmp_path: Path,
    engine: dict,
    sig: signal.Signals,
) -> None:
    proc = start_run(tmp_path, **engine)
    seen = run_until(proc, trained(tmp_path), timeout=300)  # Ray up, its agents too, the clients' actors trained
    assert trained(tmp_path)(seen), why_not_yet(proc, seen)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:  # one line (after what the engine logged while it ran), not Ray's exit 15 and dump
        # the line says where the run stands, as it is on disk: its metrics kept
        (run_dir,) = (tmp_path / "runs").iterdir()
        so_far = fault_line("metrics kept", run_dir=re.escape(str(run_dir)))
        assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert re.match(f"{STOPPED}; {so_far}", err.splitlines()[-1]), err[-3000:]
        assert "Traceback" not in err and "***" not in err
    assert_all_gone(seen)  # however it ended, what it started ends with it


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_while_inline_clients_train_is_one_line(tmp_path: Path, sig: signal.Signals) -> None:
    """Inline clients train in a thread of fedsim's own, bounded by train.round_timeout_s (fedsim.deadline): a
    signal stops that thread with the run (left in torch's C++ code as Python exited, it aborted the process:
    exit -6, "terminate called without an active exception", 2 of 2)."""
    cfg = small_config(tmp_path, train={"rounds": 10_000, "local_steps": 50}, eval={"every": 1})
    cmd = [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg))]
    proc = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)  # fmt: skip
    deadline = time.monotonic() + 300
    metrics = tmp_path / "runs"
    while proc.poll() is None and time.monotonic() < deadline:  # rounds going: the clients' thread trains most of it
        if sum(len(m.read_text().splitlines()) for m in metrics.glob("*/metrics.jsonl")) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    stopped = STOPPED if sig == signal.SIGTERM else fault_line("interrupted")
    assert re.match(f"{stopped}; " + fault_line("metrics kept", run_dir=""), err.splitlines()[-1]), err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]


# Ray's core worker starts in this process inside ray.init, with the worker.io thread (Ray 2.x's name for
# its I/O thread): a SIGTERM then went to the absl failure handler it installs (a stack dump, then abort() 3 s
# later: exit 134, 3 of 3 tries before the fix), and a Ctrl-C, raised inside ray.init, left the core worker
# half built to crash the interpreter's exit (exit 139, 2 of 2). Both now wait for ray.init to return.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.slow
def test_a_signal_while_ray_starts_is_one_line_and_leaves_nothing_running(tmp_path: Path, sig: signal.Signals) -> None:
    proc = start_run(tmp_path, simulation={"backend": "ray", "threads": 1})
    seen = run_until(proc, lambda _: has_thread(proc.pid, "worker.io"), timeout=300)
    assert has_thread(proc.pid, "worker.io"), why_not_yet(proc, seen)
    proc.send_signal(sig)
    seen |= run_until(proc, lambda _: False, timeout=120)  # and what ray.init starts after the signal
    _, err = proc.communicate(timeout=60)
    how = STOPPED if sig == signal.SIGTERM else fault_line("interrupted")
    # made before Ray starts, no round run yet: removed, and the line says so
    removed = fault_line("nothing kept", run_dir=re.escape(str(tmp_path / "runs")) + "/t-[0-9-]+")
    assert proc.returncode == 128 + sig and re.fullmatch(f"{how}; {removed}\n", err), err
    assert list((tmp_path / "runs").iterdir()) == []
    assert_all_gone(seen)


# simulation.ray_address at a port that accepts and never answers: Ray's retries of the connection (11 minutes)
# ran in C++ that no signal reached, and fedsim deferred both while ray.init ran: only SIGKILL ended it
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.slow
def test_a_signal_while_fedsim_waits_on_a_ray_address_ends_it_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    with socket.socket() as listener:  # the kernel completes each connection; nobody answers on it
        listener.bind((host_address(), 0))  # where ray.init dials a GCS (its own address for 127.0.0.1)
        listener.listen(16)
        listener.settimeout(120)
        address = "{}:{}".format(*listener.getsockname())
        proc = start_run(tmp_path, simulation={"backend": "ray", "ray_address": address})
        # the address's first connection (is anything there?), then the one that waits for an answer
        connections = [listener.accept()[0] for _ in range(2)]
        time.sleep(1)  # in the wait
        seen = tree({proc.pid})
        proc.send_signal(sig)
        signalled = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"fedsim run still waited on the address 60 s after {sig.name}")
        finally:
            for conn in connections:
                conn.close()
    how = STOPPED if sig == signal.SIGTERM else fault_line("interrupted")
    assert proc.returncode == 128 + sig and re.fullmatch(how + "\n", err), err
    assert time.monotonic() - signalled < 15
    assert not (tmp_path / "runs").exists()  # the address is checked before anything is written
    assert_all_gone(seen)


@pytest.mark.slow
def test_output_to_a_reader_that_stopped_is_quiet() -> None:
    """``fedsim list | head -1``: SIGPIPE's status (141), no BrokenPipeError traceback. The pipe's reader is
    gone before fedsim writes anything, so the first write fails on any machine, however fast."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([sys.executable, "-m", "fedsim.app.cli", "list"], cwd=REPO, stdout=write_end,
                             stderr=subprocess.PIPE, timeout=60)  # fmt: skip
    finally:
        os.close(write_end)
    assert (res.returncode, res.stderr) == (128 + signal.SIGPIPE, b"")


class _SignalledOnCollection:
    """Sends this process a signal from ``__del__``, where Python ignores any exception: the handler's
    Terminated is raised there and would be dropped (as in a weakref callback of an import during start-up,
    where a SIGTERM once left fedsim run going)."""

    def __init__(self, sig: signal.Signals) -> None:
        self.sig = sig

    def __del__(self) -> None:
        signal.raise_signal(self.sig)
        sum(range(1000))  # the handler runs here, inside __del__


@pytest.mark.parametrize(("sig", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_raised_where_python_ignores_exceptions_is_raised_again(
    sig: signal.Signals, raised: type[BaseException]
) -> None:
    # Python's own Ctrl-C handler, as a command has it (a test worker may have SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(raised), sigterm_as_interrupt():
            dying = _SignalledOnCollection(sig)
            del dying
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the main thread's next steps, where the signal is delivered again
                pass
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_stopped_after_a_checkpoint_says_how_to_continue_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C after a checkpoint: the one line names ``fedsim run --resume`` (before one, it cannot)."""
    import fedsim.engines
    from fedsim.app.cli import main

    def stopped_after_a_checkpoint(experiment, resume: bool) -> None:  # noqa: ANN001
        (Path(experiment.config.output.run_dir) / "checkpoint.pt").write_bytes(b"")  # as a checkpoint lands
        raise KeyboardInterrupt

    monkeypatch.setattr(fedsim.engines, "run_with_engine", stopped_after_a_checkpoint)
    run_dir = tmp_path / "r"
    assert main(["run", str(write_config(tmp_path, small_config(tmp_path, output={"run_dir": str(run_dir)})))]) == 130
    err, where = capsys.readouterr().err, re.escape(str(run_dir))
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert_said("interrupted after a checkpoint", err[:-1], how=fault_line("interrupted"), run_dir=where,
                kept=fault_line("no metrics kept", run_dir=where))  # fmt: skip
