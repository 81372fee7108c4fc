"""The ``imagefolder`` loader: ``train/<class>/*`` and ``test/<class>/*`` in a directory, a tar or a zip.

Archives are read in one streaming pass to their end, checked (:mod:`fedsim.data.archives`), never
unpacked, and the decoded uint8 arrays are cached in ``cache_dir``, keyed by a SHA-256 of the
source's bytes and written only once a whole source decoded without error, so only the first load
decodes and a damaged source never leaves a cache behind.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from fedsim.data.archives import archive_members
from fedsim.data.base import DATASETS, ArrayDataset, DatasetLoader, DataSource
from fedsim.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png"})
PIL_FORMATS = ("JPEG", "PNG")
# Bump when the decoded layout changes, so old caches are ignored. 2: caches of version 1 may hold what a
# damaged tar read up to its damage, which version 1 took for the whole dataset
CACHE_VERSION = 2


@DATASETS.register("imagefolder")
class ImageFolder(DatasetLoader):
    """train/<class>/*.jpg|png and test/<class>/* in a directory or .tar(.gz)/.zip; decoded once, cached."""

    def load(self, source: DataSource) -> ArrayDataset:
        return load_imagefolder(source.root, source.cache_dir)


def load_imagefolder(root: Path, cache_dir: Path) -> ArrayDataset:
    """An ImageFolder tree or archive at ``root``, decoded once and cached in ``cache_dir``."""
    root = root.resolve()
    if not root.exists():
        raise DataError(
            f"imagefolder dataset {dataset_name(root)!r}: nothing at {root}; set data.root to a directory or "
            f".tar(.gz) / .zip archive holding train/<class>/<image> and test/<class>/<image> (.jpg or .png, "
            f"all one size, optionally inside one top-level folder)"
        )
    return load_cached(root, cache_dir, f"imagefolder-{dataset_name(root)}", _decode, dataset_name(root))


def load_cached(root: Path, cache_dir: Path, prefix: str, decode: Callable[[Path], Arrays], name: str) -> ArrayDataset:
    """``decode(root)``'s arrays as an ArrayDataset, read from ``cache_dir`` when the source is unchanged."""
    cache = cache_dir / f"{prefix}-{_source_key(root)}.npz"
    cached = _read_cache(cache)
    arrays = decode(root) if cached is None else cached
    domains = arrays.get("domains")
    dataset = ArrayDataset(
        x_train=torch.from_numpy(arrays["x_train"]),
        y_train=torch.from_numpy(arrays["y_train"]),
        x_test=torch.from_numpy(arrays["x_test"]),
        y_test=torch.from_numpy(arrays["y_test"]),
        classes=[str(c) for c in arrays["classes"].tolist()],
        name=name,
        domains=None if domains is None else [str(d) for d in domains.tolist()],
        d_train=None if domains is None else torch.from_numpy(arrays["d_train"]),
        d_test=None if domains is None else torch.from_numpy(arrays["d_test"]),
    )
    if cached is None:  # written once the dataset passed its checks: bad data leaves no cache behind
        _write_cache(cache, arrays)
    return dataset


# x_train, y_train, x_test, y_test, classes; and domains, d_train, d_test for a dataset of domains
Arrays = dict[str, np.ndarray]
REQUIRED = ("x_train", "y_train", "x_test", "y_test", "classes")


def dataset_name(root: Path) -> str:
    """A dataset's name from its folder or archive: the file name without .tar(.gz) / .tgz / .zip."""
    name = root.name
    for suffix in (".tar.gz", ".tgz", ".tar", ".zip"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _source_key(root: Path) -> str:
    """The source's fingerprint: a SHA-256 of an archive's bytes (0.04 s for CIFAR-10's 20 MB), or of every
    file's path and bytes in a tree (1 s for CIFAR-10's 60,000 files; a decode takes 10 s)."""
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    files = [root] if not root.is_dir() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        with open(path, "rb") as f:
            h.update(f"{path.relative_to(root).as_posix()}|{hashlib.file_digest(f, 'sha256').hexdigest()}\n".encode())
    return h.hexdigest()[:16]


def _read_cache(path: Path) -> Arrays | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None  # unreadable cache (e.g. another fedsim version's): decode again and overwrite it
    return arrays if all(k in arrays for k in REQUIRED) else None


def _write_cache(path: Path, arrays: Arrays) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            # Uncompressed: a cache hit is then a plain read (0.2-2 s for CIFAR-10), not an inflate.
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, path)  # readers never see a half-written cache
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as err:
        # The cache only saves time; a read-only cache_dir must not stop the run.
        log.warning("cannot write dataset cache %s (%s); set FEDSIM_CACHE or data.cache_dir", path, err)


def _decode(root: Path) -> Arrays:
    decoder = ImageDecoder(root)
    for member, read in archive_members(root):
        split_class = _split_and_class(member)
        if split_class is not None:
            decoder.add(*split_class, member, read())
    return decoder.finish()


def _split_and_class(member: str) -> tuple[str, str] | None:
    """``[wrapper/]train/<class>/<file>`` -> ("train", class); anything else (README, ._foo) -> None."""
    parts = PurePosixPath(member).parts
    if len(parts) == 4:  # one top-level wrapping directory, as `tar czf x.tar.gz cifar10/` makes
        parts = parts[1:]
    if len(parts) != 3 or parts[0] not in SPLITS or parts[2].startswith("."):
        return None
    if PurePosixPath(parts[2]).suffix.lower() not in IMAGE_SUFFIXES:
        return None
    return parts[0], parts[1]


class ImageDecoder:
    """Decodes images one by one with Pillow into per-split lists, checking that all share one size.

    Measured on the CIFAR-10 q75 archive (60k 32x32 JPEGs, 2 cores): Pillow ~7-9 s, the tar
    stream ~4-5 s. Not taken: ``torchvision.io.decode_jpeg`` (pixel-identical, 3 s, but deprecated
    since torchvision 0.29) and a process pool of decoders (measured slower on 2 cores).
    ``size`` resizes every image to size x size (bilinear, antialiased) as it is decoded; an image's
    ``domain`` (``add``), when given, is kept beside its label.
    """

    def __init__(self, root: Path, size: int | None = None) -> None:
        self.root = root
        self.size = size
        self.images: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        self.meta: dict[str, list[tuple[str, str, str]]] = {s: [] for s in SPLITS}  # (class, member, domain)
        self.shape: tuple[int, ...] | None = None
        self.first = ""

    def add(self, split: str, cls: str, member: str, data: bytes, domain: str = "") -> None:
        try:
            # formats=...: skip probing Pillow's other plugins (~10% of the per-image cost)
            with Image.open(io.BytesIO(data), formats=PIL_FORMATS) as im:
                rgb = im.convert("RGB") if im.mode != "RGB" else im
                if self.size is not None:
                    rgb = rgb.resize((self.size, self.size), Image.Resampling.BILINEAR, reducing_gap=None)
                img = np.array(rgb)  # H x W x 3 uint8
        except UnidentifiedImageError as err:  # its message names a BytesIO object at some address
            raise DataError(f"imagefolder dataset {self.root}: cannot decode {member}: not a JPEG or PNG") from err
        except (Image.DecompressionBombError, OSError, ValueError, SyntaxError) as err:
            # SyntaxError: what Pillow raises for a PNG whose chunks are damaged
            raise DataError(f"imagefolder dataset {self.root}: cannot decode {member}: {err}") from err
        if self.shape is None:
            self.shape, self.first = tuple(img.shape), member
        elif tuple(img.shape) != self.shape:
            raise DataError(
                f"imagefolder dataset {self.root}: {member} is {img.shape[1]}x{img.shape[0]} but "
                f"{self.first} is {self.shape[1]}x{self.shape[0]}; all images must share one size "
                f"(resize them first)"
            )
        self.images[split].append(img)
        self.meta[split].append((cls, member, domain))

    def finish(self) -> Arrays:
        for split in SPLITS:
            if not self.images[split]:
                raise DataError(
                    f"imagefolder dataset {self.root}: no {split} images; expected "
                    f"{split}/<class>/<image>.jpg|.png (optionally inside one top-level folder)"
                )
        classes = sorted({cls for cls, _, _ in self.meta["train"]})
        unknown = sorted({cls for cls, _, _ in self.meta["test"]} - set(classes))
        if unknown:
            raise DataError(f"imagefolder dataset {self.root}: test classes {unknown} have no train/ folder")
        label = {cls: i for i, cls in enumerate(classes)}
        domains = sorted({d for split in SPLITS for _, _, d in self.meta[split]})
        arrays: Arrays = {"classes": np.array(classes, dtype=np.str_)}
        for split in SPLITS:
            # Canonical order (label, path): the arrays do not depend on the archive's member order.
            keys = [(label[cls], member) for cls, member, _ in self.meta[split]]
            order = sorted(range(len(keys)), key=keys.__getitem__)
            imgs = self.images[split]
            # N x H x W x C -> contiguous N x C x H x W, the layout the batch path slices
            arrays[f"x_{split}"] = np.ascontiguousarray(np.stack([imgs[i] for i in order]).transpose(0, 3, 1, 2))
            arrays[f"y_{split}"] = np.array([keys[i][0] for i in order], dtype=np.int64)
            if domains != [""]:
                index = {d: i for i, d in enumerate(domains)}
                arrays[f"d_{split}"] = np.array([index[self.meta[split][i][2]] for i in order], dtype=np.int64)
        if domains != [""]:
            arrays["domains"] = np.array(domains, dtype=np.str_)
        return arrays
