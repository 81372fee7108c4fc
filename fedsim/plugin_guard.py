"""Plugin code does not decide when the process ends: it can neither end it nor keep it alive.

**Exits.** fedsim calls plugin code (a strategy's halves, normalisers, models, datasets, partitioners,
trackers) inside :func:`plugin_code`. There ``SystemExit`` (``sys.exit``) becomes a
:class:`~fedsim.errors.PluginExit`, a failure like any exception a plugin raises: a client's is an error
reply and the failure policy applies, the server's stops the run in one line. ``os._exit`` cannot be
caught, so while a thread runs plugin code ``os._exit`` is replaced by a function that raises
``PluginExit`` in that thread and calls the real one in every other thread (Ray's, Flower's) and in a
forked child. Whoever called it is named from the stack: the registry notes the module each plugin it
resolves comes from (:func:`note_plugin`), so the message names the plugin as the config does and the
method of it that fedsim (or torch) called.

**Threads.** A plugin may start threads that never end; a non-daemon one keeps Python from exiting.
:func:`warn_stray_threads` names those a run left, once, and :func:`exit_now` ends the ``fedsim``
command without waiting for them.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import NoReturn

from fedsim.errors import FedsimWarning, PluginExit

# module name -> the plugin it holds, as the config names it ("model.norm 'pkg.mod:Name'")
_PLUGIN_MODULES: dict[str, str] = {}
_lock = threading.Lock()
_guarded = threading.local()  # .labels: the plugin_code() blocks this thread is in, innermost last
_inside = 0  # plugin_code() blocks open now, in all threads: os._exit is replaced while there are any
_real_exit = os._exit
_warned: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
BOUNDED = "fedsim_bounded"  # the attribute that marks a thread running a call bounded in time (fedsim.deadline)


def note_plugin(module: str, label: str) -> None:
    """Code of ``module`` is the plugin ``label`` (e.g. ``"strategy 'pkg.mod:Name'"``) in exit messages."""
    _PLUGIN_MODULES[module] = label


def _labels() -> list[str | None]:
    if not hasattr(_guarded, "labels"):
        _guarded.labels = []
    return _guarded.labels  # type: ignore[no-any-return]


@contextmanager
def plugin_code(who: str | None = None) -> Iterator[None]:
    """Within: plugin code runs in this thread, and its ``sys.exit`` / ``os._exit`` raise ``PluginExit``.
    ``who``: the plugin and method called (``"strategy 'x': Name.aggregate_train"``); by default the
    plugin is found on the stack."""
    global _inside
    labels = _labels()
    labels.append(who)
    with _lock:
        if _inside == 0:
            os._exit = _exit_from_plugin
        _inside += 1
    try:
        yield
    except SystemExit as exit:
        raise _exited(_culprit(who, _frames_of(exit.__traceback__)), f"sys.exit({exit.code!r})") from None
    finally:
        labels.pop()
        with _lock:
            _inside = max(_inside - 1, 0)  # 0 already in a child forked inside plugin code
            if _inside == 0:
                os._exit = _real_exit


def _exited(culprit: tuple[str, str], call: str) -> PluginExit:
    who, where = culprit
    return PluginExit(f"{who} called {call}{where}: a plugin cannot end the run (raise an exception to stop it)")


def _exit_from_plugin(status: int) -> NoReturn:
    labels = getattr(_guarded, "labels", None)
    if not labels:  # another thread's os._exit (Ray's, Flower's), or this one's outside plugin code
        _real_exit(status)
    frames = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    raise _exited(_culprit(labels[-1], frames), f"os._exit({status!r})")


def _reset_in_child() -> None:
    """A forked child runs no plugin code of its parent's: its os._exit (multiprocessing's) is the real one."""
    global _guarded, _lock, _inside
    _guarded, _lock, _inside = threading.local(), threading.Lock(), 0
    os._exit = _real_exit


os.register_at_fork(after_in_child=_reset_in_child)


def _frames_of(tb: TracebackType | None) -> list[FrameType]:
    """The frames of a traceback, innermost first."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "?"))


def _culprit(who: str | None, frames: list[FrameType]) -> tuple[str, str]:
    """Who called the exit and where (`` at file.py:12``), from ``frames`` (innermost first): ``who`` if given,
    else the plugin of the innermost plugin module's frames and the method of it that was called (the
    outermost of those frames)."""
    frames = [f for f in frames if _module(f) != __name__] or frames
    if not frames:
        return who or "plugin code", ""
    exited = frames[0]
    where = f" at {Path(exited.f_code.co_filename).name}:{exited.f_lineno}"
    if who is not None:
        return who, where
    first = next((i for i, f in enumerate(frames) if _module(f) in _PLUGIN_MODULES), None)
    if first is None:  # no plugin module on the stack: name the code itself
        return f"{_module(exited)}:{exited.f_code.co_qualname}", where
    module, last = _module(frames[first]), first
    while last + 1 < len(frames) and _module(frames[last + 1]) == module:
        last += 1
    return f"{_PLUGIN_MODULES[module]}: {frames[last].f_code.co_qualname}", where


def stray_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The non-daemon threads alive now that were not in ``before``: what keeps Python from exiting."""
    return [t for t in threading.enumerate() if not t.daemon and t.is_alive() and t not in before]


def warn_stray_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Warn, once per thread, of the non-daemon threads started since ``before`` and still running (plugin
    code's: fedsim leaves none); returns them all."""
    strays = stray_threads(before)
    if new := [t for t in strays if t not in _warned]:
        _warned.update(new)
        names, them = ", ".join(repr(t.name) for t in new), "them" if len(new) > 1 else "it"
        warnings.warn(
            f"plugin code left {len(new)} thread{'s' * (len(new) > 1)} running ({names}): the fedsim command exits "
            f"without waiting for {them}; a Python process that called fedsim.run waits for {them} as it exits",
            FedsimWarning,
            stacklevel=2,
        )
    return strays


def abandoned_calls() -> bool:
    """Whether a call bounded in time (:mod:`fedsim.deadline`) that was given up on (it overran, or the wait for it
    was interrupted) still runs: one inside torch's C++ code when Python's own exit reaches it aborts the process
    ("terminate called without an active exception", exit status -6), so the command ends by :func:`exit_now`."""
    return any(getattr(t, BOUNDED, False) and t.is_alive() for t in threading.enumerate())


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` now, without waiting for non-daemon threads: the output flushed and the
    exit handlers run (Ray's, temporary files') as at a normal exit."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()
    _real_exit(code)
