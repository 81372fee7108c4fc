"""The ``npz`` loader (fedsim/data/npz.py): a Keras-layout ``.npz`` read as uint8 N x C x H x W images and int64
labels, channels last in every layout (channels first refused, naming the array), big-endian arrays read as their
values, and missing files, keys or float images named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.data import load_dataset
from fedsim.errors import DataError
from tests.data_fixtures import write_npz


def test_npz_grayscale_round_trip(tmp_path: Path) -> None:
    a = write_npz(tmp_path / "tiny.npz")
    ds = load_dataset("npz", tmp_path / "tiny.npz")
    assert ds.x_train.shape == (6, 1, 5, 4) and ds.x_test.shape == (3, 1, 5, 4)
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.is_contiguous()
    assert ds.y_train.dtype == torch.int64
    assert np.array_equal(ds.x_train[:, 0].numpy(), a["x_train"])
    assert ds.y_train.tolist() == [0, 1, 2, 0, 1, 2] and ds.y_test.tolist() == [2, 1, 0]
    assert ds.classes == ["0", "1", "2"] and ds.num_classes == 3 and ds.in_shape == (1, 5, 4)
    assert ds.name == "tiny"


def test_npz_channels_last_with_classes_and_column_labels(tmp_path: Path) -> None:
    x = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)  # N x H x W x C
    write_npz(
        tmp_path / "rgb.npz",
        x_train=x,
        x_test=x,
        y_train=np.array([[1], [0]]),
        y_test=np.array([[0], [1]]),
        classes=np.array(["cat", "dog"]),
    )
    ds = load_dataset("npz", str(tmp_path / "rgb.npz"))
    assert ds.x_train.shape == (2, 3, 3, 4) and ds.x_train.is_contiguous()
    assert np.array_equal(ds.x_train.numpy(), x.transpose(0, 3, 1, 2))
    assert ds.y_train.tolist() == [1, 0] and ds.classes == ["cat", "dog"]


def test_npz_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "nope.npz")):
        load_dataset("npz", tmp_path / "nope.npz")


def test_npz_missing_keys_are_named(tmp_path: Path) -> None:
    np.savez(tmp_path / "half.npz", x_train=np.zeros((1, 2, 2), np.uint8), y_train=np.zeros(1))
    with pytest.raises(DataError, match=r"\['x_test', 'y_test'\]") as err:
        load_dataset("npz", tmp_path / "half.npz")
    assert str(tmp_path / "half.npz") in str(err.value)


def test_npz_rejects_float_images(tmp_path: Path) -> None:
    write_npz(tmp_path / "f.npz", x_train=np.zeros((6, 5, 4), np.float32))
    with pytest.raises(DataError, match="x_train"):
        load_dataset("npz", tmp_path / "f.npz")


@pytest.mark.parametrize(
    ("key", "shape"),
    [("x_train", (6, 3, 5, 5)), ("x_train", (6, 1, 28, 28)), ("x_test", (3, 4, 5, 5)), ("x_test", (3, 3, 32, 32))],
)
def test_npz_channels_first_is_refused_naming_the_array_and_the_layout(
    tmp_path: Path, key: str, shape: tuple[int, ...]
) -> None:
    """(N, 3, 32, 32) read as 3-pixel-high images of 32 channels: an mlp trained on it in silence, a cnn said the
    images were too small. The array, its shape and the layout fedsim reads are named."""
    other = {"x_train": (6, 5, 5, 3), "x_test": (3, 5, 5, 3)}
    other[key] = shape
    write_npz(tmp_path / "nchw.npz", **{k: np.zeros(v, np.uint8) for k, v in other.items()})
    with pytest.raises(DataError) as err:
        load_dataset("npz", tmp_path / "nchw.npz")
    message = str(err.value)  # its wording: tests/test_bad_inputs.py
    assert f"{key}: " in message and str(shape) in message
    assert str((shape[0], *shape[2:], shape[1])) in message  # the shape to store them as


@pytest.mark.parametrize("shape", [(5, 4), (5, 4, 1), (3, 3, 3), (5, 4, 4), (5, 5, 2), (1, 3, 3), (1, 28, 1)])
def test_npz_every_channels_last_layout_still_reads(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Grayscale (N, H, W), and (N, H, W, C) whatever H is when C is a channel count (or H is none)."""
    write_npz(tmp_path / "nhwc.npz", x_train=np.zeros((6, *shape), np.uint8), x_test=np.zeros((3, *shape), np.uint8))
    ds = load_dataset("npz", tmp_path / "nhwc.npz")
    assert ds.in_shape == ((1, *shape) if len(shape) == 2 else (shape[2], shape[0], shape[1]))


def test_npz_big_endian_arrays_read_as_their_values(tmp_path: Path) -> None:
    """Labels stored big-endian ('>i8', as another machine may write them) were refused with torch's message,
    which named no array; they are the same integers in native byte order."""
    a = write_npz(tmp_path / "be.npz", y_train=np.array([0, 1, 2, 0, 1, 2], ">i8"), y_test=np.array([2, 1, 0], ">u2"))
    ds = load_dataset("npz", tmp_path / "be.npz")
    assert ds.y_train.tolist() == a["y_train"].tolist() and ds.y_test.tolist() == [2, 1, 0]
    write_npz(tmp_path / "bef.npz", x_train=np.zeros((6, 5, 4), ">f4"))
    with pytest.raises(DataError, match="x_train: "):
        load_dataset("npz", tmp_path / "bef.npz")
