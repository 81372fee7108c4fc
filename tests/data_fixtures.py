"""Small datasets on disk for the data loaders' tests: a Keras-layout ``.npz`` (``write_npz``) and an ImageFolder
tree of PNGs (``tree_files``: classes written out of sorted order, each image's pixels saying where it belongs) as a
directory (``write_dir``) or a tar (``write_tar``); an npz's training labels permuted (``relabelled``: other data
for a run's fingerprint). Used by tests/test_npz.py, tests/test_imagefolder.py, tests/test_data_base.py,
tests/test_data.py, tests/test_data_integrity.py, tests/test_local.py and tests/test_bad_inputs.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def write_npz(path: Path, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (6, 5, 4), dtype=np.uint8),
        "y_train": np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8),  # Keras MNIST labels are uint8
        "x_test": rng.integers(0, 256, (3, 5, 4), dtype=np.uint8),
        "y_test": np.array([2, 1, 0], dtype=np.int64),
    }
    arrays.update(overrides)
    np.savez(path, **arrays)
    return arrays


CLASSES = ["bird", "cat", "dog"]  # created below out of sorted order: labels must follow sorted names


def pixel(split: str, label: int, i: int) -> tuple[int, int, int]:
    return (10 * label + i, 100 + (split == "test"), 200 + i)


def png_bytes(rgb: tuple[int, int, int], size: tuple[int, int] = (5, 4)) -> bytes:
    buf = io.BytesIO()
    img = Image.new("RGB", size, rgb)
    img.putpixel((0, 0), (255, 0, 0))  # not flat: catches transposed H/W
    img.save(buf, format="PNG")
    return buf.getvalue()


def tree_files(prefix: str = "") -> dict[str, bytes]:
    files = {}
    for split, n in (("train", 3), ("test", 2)):
        for label in (2, 0, 1):
            for i in range(n):
                files[f"{prefix}{split}/{CLASSES[label]}/{i:02d}.png"] = png_bytes(pixel(split, label, i))
    files[f"{prefix}README.txt"] = b"not an image"
    return files


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def relabelled(source: Path, target: Path) -> None:
    """``source``'s npz with its training labels permuted: the same images, other data."""
    with np.load(source) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["y_train"] = np.random.default_rng(0).permutation(arrays["y_train"])
    np.savez(target, **arrays)
