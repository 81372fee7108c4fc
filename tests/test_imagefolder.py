"""The ``imagefolder`` loader (fedsim/data/imagefolder.py): train/<class>/* and test/<class>/* from a directory, a tar
or a tar.gz (one wrapping folder allowed), labels in sorted class order, pixels as Pillow decodes them, the decode
cache (hit, changed source, FEDSIM_CACHE), and mixed sizes, a missing split or path named. Damaged archives and the
cache's key: tests/test_data_integrity.py."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.data import ArrayDataset, load_dataset
from fedsim.errors import DataError
from tests.data_fixtures import CLASSES, pixel, png_bytes, tree_files, write_dir, write_tar


def check_tree(ds: ArrayDataset) -> None:
    assert ds.classes == CLASSES
    assert ds.x_train.shape == (9, 3, 4, 5) and ds.x_test.shape == (6, 3, 4, 5)  # 5 wide, 4 high
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.is_contiguous()
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and ds.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
        for j, label in enumerate(y.tolist()):
            i = j % (3 if split == "train" else 2)
            assert x[j, :, 0, 0].tolist() == [255, 0, 0]
            assert (x[j, :, 1:, 1:] == torch.tensor(pixel(split, label, i)).view(3, 1, 1)).all()


def test_imagefolder_from_tar_gz_with_wrapping_directory(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files("tiny/"))
    ds = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    check_tree(ds)
    assert ds.name == "tiny"


def test_imagefolder_from_plain_tar(tmp_path: Path) -> None:
    check_tree(
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar", tree_files(), "w"), cache_dir=tmp_path)
    )


def test_imagefolder_from_directory(tmp_path: Path) -> None:
    root = write_dir(tmp_path / "tree", tree_files())
    check_tree(load_dataset("imagefolder", root, cache_dir=tmp_path / "cache"))


def test_imagefolder_cache_hit_skips_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files())
    first = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    assert not list((tmp_path / "cache").glob("*.tmp"))

    def no_tar(*args: object, **kwargs: object) -> None:
        raise AssertionError("the archive was read despite a cache")

    monkeypatch.setattr(tarfile, "open", no_tar)
    second = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, field), getattr(second, field))
    assert second.classes == first.classes


def test_imagefolder_changed_archive_is_decoded_again(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files())
    load_dataset("imagefolder", archive, cache_dir=tmp_path)
    files = tree_files()
    files["train/cat/99.png"] = png_bytes((1, 2, 3))
    write_tar(archive, files)
    os.utime(archive, ns=(0, 10**18))  # a new mtime even on a coarse-clock filesystem
    assert len(load_dataset("imagefolder", archive, cache_dir=tmp_path).y_train) == 10


def test_imagefolder_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "envcache"))
    load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", tree_files()))
    assert len(list((tmp_path / "envcache").glob("imagefolder-t-*.npz"))) == 1


def test_imagefolder_mixed_sizes_name_an_offender(tmp_path: Path) -> None:
    files = tree_files()
    files["test/dog/99.png"] = png_bytes((0, 0, 0), size=(6, 4))
    with pytest.raises(DataError, match=r"test/dog/99\.png.*6x4"):
        load_dataset("imagefolder", write_tar(tmp_path / "bad.tar.gz", files), cache_dir=tmp_path)


def test_imagefolder_without_test_split_explains_the_layout(tmp_path: Path) -> None:
    files = {k: v for k, v in tree_files().items() if not k.startswith("test/")}
    with pytest.raises(DataError, match=r"t\.tar\.gz.*\btest\b"):  # the archive and the split; the wording: the corpus
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", files), cache_dir=tmp_path)


def test_imagefolder_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "gone.tar.gz")):
        load_dataset("imagefolder", tmp_path / "gone.tar.gz", cache_dir=tmp_path)


def test_imagefolder_decodes_jpeg_like_pillow(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    files, expected = {}, {}
    for split in ("train", "test"):
        for cls in ("a", "b"):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, "JPEG", quality=75)
            files[f"{split}/{cls}/0.jpg"] = buf.getvalue()
            expected[split, cls] = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    ds = load_dataset("imagefolder", write_tar(tmp_path / "j.tar.gz", files), cache_dir=tmp_path)
    for j, cls in enumerate(("a", "b")):
        assert np.array_equal(ds.x_train[j].permute(1, 2, 0).numpy(), expected["train", cls])
