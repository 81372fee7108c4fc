"""One live run owns a run directory (:func:`claimed`): an exclusive lock that the operating system releases
when its process ends, however it ends, so a lock is never stale. A fresh run refuses a directory that is not
fedsim's (:mod:`fedsim.ownership`), one that holds a finished run or one it could resume, and clears the
leftovers of a run that was killed with nothing to resume (:data:`fedsim.record.layout.FRESH_CLEARS`); a link in
it stops the command before anything is written (:func:`fedsim.files.check_links`). A fresh run that fails
before it records anything takes back what it wrote (:func:`take_back`)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fedsim.errors import FedsimError
from fedsim.files import open_file, remove
from fedsim.ownership import MARKER, check_own, mark_own
from fedsim.record.layout import CHECKPOINT, EARLY, FRESH_CLEARS, HELD_ENV, LOCK, METRICS, RESUME_CLEARS, SUMMARY
from fedsim.record.paths import check_run_links, make_dir, resolved


def check_fresh(path: Path, field: str = "output.run_dir", kind: str = "run") -> None:
    """Refuse to start afresh in a directory that is not fedsim's ``kind`` (:func:`fedsim.ownership.check_own`)
    or that holds a finished run or one that could resume."""
    if (path / SUMMARY).is_file():
        raise FedsimError(
            f"output.run_dir {path} holds a finished run ({SUMMARY}); give this run another output.run_dir, "
            "or delete that directory to redo it"
        )
    if (path / CHECKPOINT).is_file():
        raise FedsimError(
            f"output.run_dir {path} holds an unfinished run with a checkpoint: continue it with "
            f"`fedsim run --resume {path}`, or delete that directory to start over"
        )
    check_own(path, kind, field)


@contextmanager
def claimed(
    path: Path,
    resume: bool = False,
    field: str = "output.run_dir",
    owner: str = "run",
    made: bool = False,
    entries: Iterable[str] = (),
) -> Iterator[None]:
    """Own ``path`` for one ``owner`` (a run, a sweep) while the block runs: a fresh run (``resume`` false)
    also clears the leftovers of a killed run there, a resumed one the stopped server's ``progress.json`` and
    ``error.txt``; a directory another live one owns is an error naming its pid. ``field``: the config field
    or argument that named ``path``, for messages. Only a directory that is fedsim's ``owner`` is claimed
    (:mod:`fedsim.ownership`), and marked so; except a run resumed, whose checkpoint (checksummed,
    :mod:`fedsim.record.checksums`) shows it is fedsim's, marked or not. A link among what fedsim writes there
    (:func:`check_run_links`, with the ``entries`` of another ``owner``) is refused before anything is written
    (``path`` itself, the user's, is followed once). A fresh run that fails before it records anything takes
    back what it wrote (:func:`take_back`); the directory too if the run made it (``made``: by its caller, or
    here)."""
    path = resolved(path, field)
    if not resume:
        check_fresh(path, field, owner)
    elif owner != "run":
        check_own(path, owner, field)
    check_run_links(path, entries)
    made = made or not path.exists()
    make_dir(path, field)
    marked = (path / MARKER).is_file()
    if not (resume and owner == "run"):
        mark_own(path, owner)
    if os.environ.get(HELD_ENV) == str(path):  # the launcher that started this process owns it for us
        yield
        return
    with locked(path, field, owner):
        if not resume:
            check_fresh(path, field, owner)  # again, now that nobody else can write here
            for name in FRESH_CLEARS:
                remove(path / name)
        else:  # not this run's: a launcher that polls them would show the old round, or stop at the old error
            for name in RESUME_CLEARS:
                remove(path / name)
        try:
            yield
        except BaseException:
            if not resume and owner == "run":  # while the lock is held: no other run is writing here
                take_back(path, marked, made)
            raise


@contextmanager
def locked(path: Path, field: str = "output.run_dir", owner: str = "run") -> Iterator[None]:
    """``path``'s lock held while the block runs, with this process's pid in it; held by another live process,
    an error naming its pid (``field`` named ``path``; ``owner``: what holds it, for the message)."""
    fd = open_file(path / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise FedsimError(
                f"{field} {path} is in use by another fedsim {owner} ({holder}); wait for it to end, or give "
                f"this {owner} another {field}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def records_nothing(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds nothing but what a fresh run writes before it records anything."""
    with os.scandir(run_dir) as entries:
        return all(entry.name in EARLY for entry in entries)


def take_back(run_dir: Path, marked: bool, made: bool) -> None:
    """A fresh run's directory, when its run failed having recorded nothing (:func:`records_nothing`), as the run
    found it: its files, its lock and its mark (unless ``marked`` before) removed, and the directory itself if the
    run ``made`` it. Anything else there (a log the error names, an error.txt) keeps every file where it is. A
    removal that fails leaves the rest: the run's own error is the one reported."""
    try:
        if not records_nothing(run_dir):
            return
        with os.scandir(run_dir) as entries:
            names = [e.name for e in entries if not (marked and e.name == MARKER)]
        for name in names:
            remove(run_dir / name, run_dir)
        if made:
            run_dir.rmdir()  # fails if another run has claimed it since: it stays, theirs
    except (OSError, FedsimError):  # a removal refused or failed: the run's own error is the one reported
        return


def metrics_so_far(run_dir: Path) -> str:
    """Where a stopped run's metrics are, for the message saying why it stopped: only what is there (a run
    stopped before its first evaluation wrote none, and one that recorded nothing leaves nothing: :func:`claimed`)."""
    if (run_dir / METRICS).is_file():
        return f"the metrics so far are in {run_dir}"
    if records_nothing(run_dir):
        return f"nothing was recorded yet, and what the run wrote in {run_dir} is removed"
    return f"no metrics were written yet (the run directory is {run_dir})"
