"""The ``tinyimagenet`` loader (fedsim/data/tinyimagenet.py) on a Tiny ImageNet in miniature, laid out as its authors
ship it: train/<wnid>/images/* the train split, val/images/* labelled by val/val_annotations.txt the test split, the
unlabelled test/ left out, classes the wnids in sorted order; from the zip (inside tiny-imagenet-200/) or the folder,
the same arrays; and what is missing named."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from fedsim.data.tinyimagenet import URL, load_tinyimagenet
from fedsim.errors import DataError
from tests.data_fixtures import write_dir

WNIDS = ["n03", "n01", "n02"]  # written out of sorted order: labels follow the sorted wnids
VAL = {"val_0.JPEG": "n02", "val_1.JPEG": "n01", "val_2.JPEG": "n03", "val_3.JPEG": "n01"}


def image(value: int, mode: str = "RGB") -> bytes:
    """A 4x4 image of one value. PNG bytes under the official .JPEG names: lossless, so pixels compare exactly
    (the loader reads a file by its content, not its name)."""
    buf = io.BytesIO()
    Image.new(mode, (4, 4), value if mode == "L" else (value, value + 1, value + 2)).save(buf, format="PNG")
    return buf.getvalue()


def tiny_files(val: dict[str, str] = VAL) -> dict[str, bytes]:
    """Two train images a class (value 10 * class rank + i), the val images (value 100 + i), the annotations (one
    line per val image: name, wnid, a box), the unlabelled test/ and the two word lists."""
    files = {}
    for wnid in WNIDS:
        rank = sorted(WNIDS).index(wnid)
        for i in range(2):
            files[f"train/{wnid}/images/{wnid}_{i}.JPEG"] = image(10 * rank + i)
        files[f"train/{wnid}/{wnid}_boxes.txt"] = b"ignored"
    for i, name in enumerate(VAL):
        files[f"val/images/{name}"] = image(100 + i, "L" if i == 3 else "RGB")  # one grayscale, as the set has
    files["val/val_annotations.txt"] = "".join(f"{name}\t{wnid}\t0\t0\t3\t3\n" for name, wnid in val.items()).encode()
    files["test/images/test_0.JPEG"] = image(250)
    files["wnids.txt"] = "\n".join(WNIDS).encode()
    files["words.txt"] = b"n01\tone\nn02\ttwo\nn03\tthree\n"
    return files


def as_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(f"tiny-imagenet-200/{name}", data)
    return path


def test_train_from_the_class_folders_test_from_the_annotated_val_images(tmp_path: Path) -> None:
    ds = load_tinyimagenet(as_zip(tmp_path / "tiny-imagenet-200.zip", tiny_files()), tmp_path / "cache")
    assert ds.classes == ["n01", "n02", "n03"] and ds.name == "tinyimagenet"
    assert ds.x_train.shape == (6, 3, 4, 4) and ds.x_test.shape == (4, 3, 4, 4)
    assert ds.y_train.tolist() == [0, 0, 1, 1, 2, 2]
    assert [int(x[0, 0, 0]) for x in ds.x_train] == [0, 1, 10, 11, 20, 21]  # class rank 0..2, image 0 and 1
    assert ds.x_train[3, :, 2, 1].tolist() == [11, 12, 13]  # RGB kept as RGB
    # val in (label, member) order: val_1 and val_3 are n01, val_0 n02, val_2 n03; the unlabelled test/ left out
    assert ds.y_test.tolist() == [0, 0, 1, 2]
    want = [[101, 102, 103], [103, 103, 103], [100, 101, 102], [102, 103, 104]]  # val_3: its gray 103 as RGB
    assert [x[:, 0, 0].tolist() for x in ds.x_test] == want


def test_the_folder_it_unzips_to_gives_the_zips_arrays(tmp_path: Path) -> None:
    from_zip = load_tinyimagenet(as_zip(tmp_path / "t.zip", tiny_files()), tmp_path / "cache")
    from_folder = load_tinyimagenet(write_dir(tmp_path / "tiny-imagenet-200", tiny_files()), tmp_path / "cache")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert getattr(from_zip, field).equal(getattr(from_folder, field))
    assert from_folder.classes == from_zip.classes
    assert len(list((tmp_path / "cache").glob("tinyimagenet-*.npz"))) == 2  # one cache per source


def test_a_val_image_without_an_annotation_is_named(tmp_path: Path) -> None:
    val = {k: v for k, v in VAL.items() if k != "val_2.JPEG"}
    archive = as_zip(tmp_path / "t.zip", tiny_files(val))
    with pytest.raises(DataError) as err:
        load_tinyimagenet(archive, tmp_path / "cache")
    assert str(err.value) == (
        f"tinyimagenet {archive}: tiny-imagenet-200/val/images/val_2.JPEG has no line in val/val_annotations.txt"
    )
    assert not (tmp_path / "cache").exists()  # nothing cached of a dataset that failed


@pytest.mark.parametrize("drop", ["train/", "val/images/", "val/val_annotations.txt"])
def test_a_missing_part_of_the_layout_is_named(tmp_path: Path, drop: str) -> None:
    archive = as_zip(tmp_path / "t.zip", {k: v for k, v in tiny_files().items() if not k.startswith(drop)})
    with pytest.raises(DataError) as err:
        load_tinyimagenet(archive, tmp_path / "cache")
    what = "no train/<wnid>/images/*.JPEG found" if drop == "train/" else "no val/images/*.JPEG or no val/val_anno"
    assert str(err.value).startswith(f"tinyimagenet {archive}: {what}") and URL in str(err.value)


def test_nothing_at_root_says_where_to_get_it_and_that_fedsim_does_not_download(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_tinyimagenet(tmp_path / "tiny-imagenet-200.zip", tmp_path / "cache")
    assert str(err.value) == (
        f"tinyimagenet: nothing at {tmp_path / 'tiny-imagenet-200.zip'}. Download {URL} (about 240 MB) and set "
        "data.root to the zip, or to the tiny-imagenet-200/ folder it unzips to; fedsim does not download it"
    )
