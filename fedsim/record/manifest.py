"""The one integrity scheme of a run record: a file is recorded by its size and the SHA-256 of its bytes (its
*entry*, :func:`entry_of`). ``summary.json`` and ``progress.json`` hold a manifest (``files``) of an entry per
file of :data:`fedsim.record.layout.MANIFEST` the run has written; ``checkpoint.pt`` holds the entry of its
payload and of each node's state file; ``summary.json`` the SHA-256 of its own other fields, encoded as
:func:`canonical_json` does. A file that changed on disk after fedsim wrote it (an edit, a truncation, another
run's copy) is refused instead of reported, trained on or continued from."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError
from fedsim.record.layout import VERSION_KEY

FILES = "files"  # summary.json, progress.json: the manifest, file name -> entry
SIZE, SHA256 = "size", "sha256"  # an entry's fields
SUMMARY_CHECKSUM = "summary_sha256"  # summary.json: the SHA-256 of its other fields (summary_checksum)
DATA_FINGERPRINT = "data_sha256"  # checkpoint.pt, summary.json: the data's fingerprint (fedsim.data.fingerprint)
# what a summary holds for fedsim to check files against, not for a researcher to read: summaries shown leave them out
CHECKS = (FILES, SUMMARY_CHECKSUM, DATA_FINGERPRINT, VERSION_KEY)

FileEntry = dict[str, Any]  # {"size": bytes, "sha256": hex}


def entry_of(data: bytes | memoryview) -> FileEntry:
    """The entry of a file holding ``data``: its size and the SHA-256 of its bytes."""
    return {SIZE: len(data), SHA256: hashlib.sha256(data).hexdigest()}


def check_entry(
    where: Path, data: bytes, entry: FileEntry, source: str, hint: str, tail: Callable[[bytes], bool] | None = None
) -> None:
    """Refuse ``data`` (what ``where`` holds) unless it is the file ``entry`` (recorded in ``source``) says:
    its size, and the SHA-256 of its bytes; ``tail`` accepts bytes past the recorded size (the one line a live
    run appends before its next progress.json). ``hint``: what to do."""
    size = entry[SIZE]
    if len(data) < size or (len(data) > size and not (tail is not None and tail(data[size:]))):
        raise FedsimError(
            f"{where}: {len(data):,} bytes where the run wrote {size:,} (its {SIZE} in {source}; cut short, written "
            f"to after the run, or another run's): {hint}"
        )
    if hashlib.sha256(memoryview(data)[:size]).hexdigest() != entry[SHA256]:
        raise FedsimError(
            f"{where}: not the file the run wrote (its {SHA256} in {source} differs; edited after the run, or "
            f"another run's): {hint}"
        )


class GrowingEntry:
    """The entry of a file written a piece at a time (metrics.jsonl, a line per evaluation): one piece more is
    one step, so a run keeps it up to date without reading the file again."""

    def __init__(self, data: bytes = b"") -> None:
        self._sha256, self.size = hashlib.sha256(data), len(data)

    def add(self, data: bytes) -> None:
        self._sha256.update(data)
        self.size += len(data)

    def entry(self) -> FileEntry:
        return {SIZE: self.size, SHA256: self._sha256.hexdigest()}


def canonical_json(value: Any) -> bytes:
    """``value`` as JSON with sorted keys and no spaces: the same bytes for the same fields however a file laid
    them out."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def summary_checksum(summary: dict[str, Any]) -> str:
    """The SHA-256 of a summary's fields but its own (``summary_sha256``), as :func:`canonical_json` encodes
    them: every number a report or ``fedsim.open_run`` shows (wall time, speed) is the run's."""
    return hashlib.sha256(canonical_json({k: v for k, v in summary.items() if k != SUMMARY_CHECKSUM})).hexdigest()
