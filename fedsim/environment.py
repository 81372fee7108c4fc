"""What a run needs of the process it runs in: a working directory, a temp directory Ray can write (Python's
``tempfile``, fedsim's own, passes over one it cannot write by itself), libraries that load, and address space for
them and for Ray.

A fault there is an :class:`~fedsim.errors.EnvironmentFault`: one line naming the cause and what to change, never
a library's traceback or a fatal error that names another cause. The checks that can run early do (the working
directory and, under an address-space limit, the libraries, before ``fedsim`` loads them; Ray's temp directory
before Ray starts); what fails later is named where it is caught (:func:`fault_of`). Only the standard library is
imported here: ``fedsim``'s command line checks before it loads torch.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import overload

from fedsim.errors import EnvironmentFault

# A child process loads what a run loads before the command itself does (check_libraries_load)
LIBRARIES_PROBE = "import fedsim.engines.runner"
LIBRARIES_LOAD_S = 120.0  # what takes a few seconds (beside two busy processes, 20): a child that spins is stopped
# The longest path of a socket Ray makes in its temp directory (its session's name holds a time and a pid of up
# to 7 digits); AF_UNIX takes at most 107 bytes
RAY_SOCKET = ("session_2000-01-01_00-00-00_000000_9999999", "sockets", "plasma_store")
SOCKET_PATH_MAX = 107
WITHOUT_RAY = "or run the clients in this process (engine: local, simulation.backend: inline)"
RAISE_LIMIT = "raise it (ulimit -v unlimited) and run again"
# torch's CPU allocator out of memory raises a RuntimeError saying this
TORCH_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"


def check_working_directory() -> None:
    """The working directory exists: relative paths are read from it, and torch's libraries fail to load
    without it (a fatal error naming one of them)."""
    try:
        os.getcwd()
    except FileNotFoundError as err:
        raise EnvironmentFault(
            "the working directory no longer exists (deleted or moved after the shell entered it): cd into a "
            "directory that exists and run the command again"
        ) from err


def address_space_limit() -> int | None:
    """This process's limit on its address space (``ulimit -v``), in bytes; None when there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _limit(limit: int) -> str:
    return f"the address-space limit (ulimit -v {limit // 1024} KiB)"


def check_libraries_load() -> None:
    """Under an address-space limit, what a run loads is loaded by a child process first: torch under too low a
    limit fails to map a library, raises a MemoryError, aborts in C++ (no handler in the loading process sees
    that) or, at the limit's edge, spins forever, depending on the limit. Without a limit, nothing is done."""
    limit = address_space_limit()
    if limit is None:
        return
    try:
        child = subprocess.run(
            [sys.executable, "-c", LIBRARIES_PROBE], capture_output=True, text=True, timeout=LIBRARIES_LOAD_S
        )
    except subprocess.TimeoutExpired:
        said = f"not loaded in {LIBRARIES_LOAD_S:g} s"
    else:
        if child.returncode == 0:
            return
        said = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
    raise EnvironmentFault(
        f"fedsim's libraries (torch, Flower) do not load under {_limit(limit)} ({' '.join(said.split())}): "
        f"{RAISE_LIMIT}"
    )


def check_ray_temp_dir() -> None:
    """The temp directory a Ray started here writes into (its sockets, logs and session files): ``RAY_TMPDIR``,
    else ``TMPDIR``, else ``/tmp``, with ``ray`` below it; made if absent, as Ray would."""
    from ray._common.utils import get_default_ray_temp_dir

    path = Path(get_default_ray_temp_dir())
    source = next((f" (from {name}={os.environ[name]})" for name in ("RAY_TMPDIR", "TMPDIR") if name in os.environ), "")
    change = f"set RAY_TMPDIR to a directory you can write, with a short path, {WITHOUT_RAY}"
    if len(str(path.joinpath(*RAY_SOCKET)).encode()) > SOCKET_PATH_MAX:
        most = SOCKET_PATH_MAX - len(str(Path("/").joinpath(*RAY_SOCKET)))
        raise EnvironmentFault(
            f"Ray's temp directory {path}{source} is too long a path for Ray's sockets (at most {most} bytes): {change}"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".fedsim-probe-", dir=path))
    except OSError as err:
        raise EnvironmentFault(
            f"Ray's temp directory {path}{source} cannot be written: {err.strerror}; {change}"
        ) from err


def check_ray_started(err: Exception) -> None:
    """Ray failing to start here under an address-space limit, as that limit's fault; nothing without one."""
    if (limit := address_space_limit()) is not None:
        raise EnvironmentFault(
            f"Ray did not start here ({_first_line(err)}) under {_limit(limit)}, too low for Ray's servers: "
            f"{RAISE_LIMIT}, {WITHOUT_RAY}"
        ) from err


@overload
def fault_of(err: ImportError | MemoryError) -> EnvironmentFault: ...
@overload
def fault_of(err: BaseException) -> EnvironmentFault | None: ...
def fault_of(err: BaseException) -> EnvironmentFault | None:
    """``err`` as the environment's fault it is, or None: an import that failed (a library that does not load)
    or memory that ran out."""
    if isinstance(err, ImportError):
        return _library_fault(err)
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and TORCH_OUT_OF_MEMORY in str(err)):
        limit = address_space_limit()
        change = (
            f"{_limit(limit)} is too low for this run: {RAISE_LIMIT}"
            if limit is not None
            else "free memory on this machine, or ask less of it (a smaller model or batch, fewer clients at once)"
        )
        return EnvironmentFault(f"out of memory ({_first_line(err)}): {change}")
    return None


def _library_fault(err: ImportError) -> EnvironmentFault:
    """The library whose import failed, why (the loader's words) and what to change."""
    library = _failed_library(err)
    why = _first_line(_innermost(err))
    limit = address_space_limit()
    dirs = [d.rstrip("/") for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d.strip("/")]
    broken = next((d for d in dirs if f"{d}/" in why), None)
    if limit is not None:
        change = f"under {_limit(limit)}: {RAISE_LIMIT}"
    elif broken is not None:
        change = f"LD_LIBRARY_PATH puts {broken} first: take it out of LD_LIBRARY_PATH, or mend the library there"
    else:
        from importlib.metadata import packages_distributions

        dist = (packages_distributions().get(library) or [library])[0]
        change = f"reinstall it (pip install --force-reinstall {dist})"
    return EnvironmentFault(f"cannot load {library}: {why}; {change}")


def _failed_library(err: ImportError) -> str:
    """The top-level package whose import failed: the innermost module on the way that is neither fedsim's nor
    Python's import machinery, else the module that was not found."""
    failed = (err.name or "a library").partition(".")[0]
    tb = err.__traceback__
    while tb is not None:
        top = str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
        failed = failed if top in ("fedsim", "importlib", "__main__", "") else top
        tb = tb.tb_next
    return failed


def _innermost(err: BaseException) -> BaseException:
    """The first error of a chain of import errors (numpy's says only "Original error was: ..." at its end)."""
    while isinstance(cause := err.__cause__ or err.__context__, ImportError | OSError):
        err = cause
    return err


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
