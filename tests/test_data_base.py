"""The dataset contract (fedsim/data/base.py): ArrayDataset's checks, the default cache directory (FEDSIM_CACHE), the
checks a run makes of a dataset's classes (``check_classes``) and of a plugin loader's result (``read_dataset``), and
labels read as an int64 vector (``labels_int64``). Images' layouts (``nchw_uint8``): tests/test_npz.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.data import ArrayDataset, DatasetLoader, DataSource, labels_int64, load_dataset, read_dataset
from fedsim.data.base import check_classes
from fedsim.errors import ConfigError, DataError
from tests.data_fixtures import tree_files, write_tar


def test_array_dataset_rejects_labels_out_of_range() -> None:
    x = torch.zeros(2, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(DataError, match=r"y_train.*\[0, 2\]"):  # the split and its labels' range
        ArrayDataset(x, torch.tensor([0, 2]), x, torch.tensor([0, 1]), ["a", "b"], "bad")


@pytest.mark.parametrize("cache", ["a\nb", "a\tb", "a\udcffb"])
def test_a_fedsim_cache_that_data_cache_dir_would_refuse_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    # a mapping, not the process's environment: a lone surrogate cannot be put into that one
    monkeypatch.setattr(os, "environ", {**os.environ, "FEDSIM_CACHE": str(tmp_path / cache)})
    with pytest.raises(ConfigError, match="^FEDSIM_CACHE "):
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", tree_files()))
    assert not (tmp_path / cache).exists()  # nothing made under the name


def images(n: int) -> torch.Tensor:
    return torch.zeros(n, 1, 2, 2, dtype=torch.uint8)


def test_check_classes_refuses_a_class_without_test_images_counting_what_is_covered() -> None:
    ds = ArrayDataset(images(4), torch.tensor([0, 1, 2, 3]), images(3), torch.tensor([0, 0, 3]), list("abcd"), "tiny")
    with pytest.raises(DataError) as err:
        check_classes(ds)
    assert str(err.value) == (
        "dataset 'tiny': 2 of 4 classes without test images ('b', 'c'); its 3 test images cover 2; every class needs "
        "training and test images (labels are class indices 0..C-1)"
    )


def test_check_classes_refuses_one_class_and_an_empty_split() -> None:
    one = ArrayDataset(images(2), torch.tensor([0, 0]), images(1), torch.tensor([0]), ["only"], "one")
    with pytest.raises(DataError) as err:
        check_classes(one)
    assert str(err.value) == (
        "dataset 'one': 2 training and 1 test images of 1 class(es) ('only'); a run needs 2 to 100,000 classes"
    )
    no_test = ArrayDataset(images(2), torch.tensor([0, 1]), images(0), torch.tensor([], dtype=torch.int64), ["a", "b"],
                           "no_test")  # fmt: skip
    with pytest.raises(DataError, match=r"^dataset 'no_test': 2 training and 0 test images; a run needs both$"):
        check_classes(no_test)


def test_labels_int64_flattens_a_label_column_and_refuses_what_is_no_label_vector() -> None:
    assert labels_int64(np.array([[2], [0], [1]], dtype=np.uint8), 3, "y").tolist() == [2, 0, 1]
    assert labels_int64([2, 0, 1], 3, "y").dtype == torch.int64
    for bad, message in [
        (np.array([0.0, 1.0]), "y: labels must be 2 integers, got torch.float64 of shape (2,)"),
        (np.array([0, 1, 2]), "y: labels must be 2 integers, got torch.int64 of shape (3,)"),
        (np.array([[0, 1], [1, 0]]), "y: labels must be 2 integers, got torch.int64 of shape (2, 2)"),
        (np.array([0, 100_000]), "y: 1 of 2 labels are 100,000 or more (the largest 100,000); labels are class "
                                 "indices 0..C-1, at most 100,000 classes"),
    ]:  # fmt: skip
        with pytest.raises(DataError) as err:
            labels_int64(bad, 2, "y")
        assert str(err.value) == message


class Failing(DatasetLoader):
    """A plugin loader with a bug."""

    def load(self, source: DataSource) -> ArrayDataset:
        raise KeyError("x_train")


class NotADataset(DatasetLoader):
    """A plugin loader returning what is no ArrayDataset."""

    def load(self, source: DataSource) -> ArrayDataset:
        return {"x_train": None}  # type: ignore[return-value]


def test_read_dataset_names_the_dataset_and_root_of_a_plugins_failure(tmp_path: Path) -> None:
    source = DataSource(tmp_path / "data", False, tmp_path / "cache")
    with pytest.raises(DataError) as err:
        read_dataset(Failing(DatasetLoader.Params()), source, "mine")
    assert str(err.value) == f"dataset 'mine' at {tmp_path / 'data'}: KeyError: 'x_train'"
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(DataError) as err:
        read_dataset(NotADataset(DatasetLoader.Params()), source, "mine")
    assert str(err.value) == "dataset loader 'mine' returned dict, not an ArrayDataset"
