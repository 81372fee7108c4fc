"""A client node's state on disk (fedsim/client/state.py): written as Flower's protobuf, named by its round, the
files a checkpoint needs kept, read back newest-first up to a round, each answered with its SHA-256. What a resume
does with those answers: tests/test_client_states.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.arrays import ndarray_to_array
from fedsim.client.state import decode, encode, load_client_state, save_client_state


def state(value: float) -> RecordDict:
    return RecordDict(
        {
            "c_i": ArrayRecord({"w": ndarray_to_array(np.full((2, 3), value, np.float32))}),
            "meta": ConfigRecord({"round": int(value)}),
        }
    )


def saved(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_state_round_trips_byte_for_byte() -> None:
    again = decode(encode(state(1.5)))
    assert encode(again) == encode(state(1.5))
    assert np.array_equal(np.frombuffer(again["c_i"]["w"].data[-24:], np.float32), np.full(6, 1.5, np.float32))


def test_saving_keeps_the_round_written_and_the_one_the_checkpoint_needs(tmp_path: Path) -> None:
    directory = tmp_path / "client_state" / "partition-0"
    sha = save_client_state(state(2), directory, 2, keep=0)
    assert sha == hashlib.sha256((directory / "round-2.bin").read_bytes()).hexdigest()
    save_client_state(state(4), directory, 4, keep=2)  # a checkpoint at round 2 exists: its file stays
    assert saved(directory) == ["round-2.bin", "round-4.bin"]
    save_client_state(state(6), directory, 6, keep=4)  # the checkpoint moved to round 4: round 2 goes
    assert saved(directory) == ["round-4.bin", "round-6.bin"]
    save_client_state(state(7), directory, 7, keep=5)  # keep: the newest file at or before the checkpoint's round
    assert saved(directory) == ["round-4.bin", "round-7.bin"]


def test_an_empty_state_is_not_written(tmp_path: Path) -> None:
    assert save_client_state(RecordDict(), tmp_path / "p", 3, keep=0) == ""
    assert not (tmp_path / "p").exists()


def test_loading_reads_the_newest_file_up_to_the_round_with_its_sha256(tmp_path: Path) -> None:
    directory = tmp_path / "partition-1"
    save_client_state(state(2), directory, 2, keep=0)
    save_client_state(state(5), directory, 5, keep=2)
    loaded = load_client_state(directory, upto=4)
    assert (loaded.round, loaded.sha256) == (2, hashlib.sha256(encode(state(2))).hexdigest())
    assert encode(loaded.state) == encode(state(2))
    assert load_client_state(directory, upto=9).round == 5
    nothing = load_client_state(directory, upto=1)  # the node had not trained by then
    assert (nothing.round, nothing.sha256, len(nothing.state)) == (0, "", 0)
    assert load_client_state(tmp_path / "never", upto=9).round == 0


def test_a_file_changed_since_written_loads_empty_with_its_own_sha256(tmp_path: Path) -> None:
    directory = tmp_path / "partition-2"
    written = save_client_state(state(3), directory, 3, keep=0)
    (directory / "round-3.bin").write_bytes(b"\xff\x00 not a protobuf")
    loaded = load_client_state(directory, upto=3)
    assert len(loaded.state) == 0 and loaded.sha256 != written  # the server, comparing, names the file
    assert loaded.sha256 == hashlib.sha256(b"\xff\x00 not a protobuf").hexdigest()
