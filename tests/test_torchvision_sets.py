"""The torchvision loaders (fedsim/data/torchvision_sets.py): MNIST read from its IDX files, and missing files named
with where to put them and how to get them (no network is used)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from fedsim.data import load_dataset
from fedsim.errors import DataError


def test_torchvision_missing_files_say_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "data.download: true" in msg and "npz" in msg and "imagefolder" in msg


def test_torchvision_mnist_from_idx_files(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = {"train": np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256, "t10k": np.full((2, 28, 28), 7)}
    labels = {"train": [3, 1, 4], "t10k": [1, 5]}
    for split in ("train", "t10k"):
        x = images[split].astype(np.uint8)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(
            struct.pack(">iiii", 2051, len(x), 28, 28) + x.tobytes()
        )
        y = bytes(labels[split])
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, len(y)) + y)
    ds = load_dataset("mnist", tmp_path)
    assert ds.x_train.shape == (3, 1, 28, 28) and ds.x_test.shape == (2, 1, 28, 28)
    assert np.array_equal(ds.x_train[:, 0].numpy(), images["train"].astype(np.uint8))
    assert ds.y_train.tolist() == [3, 1, 4] and ds.y_test.tolist() == [1, 5] and ds.num_classes == 10
