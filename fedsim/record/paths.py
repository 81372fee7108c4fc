"""Where run directories are: the one a run writes to (made, or refused naming the config field at fault) and
those a command reads (a run directory, or every one below a directory; :func:`run_dirs`)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedsim.config import RunConfig
from fedsim.errors import FedsimError
from fedsim.files import check_links
from fedsim.ownership import MARKER, RESULTS, RESULTS_BESIDE, check_own, mark_own, unusable
from fedsim.record.layout import ENTRIES, LOCAL_JSON, RECORD_FILES


def default_run_dir(cfg: RunConfig) -> Path:
    if cfg.output.run_dir:
        return Path(cfg.output.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output.dir) / f"{cfg.name}-{stamp}"


def make_dir(path: Path, field: str = "output.run_dir") -> None:
    """``path`` as a directory fedsim can make entries in, or an error naming the config field and the part of
    ``path`` at fault (a file, a symlink loop, a directory where nothing can be made)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise (unusable(path, field) or FedsimError(f"{field}: cannot create {path}: {err.strerror}")) from err
    try:  # a directory made and removed: what access(2) cannot tell (/proc says writable; a read-only mount)
        os.rmdir(tempfile.mkdtemp(prefix=".fedsim-probe-", dir=path))
    except OSError as err:
        raise FedsimError(f"{field}: cannot create anything in {path}: {err.strerror}") from err


def make_results_dir(path: Path, field: str, names: Iterable[str]) -> None:
    """``path`` as a directory for ``fedsim report``'s and ``fedsim plot``'s files (``names``), which replace
    their own there: a new one or fedsim's (:func:`fedsim.ownership.check_own`), else an error naming ``field``
    (the option that chooses another); one of those files that is a link there is refused before any is
    written (:func:`fedsim.files.check_links`)."""
    check_own(path, RESULTS, field, RESULTS_BESIDE)
    check_links(path, [MARKER, *names])
    make_dir(path, field)
    mark_own(path, RESULTS)


def runs_root(path: str | Path, arg: str) -> Path:
    """``path`` as a directory to read runs from, or an error naming the argument ``arg`` that gave it."""
    path = Path(path)
    if not path.is_dir():
        missing = "" if path.exists() else " (nothing is there)"
        raise FedsimError(
            f"{arg} {path} is not a directory{missing}: give a run directory or a directory holding run directories"
        )
    return path


def resolved(path: Path, field: str) -> Path:
    """``path`` made absolute, symlinks followed; a symlink loop is an error naming the link at fault."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: Python 3.11's pathlib on a loop
        raise (unusable(path, field) or FedsimError(f"{field}: {path}: {err}")) from err


def check_run_links(path: Path, entries: Iterable[str] = ()) -> None:
    """Refuse a link among what fedsim writes in the run directory ``path`` (:data:`fedsim.record.layout.ENTRIES`, and
    ``entries`` of another kind of directory of fedsim's), or below those that are directories: before it
    writes there, so that the link stops it before anything is written (:func:`fedsim.files.check_links`)."""
    check_links(path, [*ENTRIES, *entries])


def holds_a_run(path: Path) -> bool:
    """``path`` holds a run's record (:data:`RECORD_FILES`; a ``fedsim local`` continuation's metrics.jsonl is not
    one), marked as fedsim's or not: a run directory cloned from a repository has no mark."""
    return not (path / LOCAL_JSON).exists() and any((path / name).is_file() for name in RECORD_FILES)


def directories_under(root: Path) -> Iterator[Path]:
    """``root`` and every directory below it, symlinks to directories followed (runs gathered into a folder by
    link; Python 3.11's ``Path.rglob`` passes them over), each real directory once, as first reached in name
    order: one reached twice is one, and a link back up is no loop."""
    seen: set[str] = set()
    for top, subdirs, _files in os.walk(root, followlinks=True):
        subdirs.sort()
        real = os.path.realpath(top)
        if real in seen:
            subdirs.clear()
            continue
        seen.add(real)
        yield Path(top)


def run_dirs(root: Path) -> list[Path]:
    """``root`` if it holds a run, else every directory below it that does (:func:`directories_under`), in order:
    each to be read whole (:func:`fedsim.record.run.read_run`) or refused, never passed over for a file it lacks."""
    if holds_a_run(root):
        return [root]
    return [path for path in directories_under(root) if holds_a_run(path)]
