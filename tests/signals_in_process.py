"""The tests of fedsim/processes.py that raise SIGINT and SIGTERM in their own process: ``run_in_charge`` passing
them on, ``sigterm_as_interrupt``, ``handlers_kept``, ``signals_deferred`` and ``signals_ignored``. They run in a
pytest process of their own, which tests/test_processes.py starts (its file name keeps it out of the suite's own
collection): in a worker of the suite, the signals they raise reached the worker again as it ended, a
KeyboardInterrupt in a garbage-collection callback.

A signal a test raises meets a handler of the test's own (``guarded``) if the code under test fails to take it."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedsim import processes
from fedsim.processes import (
    Terminated,
    handlers_kept,
    run_in_charge,
    signals_deferred,
    signals_ignored,
    sigterm_as_interrupt,
    sigterm_raised,
)
from tests.conftest import REPO
from tests.test_processes import PY, WAIT_S


@pytest.fixture
def guarded() -> Iterator[list[int]]:
    """SIGINT and SIGTERM handled by the test (recorded in the list it yields) instead of ending pytest, as they
    were after it; and the record that SIGTERM was raised in this process cleared again."""
    got: list[int] = []
    before = {sig: signal.signal(sig, lambda s, _f: got.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        processes._sigterm_raised.clear()


def in_thread(target: Callable[[], object]) -> list[BaseException]:
    """Run ``target`` in another thread to its end (within WAIT_S); what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as e:  # noqa: B036 - reported to the test
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return raised


def test_run_in_charge_starts_its_child_in_a_group_of_its_own_with_ctrl_c_and_a_parent_death_signal(
    tmp_path: Path, guarded: list[int]
) -> None:
    """Started with SIGINT ignored (a script's background job), the child still takes Ctrl-C: Python installs its
    own Ctrl-C handler only where SIGINT was left at its default."""
    out = tmp_path / "child.json"
    code = """
import ctypes, json, os, signal, sys
pdeathsig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
json.dump({"own_group": os.getpgrp() == os.getpid(), "ppid": os.getppid(), "pdeathsig": pdeathsig.value,
           "ctrl_c": signal.getsignal(signal.SIGINT) is signal.default_int_handler}, open(sys.argv[1], "w"))
"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert run_in_charge([PY, "-c", code, str(out)], cwd=REPO) == 0
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # this process's own, as it was
    seen = json.loads(out.read_text())
    assert seen == {"own_group": True, "ppid": os.getpid(), "pdeathsig": signal.SIGTERM, "ctrl_c": True}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_run_in_charge_passes_ctrl_c_and_sigterm_on_to_its_child(
    tmp_path: Path, guarded: list[int], sig: signal.Signals
) -> None:
    ready = tmp_path / "ready"
    code = f"""
