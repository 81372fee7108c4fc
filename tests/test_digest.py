"""A SHA-256 of a value (fedsim/digest.py): the same for the same tensors and fields however they are stored, and
different when any byte, dtype, shape, key or type differs."""

from __future__ import annotations

import pytest
import torch

from fedsim.digest import digest

VALUE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "round": 3, "name": "a", "items": [None, 1.5]}


def test_the_same_value_however_it_is_stored_has_one_digest() -> None:
    transposed = torch.tensor([[0.0, 3], [1, 4], [2, 5]]).T  # the same values, column-major in memory
    same = {"items": (None, 1.5), "name": "a", "round": 3, "w": transposed}
    assert not transposed.is_contiguous()
    assert digest(same) == digest(VALUE)  # key order, a tuple for a list, another layout of the same tensor
    strided = torch.arange(12, dtype=torch.float32).reshape(2, 6)[:, ::2]  # a view with gaps
    assert digest(strided) == digest(strided.contiguous())
    assert len(digest(VALUE)) == 64 and int(digest(VALUE), 16) >= 0


@pytest.mark.parametrize(
    "other",
    [
        {**VALUE, "w": VALUE["w"].double()},  # dtype
        {**VALUE, "w": VALUE["w"].reshape(3, 2)},  # shape, same bytes
        {**VALUE, "w": VALUE["w"] + torch.tensor([[0, 0, 0], [0, 0, 1e-6]])},  # one element
        {**VALUE, "round": 3.0},  # int and float
        {**VALUE, "round": "3"},  # a number and its text
        {**VALUE, "items": [None, 1.5, None]},  # length
        {**VALUE, "items": [1.5, None]},  # order of a list
        {**{k: v for k, v in VALUE.items() if k != "name"}, "nam": "ea"},  # where a key ends and a value starts
        {**VALUE, "flag": False},
    ],
)
def test_any_difference_changes_the_digest(other: dict) -> None:
    assert digest(other) != digest(VALUE)


def test_a_value_without_a_canonical_encoding_is_refused() -> None:
    with pytest.raises(TypeError, match="no canonical encoding for set"):
        digest({"a": {1, 2}})
