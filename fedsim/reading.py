"""The reading boundary: every file fedsim reads back comes through here.

A reader opens only a regular file, without ever blocking on it (a FIFO, a device such as
``/dev/zero``, a directory, a socket, or a ``/proc`` / ``/sys`` file whose size is unknown in advance
are refused), reads at most a stated number of bytes (a 50 MB "config" is an error, not a MemoryError),
and turns what cannot be decoded into one line that names the file and, for the JSON fedsim writes,
the field (:func:`read_json`, :func:`parse_json_lines`: pydantic schemas, whose JSON parser also bounds
nesting). YAML goes through :func:`fedsim.config_file.read_yaml`, which reads with :func:`read_text`.

Errors are :class:`~fedsim.errors.FedsimError` subclasses chosen by the caller (``error=``): a config
file is a :class:`~fedsim.errors.ConfigError`, a dataset a :class:`~fedsim.errors.DataError`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import BaseModel, ValidationError

from fedsim.errors import ConfigError, FedsimError, brief

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
CONFIG_BYTES = 4 * MIB  # a config or sweep file; the paper configs are under 2 KiB
SUMMARY_BYTES = 16 * MIB  # summary.json, progress.json, local.json, error.txt, partition.csv (a row per client)
METRICS_BYTES = GIB  # metrics.jsonl: 10,000 evaluations of a few KiB each stay well below it


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def check_source(path: str | Path, what: str, error: type[FedsimError] = ConfigError) -> None:
    """``path``, if it exists, is a regular file or a directory (a dataset root may be either); a FIFO, a
    device or a socket would hang or never end when read, so it is an error naming ``what`` it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # whoever reads it says what is missing (a loader may download it)
    except OSError as err:
        raise error(f"{what} {path}: cannot read it ({err.strerror})") from err
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise error(f"{what} {path}: {kind_of(mode)}, not a file or a directory fedsim can read")


@contextmanager
def _regular(path: str | Path, what: str, limit: int, error: type[FedsimError]) -> Iterator[int]:
    """``path`` open for reading (blocking), once it is known to be a regular file of at most ``limit`` bytes."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as err:
        raise error(f"{what} not found: {Path(path).absolute()}") from err
    except OSError as err:
        raise error(f"{what} {path}: cannot read it ({err.strerror})") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} {path}: {kind_of(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise error(f"{what} {path}: {info.st_size:,} bytes; fedsim reads at most {limit:,} for it")
        os.set_blocking(fd, True)
        if info.st_size == 0 and os.pread(fd, 1, 0):  # /proc and /sys files say 0 bytes, then have some
            raise error(f"{what} {path}: a /proc or /sys file (its size is unknown in advance), not a regular file")
        yield fd
    except OSError as err:
        raise error(f"{what} {path}: cannot read it ({err.strerror})") from err
    finally:
        os.close(fd)


def read_bytes(path: str | Path, what: str, limit: int, error: type[FedsimError] = ConfigError) -> bytes:
    """The whole of the regular file ``path``, at most ``limit`` bytes; anything else is one line naming
    ``what`` the file is, the path and why (missing, not a regular file, larger than ``limit``, unreadable)."""
    with _regular(path, what, limit, error) as fd:
        data = bytearray()
        while len(data) <= limit and (chunk := os.read(fd, min(16 * MIB, limit + 1 - len(data)))):
            data += chunk
    if len(data) > limit:  # grew while read
        raise error(f"{what} {path}: grew while read; fedsim reads at most {limit:,} bytes for it")
    return bytes(data)


def read_text(path: str | Path, what: str, limit: int, error: type[FedsimError] = ConfigError) -> str:
    """:func:`read_bytes`, decoded as UTF-8 (anything else is an error naming the first bad byte)."""
    data = read_bytes(path, what, limit, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} {path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from err


def schema_problem(err: ValidationError) -> str:
    """The first problem pydantic found, as ``field: what is wrong (got value)``: one line, not a dump."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the top level"
    got = "" if first["type"] == "missing" else f" (got {brief(first.get('input'), 60)})"
    more = f"; {err.error_count() - 1} more" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{got}{more}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    """``json.loads``' ``object_pairs_hook``: a key given twice is an error (the last would silently win, and
    fedsim never writes one twice; its YAML reader refuses them too)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"{key}: given twice in one object")
        seen.add(key)


def _validated(
    data: bytes, schema: type[BaseModel], where: str, error: type[FedsimError], context: dict[str, Any] | None = None
) -> Any:
    """``data`` as JSON, once ``schema`` accepts it: the value as written (key order kept), never a coerced
    copy. pydantic's parser refuses NaN / inf and nesting beyond 200 levels (json.loads: a RecursionError),
    but keeps the last of a duplicate key, which ``json.loads`` then finds (on nesting pydantic bounded).
    ``context``: what the schema's validators check against (a run's length). ``where``: the file (and line)
    for the error."""
    try:
        value = pydantic_core.from_json(data, allow_inf_nan=False)
        json.loads(data, object_pairs_hook=_unique_keys)
        schema.model_validate(value, context=context)
    except ValidationError as err:  # before ValueError, its base
        raise error(f"{where}: not readable as the JSON fedsim writes ({schema_problem(err)})") from err
    except ValueError as err:
        raise error(f"{where}: not readable as the JSON fedsim writes ({err})") from err
    return value


def read_json(
    path: str | Path, schema: type[BaseModel], what: str, limit: int = SUMMARY_BYTES,
    error: type[FedsimError] = FedsimError,
) -> Any:  # fmt: skip
    """A JSON file fedsim wrote, as written, once ``schema`` accepts it; a file that is not (edited,
    truncated, another program's) is one line naming the file and the field."""
    return _validated(read_bytes(path, what, limit, error), schema, f"{what} {path}", error)


def parse_json_lines(
    data: bytes, path: str | Path, schema: type[BaseModel], what: str, error: type[FedsimError] = FedsimError,
    increasing: str | None = None, context: dict[str, Any] | None = None,
) -> list[Any]:  # fmt: skip
    """``data``, a JSON Lines file fedsim wrote (``path``; blank lines skipped), every line as :func:`read_json`
    reads a file; ``increasing``: the field (the schema's, an int) that grows from each line to the next, as
    fedsim writes them (a line repeated or out of order would be drawn and tabulated twice); ``context``: what
    the schema's validators check each line against."""
    values: list[Any] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{what} {path}, line {number}"
        value = _validated(line, schema, where, error, context)
        if increasing and values and value[increasing] <= values[-1][increasing]:
            raise error(
                f"{where}: not readable as the JSON fedsim writes ({increasing}: {value[increasing]} after "
                f"{increasing} {values[-1][increasing]}; each line's {increasing} is larger than the last's)"
            )
        values.append(value)
    return values
