"""fedsim writes only into directories that are its own.

A directory fedsim writes into (a run directory, a sweep directory, a ``fedsim local`` continuation, a
``fedsim compose`` project) is one it made, or one it found empty; either way it marks it with a file,
``.fedsim``, naming what the directory is. A directory that holds anything and no such mark (a user's own
``config.yaml``, ``model.pt``, a project of theirs) is never written into: one line names it and says how
to choose another. Nothing in it is read, moved or replaced.

The tables and figures of ``fedsim report`` and ``fedsim plot`` go into a directory of their own (marked
``results``), or beside the runs they are drawn from: into a run, sweep or ``fedsim local`` directory, or a
directory that holds nothing but such directories (a folder of runs), which is then marked as fedsim's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedsim.errors import ConfigError, WriteError
from fedsim.files import write_file
from fedsim.reading import KIB, read_text

MARKER = ".fedsim"
RESULTS = "results"  # a directory of fedsim report's and fedsim plot's files
# the fedsim directories that those files may join: where the runs they are drawn from live
RESULTS_BESIDE = ("run", "sweep", "local continuation")
# directories that never go inside a run directory (a run's own files and fedsim local's continuations do)
NOT_IN_A_RUN = ("run", "sweep")


def unusable(path: Path, field: str) -> ConfigError | None:
    """Why ``path`` cannot be a directory fedsim writes into, as the error to raise, naming ``field`` and the
    first part of ``path`` (from the root down) at fault: a file, a symlink loop, no permission; or None."""
    for part in [*reversed(path.parents), path]:
        try:
            mode = os.stat(part).st_mode
        except FileNotFoundError:
            return None  # this part and what is below it can be made
        except OSError as err:
            return ConfigError(f"{field}: {part}: {err.strerror}")
        if not stat.S_ISDIR(mode):
            return ConfigError(f"{field}: {part} is a file, not a directory; give another {field}")
    return None


def owner(path: Path) -> str | None:
    """The kind of fedsim directory ``path`` is marked as (``run``, ``sweep``, ...), or None."""
    mark = path / MARKER
    return read_text(mark, "fedsim's mark", KIB).strip() if mark.is_file() else None


def check_own(path: Path, kind: str, field: str, beside: tuple[str, ...] = ()) -> None:
    """Refuse ``path`` unless fedsim may write there as ``kind`` (``run``, ``sweep``, ...): absent, an empty
    directory, or one marked as fedsim's ``kind``; or, for files that may join other fedsim directories, one
    marked as one of the kinds ``beside``, or one that holds nothing but fedsim's own directories.
    ``field``: the config field or argument that named it."""
    if error := unusable(path, field):
        raise error
    if kind in NOT_IN_A_RUN:
        check_not_in_a_run(path, field, itself=False)
    try:
        if not path.exists() or not any(path.iterdir()):
            return
        marked = owner(path)
        if marked == kind or marked in beside or (beside and marked is None and _only_fedsims(path)):
            return
    except OSError as err:
        raise ConfigError(f"{field}: cannot list {path}: {err.strerror}") from err
    kinds = " or ".join(filter(None, (", ".join((kind, *beside[:-1])), *beside[-1:])))
    what = f"a fedsim {marked}, not a {kinds}" if marked else "not fedsim's"
    ours = f"one of its own {kinds} directories (marked {MARKER})"
    ours = f"{ours} or one holding only such directories" if beside else ours
    raise ConfigError(
        f"{field} {path} is {what}: fedsim writes only into a new or empty directory or {ours}; give another "
        f"{field}, or empty that directory"
    )


def check_not_in_a_run(path: Path, field: str, itself: bool = True) -> None:
    """Refuse ``path`` (named by ``field``) for runs or a sweep where it is inside a fedsim run directory, or
    (``itself``) is one: a run among another run's files was found with it by report and plot, as two copies
    of one seed."""
    where = path.absolute()
    run = next((p for p in [*([where] if itself else []), *where.parents] if owner(p) == "run"), None)
    if run is not None:
        what = "a run directory" if run == where else f"inside the run directory {run}"
        raise ConfigError(f"{field} {path} is {what}, which holds one run's files: give another {field}")


def _only_fedsims(path: Path) -> bool:
    """Whether every entry of ``path`` is a directory fedsim marked, or one holding only such (a symlink is not)."""
    with os.scandir(path) as entries:
        found = [(entry.is_dir(follow_symlinks=False), Path(entry.path)) for entry in entries]
    return all(is_dir and (owner(sub) is not None or _only_fedsims(sub)) for is_dir, sub in found)


def mark_own(path: Path, kind: str) -> None:
    """Mark the directory ``path`` (checked by :func:`check_own`) as fedsim's ``kind``."""
    mark = path / MARKER
    if not mark.is_file():
        try:
            write_file(mark, f"{kind}\n".encode())
        except WriteError as err:  # a read-only directory: one line, as every write fedsim makes
            raise ConfigError(f"cannot mark {path} as fedsim's ({MARKER}): {err.strerror}") from err