import os, signal, sys, time
signal.signal({int(sig)}, lambda s, f: os._exit(40 + s))
open(sys.argv[1], "w").close()
time.sleep({WAIT_S})  # never signalled: ends 0
"""
    mine = signal.getsignal(sig)

    def signal_when_ready() -> None:  # at this process's main thread, once run_in_charge handles it
        deadline = time.monotonic() + WAIT_S
        while not (ready.exists() and signal.getsignal(sig) is not mine) and time.monotonic() < deadline:
            time.sleep(0.02)
        signal.pthread_kill(threading.main_thread().ident, sig)  # type: ignore[arg-type]

    sender = threading.Thread(target=signal_when_ready, daemon=True)
    sender.start()
    code_returned = run_in_charge([PY, "-c", code, str(ready)])
    sender.join(WAIT_S)
    assert code_returned == 40 + sig  # the child's own handler: the signal reached it
    assert guarded == [] and signal.getsignal(sig) is mine  # not this process's, and its handler back


def test_sigterm_as_interrupt_raises_sigterm_as_terminated_then_puts_everything_back(guarded: list[int]) -> None:
    hook, handler = sys.unraisablehook, signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as err, sigterm_as_interrupt():
        assert not sigterm_raised()
        signal.raise_signal(signal.SIGTERM)
    assert isinstance(err.value, KeyboardInterrupt)  # unwinds as Ctrl-C does
    assert sigterm_raised()
    assert sys.unraisablehook is hook and signal.getsignal(signal.SIGTERM) is handler and guarded == []
    with sigterm_as_interrupt():
        assert not sigterm_raised()  # an earlier block's SIGTERM is not this one's


def test_nested_sigterm_blocks_keep_one_hook_that_passes_other_errors_to_the_one_before(
    monkeypatch: pytest.MonkeyPatch, guarded: list[int]
) -> None:
    passed_on: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: passed_on.append(u.exc_type))

    class Failing:
        def __del__(self) -> None:
            raise ValueError("in __del__, where Python drops it")

    with sigterm_as_interrupt():
        outer = sys.unraisablehook
        with sigterm_as_interrupt():
            assert sys.unraisablehook is outer
            obj = Failing()
            del obj
        assert sys.unraisablehook is outer and signal.getsignal(signal.SIGTERM) is processes._raise_terminated
    assert passed_on == [ValueError]


def test_handlers_kept_puts_back_the_handlers_of_before_the_block(guarded: list[int]) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with handlers_kept():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert {sig: signal.getsignal(sig) for sig in before} == before

    def elsewhere() -> None:
        with handlers_kept():
            pass

    assert in_thread(elsewhere) == []  # in another thread: nothing to put back, and no error for trying


def test_signals_deferred_winds_down_on_the_first_signal_and_raises_it_after_the_block(guarded: list[int]) -> None:
    wound, went_on = [], []
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with signals_deferred(lambda: wound.append("wind down")):
            signal.raise_signal(signal.SIGTERM)
            went_on.append("the block goes on")
        went_on.append("not reached")
    assert wound == ["wind down"] and went_on == ["the block goes on"] and sigterm_raised()
    assert signal.getsignal(signal.SIGTERM) is handler and guarded == []  # put back before it was raised
    processes._sigterm_raised.clear()
    with pytest.raises(KeyboardInterrupt) as err, signals_deferred(lambda: wound.append("again")):
        signal.raise_signal(signal.SIGINT)
    assert type(err.value) is KeyboardInterrupt and not sigterm_raised() and wound[1:] == ["again"]


def test_signals_deferred_raises_a_second_signal_at_once(guarded: list[int]) -> None:
    wound, went_on = [], []
    with pytest.raises(Terminated), signals_deferred(lambda: wound.append("wind down")):
        signal.raise_signal(signal.SIGINT)
        went_on.append("after the first")
        signal.raise_signal(signal.SIGTERM)
        went_on.append("after the second")
    assert wound == ["wind down"] and went_on == ["after the first"] and guarded == []


def test_signals_deferred_raises_the_signal_not_what_winding_down_broke(guarded: list[int]) -> None:
    with pytest.raises(Terminated), signals_deferred(lambda: None):
        signal.raise_signal(signal.SIGTERM)
        raise RuntimeError("a worker thread lost as the run wound down")
    wound: list[str] = []
    with pytest.raises(RuntimeError, match="no signal"), signals_deferred(lambda: wound.append("wind down")):
        raise RuntimeError("no signal")
    assert wound == [] and guarded == []


def test_signals_deferred_and_signals_ignored_outside_the_main_thread_only_run_the_block(guarded: list[int]) -> None:
    ran: list[str] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def elsewhere() -> None:
        with signals_deferred(lambda: ran.append("wind down")):
            ran.append("deferred")
        with signals_ignored():
            ran.append("ignored")

    assert in_thread(elsewhere) == []
    assert ran == ["deferred", "ignored"] and {sig: signal.getsignal(sig) for sig in before} == before


def test_signals_ignored_drops_ctrl_c_and_sigterm_inside_the_block(guarded: list[int]) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with signals_ignored():
        assert {sig: signal.getsignal(sig) for sig in before} == dict.fromkeys(before, signal.SIG_IGN)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert guarded == []  # dropped, not delivered once the handlers were back
