"""fedsim's one way to write into its own directories: never through a link it did not make.

A directory of fedsim's (a run directory, a sweep and its cells, a ``fedsim local`` continuation, a
``fedsim compose`` project, the files of ``fedsim report`` and ``fedsim plot``, a SuperNode's client state)
is at a path the user gives: a link on that path is their choice, followed. Below it every directory is
entered by name from the one above it, without following a symbolic link (``O_NOFOLLOW``), and every file
is made, opened, renamed over or removed by name in its directory's descriptor, so a symbolic link there
(a stopped run's ``.lock`` pointing at a user's file, its ``client_state/`` at a user's directory) is never
written, truncated or deleted through: it is a :class:`~fedsim.errors.LinkError` naming it. So is a file
with more than one name (a hard link): appending to it or truncating it writes into every name.
:func:`check_links` looks over a directory's entries for both before a command writes anything there.

Whole files are written to a temp file beside them (a new one: ``O_EXCL``) and renamed over them, synced
first where asked (checkpoints): a write that fails (a full disk) leaves no temp file and is one
:class:`~fedsim.errors.WriteError` naming the file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedsim.errors import FedsimError, LinkError, WriteError
from fedsim.reading import kind_of

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC


def unwritten(path: Path, err: OSError) -> WriteError:
    """The error for a write of ``path`` that failed (a full disk, a read-only directory)."""
    strerror = err.strerror or str(err)
    return WriteError(f"cannot write {path}: {strerror}; what was written before it is kept", path, strerror)


def _refusal(path: Path, info: os.stat_result, target: str = "") -> FedsimError | None:
    """Why the entry ``path`` (``info``: its own status, not its target's) may not be written through: a
    symbolic link (to ``target``), a file of more than one name, or a FIFO, socket or device (opening a FIFO
    to write waits for a reader forever, and its reader gets what is written); else None."""
    if stat.S_ISLNK(info.st_mode):
        return LinkError(
            f"{path} is a symbolic link (to {target}) in a directory of fedsim's, which never writes or deletes "
            "through a link: remove the link (what it points to is left as it is)"
        )
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return LinkError(
            f"{path} is one of {info.st_nlink} names of one file (a hard link) in a directory of fedsim's, which "
            "would write into every name: remove this name, or put a copy of the file there"
        )
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        kind = kind_of(info.st_mode)
        return WriteError(
            f"{path} is {kind} in a directory of fedsim's, where it writes only files and directories: remove it",
            path, kind,
        )  # fmt: skip
    return None


def _check_entry(path: Path, directory: int) -> os.stat_result | None:
    """The status of ``path``, the entry ``path.name`` of the open ``directory``, once it is no link; None if
    there is none."""
    try:
        info = os.stat(path.name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None
    target = os.readlink(path.name, dir_fd=directory) if stat.S_ISLNK(info.st_mode) else ""
    if (refusal := _refusal(path, info, target)) is not None:
        raise refusal
    return info


@contextlib.contextmanager
def _directory(path: Path, root: Path, make: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``path``: ``root`` opened as given (a link on the user's path is theirs),
    each directory below it entered by name, never through a link (made first where ``make``, ``root`` too)."""
    if make:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, _DIRECTORY)
    try:
        below = root
        for part in path.relative_to(root).parts:
            below = below / part
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                entered = os.open(part, _DIRECTORY | _NO_LINK, dir_fd=fd)
            except OSError:
                _check_entry(below, fd)  # a link: said as one; anything else as what it is
                raise
            os.close(fd)
            fd = entered
        yield fd
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def make_dirs(path: Path, root: Path) -> None:
    """The directory ``path`` and those between it and ``root`` (the user's path to a directory of fedsim's),
    made where missing, each one a directory and no link."""
    try:
        with _directory(path, root, make=True):
            pass
    except OSError as err:
        raise WriteError(f"cannot create {path}: {err.strerror}", path, err.strerror or str(err)) from err


