"""The data's fingerprint (fedsim/data/fingerprint.py): the SHA-256 of a dataset's decoded arrays, class names and
domains, byte for byte as written out here, its name left out; and the refusals of other data than a run began with
or than the server reads. Resume and a node with other data, end to end: tests/test_data_integrity.py."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import sys
from pathlib import Path

import pytest
import torch

import fedsim
from fedsim.data import ArrayDataset
from fedsim.data.fingerprint import check_node_data, check_same_data, fingerprint
from fedsim.errors import DataError

FEDSIM_DIR = Path(fedsim.__file__).parent


def tiny(name: str = "tiny") -> ArrayDataset:
    """Two 1x1 gray training images (7 and 9) labelled a and b, one test image (200) labelled b."""
    x_train = torch.tensor([7, 9], dtype=torch.uint8).view(2, 1, 1, 1)
    x_test = torch.tensor([200], dtype=torch.uint8).view(1, 1, 1, 1)
    return ArrayDataset(x_train, torch.tensor([0, 1]), x_test, torch.tensor([1]), ["a", "b"], name)


def test_fingerprint_is_the_sha256_of_the_datasets_fields_in_their_canonical_encoding() -> None:
    """Recorded in every checkpoint and summary, so it may never change for the same data: pinned here by
    writing out the encoding of fedsim/digest.py by hand (fields sorted by name, each a typed, sized record)."""

    def text(s: str) -> bytes:
        return f"str:{len(s.encode())}:".encode() + s.encode()

    def tensor(dtype: str, shape: tuple[int, ...], raw: bytes) -> bytes:
        return f"tensor:torch.{dtype}:{shape}:".encode() + raw

    int64 = "<" if sys.byteorder == "little" else ">"  # the tensors' own bytes: native order
    fields = {
        "classes": b"list:2:" + text("a") + text("b"),
        "d_test": b"NoneType:None;",
        "d_train": b"NoneType:None;",
        "domains": b"NoneType:None;",
        "x_test": tensor("uint8", (1, 1, 1, 1), bytes([200])),
        "x_train": tensor("uint8", (2, 1, 1, 1), bytes([7, 9])),
        "y_test": tensor("int64", (1,), struct.pack(f"{int64}q", 1)),
        "y_train": tensor("int64", (2,), struct.pack(f"{int64}2q", 0, 1)),
    }
    encoded = b"dict:8:" + b"".join(text(key) + value for key, value in fields.items())
    assert fingerprint(tiny()) == hashlib.sha256(encoded).hexdigest()


def test_the_name_is_left_out_and_every_other_field_counts() -> None:
    base = fingerprint(tiny())
    assert fingerprint(tiny(name="renamed")) == base  # the same data under another file name
    one = tiny()
    others = [
        dataclasses.replace(one, y_train=torch.tensor([1, 0])),  # relabelled
        dataclasses.replace(one, x_test=torch.tensor([201], dtype=torch.uint8).view(1, 1, 1, 1)),  # one pixel
        dataclasses.replace(one, classes=["a", "c"]),  # a class renamed
        dataclasses.replace(
            one, domains=["d"], d_train=torch.zeros(2, dtype=torch.int64), d_test=torch.zeros(1, dtype=torch.int64)
        ),  # the same images, recorded as one domain
    ]
    prints = [fingerprint(d) for d in others]
    assert len({base, *prints}) == 5


def test_check_same_data_takes_the_recorded_fingerprint_and_refuses_another() -> None:
    now, recorded = "0123456789abcdef" + "0" * 48, "fedcba9876543210" + "1" * 48
    check_same_data(now, now, Path("run/checkpoint.pt"), "data/x.npz")  # the same data: no error
    with pytest.raises(DataError) as err:
        check_same_data(recorded, now, Path("run/checkpoint.pt"), "fedsim:assets/mnist_small.npz")
    assert str(err.value) == (
        f"data.root {FEDSIM_DIR / 'assets' / 'mnist_small.npz'} holds other data than the run trained on (data_sha256 "
        "0123456789abcdef..., run/checkpoint.pt recorded fedcba9876543210...): refused; give the run the data it "
        "began with"
    )


@pytest.mark.parametrize("recorded", [None, 12, b"0123"])
def test_check_same_data_refuses_a_record_without_a_fingerprint(recorded: object) -> None:
    with pytest.raises(DataError) as err:
        check_same_data(recorded, "0" * 64, Path("run/summary.json"), "data/x.npz")
    assert str(err.value).startswith("run/summary.json: records no fingerprint (data_sha256) of the data the run")
    assert str(err.value).endswith("so it cannot show that data.root holds the same data: refused")


def test_check_node_data_names_the_node_its_partition_and_both_fingerprints() -> None:
    server, node = "a" * 64, "b" * 64
    check_node_data(3, 5, server, server, "data/x.npz")  # the server's data: no error
    with pytest.raises(DataError) as err:
        check_node_data(3, 5, node, server, "data/x.npz")
    assert str(err.value) == (
        "node 3 (partition 5): data.root data/x.npz holds other data than the server's (data_sha256 "
        "bbbbbbbbbbbbbbbb..., the server's aaaaaaaaaaaaaaaa...): refused; give every node the data the server reads "
        "(a SuperNode trains on what its host holds there)"
    )
