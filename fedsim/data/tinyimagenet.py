"""The ``tinyimagenet`` loader: Tiny ImageNet (Le & Yang 2015) as its authors distribute it.

Reads ``tiny-imagenet-200.zip`` (:data:`URL`) or the folder it unzips to, in one pass, never
unpacking: ``train/<wnid>/images/*.JPEG`` (500 a class) are the train split; ``val/images/*.JPEG``,
labelled by ``val/val_annotations.txt`` (50 a class), the test split, since the official ``test/``
images carry no labels. Classes are the 200 wnids in sorted order; images are 64x64 RGB (the
grayscale ones converted). Decoded arrays are cached as ``imagefolder``'s are. A copy already
rearranged into ``train/<class>/`` and ``test/<class>/`` folders loads with ``imagefolder``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from fedsim.data.archives import archive_members
from fedsim.data.base import DATASETS, ArrayDataset, DatasetLoader, DataSource
from fedsim.data.imagefolder import IMAGE_SUFFIXES, Arrays, ImageDecoder, load_cached
from fedsim.errors import DataError

URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TOP = frozenset({"train", "val", "test", "wnids.txt", "words.txt"})


@DATASETS.register("tinyimagenet")
class TinyImageNet(DatasetLoader):
    """Tiny ImageNet, 200 classes of 64x64 (root: tiny-imagenet-200.zip or its folder); val is the test split."""

    def load(self, source: DataSource) -> ArrayDataset:
        return load_tinyimagenet(source.root, source.cache_dir)


def load_tinyimagenet(root: Path, cache_dir: Path) -> ArrayDataset:
    """Tiny ImageNet from its zip or folder at ``root``, decoded once and cached in ``cache_dir``."""
    root = root.resolve()
    if not root.exists():
        # Not downloaded even with data.download: the file is not on a package index fedsim may fetch from.
        raise DataError(
            f"tinyimagenet: nothing at {root}. Download {URL} (about 240 MB) and set data.root to the zip, "
            f"or to the tiny-imagenet-200/ folder it unzips to; fedsim does not download it"
        )
    return load_cached(root, cache_dir, "tinyimagenet", _decode, "tinyimagenet")


def _decode(root: Path) -> Arrays:
    decoder = ImageDecoder(root)
    val: list[tuple[str, str, bytes]] = []  # (file name, member, bytes): labelled once the annotations are read
    labels: dict[str, str] = {}
    for member, read in archive_members(root):
        parts = PurePosixPath(member).parts
        if len(parts) > 1 and parts[0] not in _TOP:  # the zip's tiny-imagenet-200/ wrapper
            parts = parts[1:]
        image = PurePosixPath(member).suffix.lower() in IMAGE_SUFFIXES
        if image and len(parts) == 4 and parts[0] == "train" and parts[2] == "images":
            decoder.add("train", parts[1], member, read())
        elif image and len(parts) == 3 and parts[:2] == ("val", "images"):
            val.append((parts[2], member, read()))
        elif parts == ("val", "val_annotations.txt"):
            for line in read().decode().splitlines():
                fields = line.split("\t")
                if len(fields) >= 2:
                    labels[fields[0]] = fields[1]
    layout = f"is it {URL} (train/<wnid>/images/*.JPEG, val/images/*.JPEG, val/val_annotations.txt)?"
    if not decoder.images["train"]:
        raise DataError(f"tinyimagenet {root}: no train/<wnid>/images/*.JPEG found; {layout}")
    if not val or not labels:
        raise DataError(f"tinyimagenet {root}: no val/images/*.JPEG or no val/val_annotations.txt; {layout}")
    for name, member, data in val:
        if name not in labels:
            raise DataError(f"tinyimagenet {root}: {member} has no line in val/val_annotations.txt")
        decoder.add("test", labels[name], member, data)
    return decoder.finish()