def write_file(
    path: Path, data: bytes | memoryview, root: Path | None = None, fsync: bool = False, mode: int = 0o666
) -> None:
    """``path`` replaced by ``data`` whole, or left as it was: written to a new temp file beside it (``mode``,
    less the umask: 0o600 for a secret, from the start), synced where ``fsync``, then renamed over it.
    ``root``: the directory of fedsim's that ``path`` is in (default: its own directory); the directories
    between them are made where missing."""
    try:
        with _directory(path.parent, root or path.parent, make=True) as directory:
            _check_entry(path, directory)
            temp = f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINK, mode, dir_fd=directory)
            try:
                try:
                    _write_all(fd, data)
                    if fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:  # a half-written temp file never stays (a full disk, Ctrl-C)
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=directory)
                raise
    except OSError as err:
        raise unwritten(path, err) from err


def open_file(path: Path, flags: int, root: Path | None = None, mode: int = 0o644) -> int:
    """A descriptor of the regular file ``path`` opened with ``flags`` (``os.O_CREAT``: made if missing, with
    ``mode``), never through a link; the caller closes it. Opened without blocking, so that a FIFO put there
    is refused rather than waited on."""
    with _directory(path.parent, root or path.parent) as directory:
        try:
            fd = os.open(path.name, flags | _NO_LINK | os.O_NONBLOCK, mode, dir_fd=directory)
        except OSError:  # ELOOP: a symbolic link; ENXIO: a FIFO that nobody reads
            _check_entry(path, directory)
            raise
    info = os.fstat(fd)
    if (refusal := _refusal(path, info)) is not None:  # a hard link; a FIFO put there since it was looked at
        os.close(fd)
        raise refusal
    os.set_blocking(fd, True)
    return fd


def append_file(path: Path, data: bytes | memoryview, root: Path | None = None) -> None:
    """``data`` appended to ``path`` (made if missing) and synced, or nothing appended: a write that fails (a
    full disk) is cut off again, so the lines before it stay whole."""
    try:
        fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, root)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)
    except OSError as err:
        raise unwritten(path, err) from err


def remove(path: Path, root: Path | None = None) -> None:
    """``path`` removed, a file or a whole directory (its own links removed, never followed), if it is there
    and is no link itself."""
    try:
        with _directory(path.parent, root or path.parent) as directory:
            info = _check_entry(path, directory)
            if info is None:
                return
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path.name, dir_fd=directory)
            else:
                os.unlink(path.name, dir_fd=directory)
    except FileNotFoundError:  # a directory above it is not there either
        return
    except OSError as err:
        raise WriteError(f"cannot remove {path}: {err.strerror}", path, err.strerror or str(err)) from err


def check_links(root: Path, names: Iterable[str] | None = None, deep: bool = True) -> None:
    """Refuse the directory ``root``'s entries ``names`` (default: all of them) where one is a link, and
    (``deep``) anything below those that are directories: before a command writes into ``root``, so that a
    link found there stops it before anything is written."""
    try:
        fd = os.open(root, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):  # nothing there to hold a link: the caller's make_dir says why
        return
    except OSError as err:
        raise WriteError(f"cannot look into {root}: {err.strerror}", root, err.strerror or str(err)) from err
    try:
        _check_below(root, fd, names, deep)
    except OSError as err:
        raise WriteError(f"cannot look into {root}: {err.strerror}", root, err.strerror or str(err)) from err
    finally:
        os.close(fd)


def _check_below(path: Path, directory: int, names: Iterable[str] | None, deep: bool) -> None:
    for name in sorted(os.listdir(directory)) if names is None else names:
        info = _check_entry(path / name, directory)
        if deep and info is not None and stat.S_ISDIR(info.st_mode):
            try:
                fd = os.open(name, _DIRECTORY | _NO_LINK, dir_fd=directory)
            except FileNotFoundError:  # removed meanwhile (a live process's temp directory)
                continue
            try:
                _check_below(path / name, fd, None, deep)
            finally:
                os.close(fd)
