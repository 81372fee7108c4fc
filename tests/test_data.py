"""The datasets across loaders (fedsim/data/): the registry (an unknown name, a summary for ``fedsim list``), class
names refused alike by every loader, the shipped MNIST subset and the real CIFAR-10 archive. Each loader's own
tests: tests/test_npz.py, tests/test_imagefolder.py, tests/test_torchvision_sets.py, tests/test_tinyimagenet.py;
the batch path: tests/test_batches.py; the contract: tests/test_data_base.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.data import ASSETS_DIR, DATASETS, load_dataset
from fedsim.errors import ConfigError, DataError
from tests.data_fixtures import png_bytes, write_dir, write_npz, write_tar

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
CIFAR_Q75 = SHARED / "cifar10_jpg_q75.tar.gz"


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "esc\x1b[31m", "line\u2028sep"])
def test_class_names_with_a_control_character_are_refused(tmp_path: Path, name: str) -> None:
    """A class folder named 'a<newline>b' was accepted and broke partition.csv's header and the plot's labels;
    an npz's classes the same. Refused in one line quoting the name."""
    name = name.encode().decode("unicode_escape")
    files = {f"{split}/{cls}/{i}.png": png_bytes((i, 0, 0)) for split in ("train", "test") for cls in (name, "b")
             for i in range(2)}  # fmt: skip
    for root in (write_dir(tmp_path / "tree", files), write_tar(tmp_path / "tree.tar", files, "w")):
        with pytest.raises(DataError) as err:
            load_dataset("imagefolder", root, cache_dir=tmp_path / "cache")
        assert repr(name) in str(err.value) and "\n" not in str(err.value)  # its wording: tests/test_bad_inputs.py
    write_npz(tmp_path / "c.npz", classes=np.array([name, "b", "c"]))
    with pytest.raises(DataError) as err:
        load_dataset("npz", tmp_path / "c.npz")
    assert repr(name) in str(err.value) and "\n" not in str(err.value)


def test_unknown_dataset_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"^data\.dataset\.name: .*'no_such_set'.*imagefolder"):
        load_dataset("no_such_set", ".")


def test_every_loader_has_a_summary_for_fedsim_list() -> None:
    names = {e.name for e in DATASETS}
    assert {"mnist", "fashion_mnist", "cifar10", "cifar100", "npz", "imagefolder"} <= names
    assert all(e.summary for e in DATASETS)


# ----------------------------------------------------------------- shipped data


def test_shipped_mnist_small_is_balanced_and_small() -> None:
    path = ASSETS_DIR / "mnist_small.npz"
    assert path.stat().st_size <= 5 * 1024 * 1024
    ds = load_dataset("npz", path)
    assert ds.x_train.shape == (5000, 1, 28, 28) and ds.x_test.shape == (1000, 1, 28, 28)
    assert torch.bincount(ds.y_train).tolist() == [500] * 10
    assert torch.bincount(ds.y_test).tolist() == [100] * 10
    assert ds.classes == [str(i) for i in range(10)]
    assert ds.x_train.float().mean() > 10  # real digits, not zeros


@pytest.mark.slow
@pytest.mark.long
def test_real_cifar10_q75_archive(cifar_cache: Path) -> None:
    if not CIFAR_Q75.is_file():
        pytest.skip(f"{CIFAR_Q75} is absent (see ../shared/datasets/README.md)")
    ds = load_dataset("imagefolder", CIFAR_Q75, cache_dir=cifar_cache)
    names = "airplane automobile bird cat deer dog frog horse ship truck".split()
    assert ds.classes == names
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.x_test.shape == (10000, 3, 32, 32)
    assert torch.bincount(ds.y_train).tolist() == [5000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    mean = ds.x_train.double().mean((0, 2, 3)) / 255
    assert torch.allclose(mean, torch.tensor([0.4913, 0.4821, 0.4465], dtype=torch.float64), atol=2e-3)
