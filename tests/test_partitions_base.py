"""The partitioner contract (partitions/base.py): the input checks every partitioner's ``split`` makes first (named
with what is wrong), and ``sorted_int64``. Class counts (tested with the registry): tests/test_partitions.py."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.errors import DataError
from fedsim.partitions import check_split_inputs, sorted_int64
from tests.test_partitions import split


def test_labels_outside_num_classes_raise() -> None:
    with pytest.raises(DataError, match=r"\btrain labels\b.*0\.\.9"):
        split("iid", 2, seed=0, train=np.array([0, 3, 10]))


@pytest.mark.parametrize(
    ("train", "test", "num_clients", "num_classes", "message"),
    [
        ([0, 1], [0], 2, 0, "p: num_classes must be >= 1, got 0"),
        ([0, 1], [0], 3, 2, "p: num_clients must be in 1..2 (the number of train samples), got 3"),
        ([0.0, 1.0], [0], 1, 2, "p: train labels must be a 1-D integer array, got float64 (2,)"),
        ([0, 1], [[0], [1]], 1, 2, "p: test labels must be a 1-D integer array, got int64 (2, 1)"),
        ([0, 1], [-1], 1, 2, "p: test labels must lie in 0..1, found -1..-1"),
    ],
)
def test_check_split_inputs_names_the_partitioner_and_what_is_wrong(
    train: list[object], test: list[object], num_clients: int, num_classes: int, message: str
) -> None:
    with pytest.raises(DataError) as err:
        check_split_inputs("p", np.array(train), np.array(test), num_clients, num_classes)
    assert str(err.value) == message


def test_sorted_int64_sorts_each_part_as_int64() -> None:
    parts = sorted_int64([[3, 1, 2], np.array([9, 4], dtype=np.int32), []])
    assert [p.tolist() for p in parts] == [[1, 2, 3], [4, 9], []]
    assert all(p.dtype == np.int64 for p in parts)
