"""A call bounded in time (fedsim/deadline.py): its result or its exception within the deadline, else the caller's
error once the call is stopped; the caller's per-thread settings inside it. What a run says when a plugin overruns
train.round_timeout_s: tests/test_plugin_guard.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from fedsim.deadline import call_within
from fedsim.plugin_guard import abandoned_calls


class Overran(Exception):
    pass


def test_a_call_that_ends_in_time_gives_its_result_or_raises_its_error() -> None:
    assert call_within(lambda: 41 + 1, 30, Overran) == 42

    def fails() -> None:
        raise KeyError("from the plugin")

    with pytest.raises(KeyError, match="from the plugin"):
        call_within(fails, 30, Overran)


def test_a_call_past_its_deadline_is_stopped_at_its_next_line_and_the_caller_raises() -> None:
    steps: list[int] = []
    stopped = threading.Event()

    def loops() -> None:
        try:
            while True:  # Python lines: stoppable
                steps.append(1)
                time.sleep(0.01)
        finally:
            stopped.set()

    start = time.monotonic()
    with pytest.raises(Overran):
        call_within(loops, 0.3, Overran)
    assert time.monotonic() - start < 30  # a deadline, not a wait for the call (generous: a loaded machine)
    assert stopped.wait(30) and steps  # it ran, then stopped at a line of its own
    seen = len(steps)
    time.sleep(0.1)
    assert len(steps) == seen  # and runs no more


def test_the_call_sees_the_callers_grad_mode_and_numpy_errstate() -> None:
    def settings() -> tuple[bool, str]:
        return torch.is_grad_enabled(), np.geterr()["over"]

    with torch.no_grad(), np.errstate(over="ignore"):
        assert call_within(settings, 30, Overran) == (False, "ignore")
    assert call_within(settings, 30, Overran) == (True, np.geterr()["over"])


def test_a_bounded_call_inside_a_bounded_call_runs_under_the_outer_deadline() -> None:
    threads: list[str] = []

    def inner() -> str:
        threads.append(threading.current_thread().name)
        return "inner"

    assert call_within(lambda: call_within(inner, 30, Overran), 30, Overran) == "inner"
    assert threads == ["fedsim-bounded-call"]  # the inner call ran in the outer call's thread


def test_a_call_given_up_on_while_blocked_in_c_counts_as_abandoned_until_it_ends() -> None:
    release = threading.Event()
    with pytest.raises(Overran):
        call_within(release.wait, 0.2, Overran)  # a lock wait in C: no line of Python to stop it at
    assert abandoned_calls()  # fedsim's command then ends without Python's own exit (fedsim.app.cli.main)
    release.set()
    deadline = time.monotonic() + 30
    while abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not abandoned_calls()
