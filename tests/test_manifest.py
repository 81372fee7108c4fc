"""The one integrity scheme of a run record (fedsim/record/manifest.py): a file's entry is its size and SHA-256; a
file that is not what its entry says is refused. What each reader does with a refused file (the command's one
line): tests/test_run_record.py and tests/test_record_verify.py."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from fedsim.errors import FedsimError
from fedsim.record.manifest import (
    SUMMARY_CHECKSUM,
    GrowingEntry,
    canonical_json,
    check_entry,
    entry_of,
    summary_checksum,
)

WHERE = Path("run/metrics.jsonl")
LINES = b'{"round": 1}\n{"round": 2}\n'  # 26 bytes


def check(data: bytes, entry: dict, tail=None) -> None:  # type: ignore[no-untyped-def]
    check_entry(WHERE, data, entry, "summary.json", "rerun it", tail)


def test_an_entry_is_the_size_and_sha256_of_the_bytes() -> None:
    assert entry_of(LINES) == {"size": len(LINES), "sha256": hashlib.sha256(LINES).hexdigest()}
    assert entry_of(memoryview(LINES)) == entry_of(LINES)
    check(LINES, entry_of(LINES))  # the file as written: accepted


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (LINES[:-1], f"{WHERE}: 25 bytes where the run wrote 26 (its size in summary.json; cut short"),
        (LINES + b"x\n", f"{WHERE}: 28 bytes where the run wrote 26 (its size in summary.json"),
        (LINES.replace(b"2", b"3"), f"{WHERE}: not the file the run wrote (its sha256 in summary.json differs"),
    ],
    ids=["cut-short", "written-to", "edited"],
)
def test_a_file_that_is_not_its_entry_is_refused_naming_it_its_record_and_the_remedy(data: bytes, said: str) -> None:
    with pytest.raises(FedsimError) as err:
        check(data, entry_of(LINES))
    assert str(err.value).startswith(said) and str(err.value).endswith(": rerun it")


def test_bytes_past_the_entry_pass_only_when_the_tail_check_accepts_them() -> None:
    one_line = LINES + b'{"round": 3}\n'
    check(one_line, entry_of(LINES), tail=lambda extra: extra.count(b"\n") == 1)  # a live run's next line
    with pytest.raises(FedsimError, match="28 bytes where the run wrote 26"):
        check(LINES + b"x\n", entry_of(LINES), tail=lambda extra: extra.startswith(b"{"))
    with pytest.raises(FedsimError, match="not the file the run wrote"):  # the tail accepted, the recorded part edited
        check(b"X" + one_line[1:], entry_of(LINES), tail=lambda extra: True)


def test_a_growing_entry_is_the_entry_of_everything_added() -> None:
    growing = GrowingEntry(b'{"round": 1}\n')
    assert growing.entry() == entry_of(b'{"round": 1}\n')
    growing.add(b'{"round": 2}\n')
    assert growing.entry() == entry_of(LINES) and growing.size == len(LINES)
    assert GrowingEntry().entry() == entry_of(b"")


def test_canonical_json_is_one_encoding_of_the_same_fields() -> None:
    assert canonical_json({"b": [1, 2.5], "a": {"y": None, "x": "é"}}) == b'{"a":{"x":"\\u00e9","y":null},"b":[1,2.5]}'
    assert canonical_json(json.loads('{ "a" : 1,\n "b": 2 }')) == canonical_json({"b": 2, "a": 1})
    with pytest.raises(ValueError):
        canonical_json({"acc": math.nan})  # not JSON: never a checksum of it


def test_a_summary_checksum_covers_every_field_but_its_own() -> None:
    summary = {"final_client_mean_acc": 0.5, "time_s": 12.0}
    checksum = summary_checksum(summary)
    assert checksum == hashlib.sha256(canonical_json(summary)).hexdigest()
    assert summary_checksum({**summary, SUMMARY_CHECKSUM: checksum}) == checksum
    assert summary_checksum({**summary, "time_s": 11.0}) != checksum  # wall time is the run's too
