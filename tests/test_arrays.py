"""fedsim's ArrayRecord codec (fedsim/arrays.py) against Flower's own: the same bytes, bit for bit; its aggregation:
tests/test_aggregation.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedsim.arrays import array_view, copy_into, ndarray_to_array, tensor_to_array

ARRAYS = {
    "conv": np.random.default_rng(0).standard_normal((8, 3, 5, 5)).astype(np.float32),
    "fc": np.random.default_rng(1).standard_normal((384, 160)).astype(np.float32),
    "large": np.random.default_rng(3).standard_normal((300, 700)).astype(np.float32),  # several blocks
    "double": np.random.default_rng(2).standard_normal(7),
    "scalar": np.array(0.37, dtype=np.float32),  # a 0-d buffer (ln_goldschmidt's running_var)
    "count": np.arange(3, dtype=np.int64),  # an integer buffer (BN's num_batches_tracked)
}


def flower_bytes(a: np.ndarray) -> bytes:
    return Array(np.asarray(a, order="C")).data  # np.save writes C order


@pytest.mark.parametrize("name", list(ARRAYS))
def test_codec_writes_flowers_bytes_and_reads_them_back(name: str) -> None:
    a = ARRAYS[name]
    ours = ndarray_to_array(a)
    assert ours.data == flower_bytes(a)
    assert (ours.dtype, ours.shape, ours.stype) == (str(a.dtype), a.shape, "numpy.ndarray")
    assert np.array_equal(array_view(ours), a) and array_view(ours).dtype == a.dtype
    assert np.array_equal(array_view(Array(a)), a)  # Flower's own Arrays read the same way


def test_channels_last_tensor_is_written_in_c_order_and_copied_back_in_place() -> None:
    t = torch.randn(16, 8, 5, 5).to(memory_format=torch.channels_last)
    assert not t.numpy().flags.c_contiguous
    array = tensor_to_array(t)
    assert array.data == Array(t.numpy()).data == flower_bytes(t.numpy())
    target = {"w": torch.zeros(16, 8, 5, 5).to(memory_format=torch.channels_last)}
    copy_into(target, ArrayRecord({"w": array}))
    assert torch.equal(target["w"], t)


def test_fortran_ordered_array_keeps_np_saves_bytes() -> None:
    a = np.asfortranarray(ARRAYS["fc"])
    assert ndarray_to_array(a).data == Array(a).data  # np.save writes fortran_order: True
    assert np.array_equal(array_view(ndarray_to_array(a)), a)
