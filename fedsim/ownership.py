"""fedsim writes only into directories that are its own.

A directory fedsim writes into (a run directory, a sweep directory, a ``fedsim local`` continuation, a
``fedsim compose`` project) is one it made, or one it found empty; either way it marks it with a file,
``.fedsim``, naming what the directory is. A directory that holds anything and no such mark (a user's own
``config.yaml``, ``model.pt``, a project of theirs) is never written into: one line names it and says how
to choose another. Nothing in it is read, moved or replaced.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedsim.errors import ConfigError
from fedsim.reading import KIB, read_text

MARKER = ".fedsim"


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
            return ConfigError(f"{field}: {part} is a file, not a directory")
    return None


def check_own(path: Path, kind: str, field: str) -> None:
    """Refuse ``path`` unless fedsim may write there as ``kind`` (``run``, ``sweep``, ...): absent, an empty
    directory, or one marked as fedsim's ``kind``. ``field``: the config field or argument that named it."""
    if error := unusable(path, field):
        raise error
    try:
        if not path.exists() or not any(path.iterdir()):
            return
    except OSError as err:
        raise ConfigError(f"{field}: cannot list {path}: {err.strerror}") from err
    mark = path / MARKER
    owner = read_text(mark, "fedsim's mark", KIB).strip() if mark.is_file() else None
    if owner == kind:
        return
    what = f"a fedsim {owner}, not a {kind}" if owner else "not fedsim's"
    raise ConfigError(
        f"{field} {path} is {what}: fedsim writes only into a new or empty directory or one of its own "
        f"{kind} directories (marked {MARKER}); give another {field}, or empty that directory"
    )


def mark_own(path: Path, kind: str) -> None:
    """Mark the directory ``path`` (checked by :func:`check_own`) as fedsim's ``kind``."""
    mark = path / MARKER
    if not mark.is_file():
        mark.write_text(kind + "\n")
