"""The ``npz`` loader: one ``.npz`` file in the Keras layout (as ``keras.datasets`` ship MNIST)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from fedsim.data.base import DATASETS, ArrayDataset, DatasetLoader, DataSource, labels_int64, nchw_uint8
from fedsim.errors import DataError

KEYS = ("x_train", "y_train", "x_test", "y_test")


@DATASETS.register("npz")
class Npz(DatasetLoader):
    """Keras-layout .npz: uint8 x_train, x_test (N, H, W) or (N, H, W, C); int y_train, y_test; classes optional.

    Images are channels last: channels first, such as (N, 3, 32, 32), is refused. root is the file."""

    def load(self, source: DataSource) -> ArrayDataset:
        return load_npz(source.root)


def _check_sizes(root: Path) -> None:
    """Every member's header against the bytes it holds: a header may claim terabytes (np.load would try)."""
    if not zipfile.is_zipfile(root):
        raise DataError(f"npz dataset {root.resolve()}: not a .npz (zip) archive; a .npy holds one array, not four")
    try:
        with zipfile.ZipFile(root) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    read_header = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
                    if read_header is None:  # a newer format: np.load checks it
                        continue
                    shape, _, dtype = read_header(member)
                    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if claimed > info.file_size:
                        raise DataError(
                            f"npz dataset {root.resolve()}: member {info.filename} claims {shape} {dtype} "
                            f"({claimed:,} bytes) but holds {info.file_size:,}: a damaged or forged file"
                        )
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise DataError(f"npz dataset {root.resolve()}: not a readable .npz archive ({err})") from err


def load_npz(root: Path) -> ArrayDataset:
    """The arrays of a Keras-layout ``.npz`` file, checked."""
    if not root.is_file():
        raise DataError(f"npz dataset: no file at {root.resolve()}")
    _check_sizes(root)
    try:
        with np.load(root, allow_pickle=False) as npz:
            missing = [k for k in KEYS if k not in npz.files]
            if missing:
                raise DataError(
                    f"npz dataset {root.resolve()}: missing keys {missing} (has {sorted(npz.files)}; "
                    f"needs {list(KEYS)})"
                )
            arrays = {k: npz[k] for k in KEYS}
            stored_classes = npz["classes"] if "classes" in npz.files else None
    except (zipfile.BadZipFile, ValueError, OSError, AttributeError) as err:
        # AttributeError: np.load gave a bare array (a .npy), which has no .files
        raise DataError(f"npz dataset {root.resolve()}: not a readable .npz archive ({err})") from err

    what = f"npz dataset {root.resolve()}"
    x_train = nchw_uint8(arrays["x_train"], f"{what} x_train")
    x_test = nchw_uint8(arrays["x_test"], f"{what} x_test")
    y_train = labels_int64(arrays["y_train"], len(x_train), f"{what} y_train")
    y_test = labels_int64(arrays["y_test"], len(x_test), f"{what} y_test")
    if stored_classes is not None:
        classes = [str(c) for c in stored_classes.tolist()]
    else:
        top = max(int(y.max()) if len(y) else -1 for y in (y_train, y_test))
        classes = [str(i) for i in range(top + 1)]
    return ArrayDataset(x_train, y_train, x_test, y_test, classes, name=root.stem)
