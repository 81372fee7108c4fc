"""A call bounded in time: plugin code that may never return, run in a daemon thread and waited for with a deadline.

A thread stuck in plugin code cannot be killed from outside, so fedsim waits for the call only until its
deadline and then goes on to stop the run in one line. The call is then stopped at its next line of
Python (an exception raised in its thread), and waited for a few seconds more: a thread still inside
torch's C++ code when the interpreter exits aborts the process ("terminate called without an active
exception", exit -6), so a loop of torch calls must end first. One blocked in C (a sleep, a lock) cannot
be stopped; it is a daemon thread, which does not keep the process alive. The same when the wait itself
is interrupted (Ctrl-C, SIGTERM): the call stops with its caller.

The call sees what is per thread as the caller has it: the context variables (numpy's ``errstate``) and
torch's grad mode, so it computes the same numbers as the same call made in the caller's thread.
"""

from __future__ import annotations

import contextvars
import ctypes
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from fedsim.plugin_guard import BOUNDED

T = TypeVar("T")
STOP_WAIT_S = 5.0  # how long a call that overran or was interrupted is given to stop at its next line


class _Abandoned(BaseException):
    """Raised in a bounded call's thread when nobody waits for its result any more (a BaseException, so that
    plugin code's ``except Exception`` does not keep it running)."""


def call_within(call: Callable[[], T], timeout_s: float, overran: Callable[[], BaseException]) -> T:
    """``call()``'s result, or what it raised, if it ends within ``timeout_s`` seconds; else ``overran()`` is
    raised here once the call is stopped or given up on. A call made from within a bounded call runs as it
    is, under its caller's deadline."""
    if getattr(threading.current_thread(), BOUNDED, False):
        return call()
    context, grad = contextvars.copy_context(), torch.is_grad_enabled()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            with torch.set_grad_enabled(grad):
                outcome.append((True, context.run(call)))
        except BaseException as err:  # noqa: BLE001 (raised again in the caller's thread)
            outcome.append((False, err))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="fedsim-bounded-call", daemon=True)
    setattr(thread, BOUNDED, True)
    thread.start()
    try:
        finished = done.wait(timeout_s)
    except BaseException:  # Ctrl-C or SIGTERM while waiting
        _stop(thread, done)
        raise
    if not finished:
        _stop(thread, done)
        raise overran()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _stop(thread: threading.Thread, done: threading.Event) -> None:
    """Raise :class:`_Abandoned` in ``thread`` at its next line of Python, and give it a few seconds to end."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident or 0), ctypes.py_object(_Abandoned))
    done.wait(STOP_WAIT_S)
