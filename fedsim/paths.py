"""Paths written in config files: independent of the working directory, and shipped data by name."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_PREFIX = "fedsim:"


def home_expanded(value: str) -> str:
    """A path as fedsim takes every path it is given (config files, sweep files, arguments): ``~`` and
    ``~user`` at its start are the home directory, as a shell makes them (which it does not in a config file,
    in quotes or after ``--out=``); without this, a directory named ``~`` appears in the working directory."""
    return os.path.expanduser(value)


def resolve_path(value: str, base: Path) -> str:
    """A path from a config file, made independent of the working directory: relative to the file;
    URLs and ``fedsim:<path>`` (see :func:`package_path`) untouched."""
    if value.startswith(PACKAGE_PREFIX) or "://" in value or Path(value).expanduser().is_absolute():
        return value
    return str((base / value).resolve())


def package_path(value: str) -> Path:
    """``fedsim:<path>`` is a file shipped inside the installed fedsim package, resolved where it is
    read: the same config then works from a checkout, a wheel, a container or a Flower App bundle."""
    if value.startswith(PACKAGE_PREFIX):
        return Path(__file__).parent / value.removeprefix(PACKAGE_PREFIX)
    return Path(value).expanduser()
