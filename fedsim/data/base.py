"""The dataset loader contract (:class:`DatasetLoader`), the in-memory :class:`ArrayDataset` and the
loaders' registry; :mod:`fedsim.data` says how data is kept.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.errors import ConfigError, DataError, FedsimError
from fedsim.names import control_character, unprintable
from fedsim.paths import package_path
from fedsim.registry import PluginParams, Registry

# Shipped sample data (the quickstart's mnist_small.npz lives here).
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class DataSource:
    """Where a loader reads: ``data.root`` (``fedsim:`` paths resolved), whether it may download, its cache."""

    root: Path
    download: bool
    cache_dir: Path


class DatasetLoader(ABC):
    """Base of every dataset loader: ``load(source)`` returns the whole dataset as an :class:`ArrayDataset`."""

    Params = PluginParams
    params: Any

    def __init__(self, params: PluginParams) -> None:
        self.params = params

    @abstractmethod
    def load(self, source: DataSource) -> ArrayDataset:
        """Train and test splits from ``source``; a missing or unreadable source raises :class:`DataError`."""


DATASETS: Registry[DatasetLoader] = Registry("datasets", DatasetLoader)


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no single truth value
class ArrayDataset:
    """Train and test splits as uint8 N x C x H x W images and int64 labels in ``range(len(classes))``.

    A dataset of several domains (PACS: photo, art painting, cartoon, sketch) also records each
    image's domain, int64 in ``range(len(domains))``, which the ``domains`` partitioner splits by.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: list[str]
    name: str
    domains: list[str] | None = None
    d_train: torch.Tensor | None = None
    d_test: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Loaders may be third-party plugins: catch a malformed dataset here, before any training.
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.dtype != torch.uint8 or x.ndim != 4 or not x.is_contiguous():
                raise DataError(
                    f"dataset {self.name!r}: x_{split} must be a contiguous uint8 N x C x H x W tensor, "
                    f"got {x.dtype} of shape {tuple(x.shape)}"
                )
            if y.dtype != torch.int64 or y.shape != (len(x),):
                raise DataError(
                    f"dataset {self.name!r}: y_{split} must be int64 of shape ({len(x)},), "
                    f"got {y.dtype} of shape {tuple(y.shape)}"
                )
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(self.classes)):
                raise DataError(
                    f"dataset {self.name!r}: y_{split} has labels in [{int(y.min())}, {int(y.max())}] "
                    f"but there are {len(self.classes)} classes"
                )
        self._check_domains()
        self._check_names()
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"dataset {self.name!r}: train images are {tuple(self.x_train.shape[1:])} "
                f"but test images are {tuple(self.x_test.shape[1:])}"
            )

    def _check_domains(self) -> None:
        given = [v is not None for v in (self.domains, self.d_train, self.d_test)]
        if not any(given):
            return
        if not all(given):
            raise DataError(f"dataset {self.name!r}: give domains, d_train and d_test together, or none of them")
        num_domains = len(self.domains or [])
        for split, d, x in (("train", self.d_train, self.x_train), ("test", self.d_test, self.x_test)):
            assert d is not None  # checked above; narrows the type
            out_of_range = len(d) > 0 and (int(d.min()) < 0 or int(d.max()) >= num_domains)
            if d.dtype != torch.int64 or d.shape != (len(x),) or out_of_range:
                raise DataError(
                    f"dataset {self.name!r}: d_{split} must be int64 of shape ({len(x)},) in 0..{num_domains - 1}, "
                    f"got {d.dtype} of shape {tuple(d.shape)}"
                )

    def _check_names(self) -> None:
        """Class and domain names (an imagefolder's class folders, an npz's ``classes``) without a control
        character: partition.csv's header and the plots' labels write them on one line, which a newline broke."""
        for kind, names in (("class", self.classes), ("domain", self.domains or [])):
            if (hit := control_character(list(names))) is not None:
                name, char = hit
                raise DataError(
                    f"dataset {self.name!r}: the {kind} name {name!r} (a folder's name, or an entry of an npz's "
                    f"classes) holds the control character {char!r}; {kind} names are written on one line "
                    "(partition.csv, the plots' labels): rename it"
                )

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_shape(self) -> tuple[int, int, int]:
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)


def default_cache_dir() -> Path:
    """``$FEDSIM_CACHE`` if set, else ``~/.cache/fedsim``; a FEDSIM_CACHE that ``data.cache_dir`` would refuse
    (a control character, a lone surrogate) is refused the same way."""
    cache = os.environ.get("FEDSIM_CACHE") or "~/.cache/fedsim"
    if (hit := control_character(cache)) is not None:
        raise ConfigError(f"FEDSIM_CACHE {cache!r}: {unprintable(hit[1])}")
    return Path(cache).expanduser()


def data_source(root: str | Path, download: bool = False, cache_dir: str | Path | None = None) -> DataSource:
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return DataSource(package_path(str(root)), download, cache)


def read_dataset(loader: DatasetLoader, source: DataSource, name: str) -> ArrayDataset:
    """``loader.load(source)``, checked: a plugin must return an :class:`ArrayDataset`."""
    try:
        dataset = loader.load(source)
    except FedsimError:
        raise
    except Exception as err:  # a plugin loader's bug, or a file no check foresaw: say which dataset and file
        raise DataError(f"dataset {name!r} at {source.root}: {type(err).__name__}: {err}") from err
    if not isinstance(dataset, ArrayDataset):
        raise DataError(f"dataset loader {name!r} returned {type(dataset).__name__}, not an ArrayDataset")
    return dataset


MAX_CLASSES = 100_000  # labels are class indices 0..C-1: ImageNet-21k, among the largest, has 21,841


def check_classes(dataset: ArrayDataset) -> None:
    """What a run can learn from and score: images in both splits, 2+ classes, each with training and test
    images. Otherwise a run is meaningless yet finishes (one class: accuracy 1.0, loss 0; a class without
    training images: an output never trained; without test images: a per-class accuracy of nothing; a
    stray label of 1,000,000: a model of a million outputs), or fails after training (no test images)."""
    what = f"dataset {dataset.name!r}"
    n_train, n_test, num_classes = len(dataset.y_train), len(dataset.y_test), dataset.num_classes
    if not n_train or not n_test:
        raise DataError(f"{what}: {n_train:,} training and {n_test:,} test images; a run needs both")
    if not 2 <= num_classes <= MAX_CLASSES:
        raise DataError(
            f"{what}: {n_train:,} training and {n_test:,} test images of {num_classes:,} class(es) "
            f"({', '.join(map(repr, dataset.classes[:3]))}); a run needs 2 to {MAX_CLASSES:,} classes"
        )
    for split, y in (("training", dataset.y_train), ("test", dataset.y_test)):
        counts = torch.bincount(y, minlength=num_classes)
        if missing := (counts == 0).nonzero().flatten().tolist():
            named = ", ".join(repr(dataset.classes[c]) for c in missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise DataError(
                f"{what}: {len(missing):,} of {num_classes:,} classes without {split} images ({named}); its "
                f"{len(y):,} {split} images cover {num_classes - len(missing):,}; every class needs training and "
                "test images (labels are class indices 0..C-1)"
            )


def load_dataset(
    name: str,
    root: str | Path,
    download: bool = False,
    cache_dir: str | Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> ArrayDataset:
    """Load dataset ``name`` (a :data:`DATASETS` name or ``package.module:Loader``) from ``root``."""
    loader = DATASETS.resolve(name, options, "data.dataset").create()
    return read_dataset(loader, data_source(root, download, cache_dir), name)


def _tensor(x: np.ndarray | torch.Tensor | list[int]) -> torch.Tensor:
    """``x`` as a tensor; an array stored big-endian (``'>i8'``, as another machine may write it) converted to
    native byte order first, losslessly: torch holds only native byte order."""
    if isinstance(x, torch.Tensor):
        return x
    array = np.asarray(x)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return torch.as_tensor(array)


CHANNELS = (1, 3, 4)  # grayscale, RGB, RGBA: what a channel axis plausibly holds


def nchw_uint8(x: np.ndarray | torch.Tensor, what: str) -> torch.Tensor:
    """N x H x W (grayscale) or N x H x W x C (channels last) uint8 images -> contiguous N x C x H x W.

    Channels first, N x C x H x W (PyTorch's layout: (N, 3, 32, 32)), would read as images 3 pixels high of
    32 channels, and train on nonsense: a last axis that is no channel count after an axis 1 that is one is
    refused."""
    t = _tensor(x)
    if t.dtype != torch.uint8:
        raise DataError(f"{what}: images must be uint8 (0..255), got {t.dtype}")
    if t.ndim == 3:
        return t.unsqueeze(1).contiguous()
    if t.ndim == 4:
        if t.shape[3] not in CHANNELS and t.shape[1] in CHANNELS:
            raise DataError(
                f"{what}: shape {tuple(t.shape)} looks channels-first (N, C, H, W); fedsim reads images as "
                f"(N, H, W) or (N, H, W, C), channels last, C in {CHANNELS}: store them as "
                f"np.moveaxis(x, 1, -1), shape {(t.shape[0], t.shape[2], t.shape[3], t.shape[1])}"
            )
        return t.permute(0, 3, 1, 2).contiguous()
    raise DataError(f"{what}: images must be N x H x W or N x H x W x C, got shape {tuple(t.shape)}")


def labels_int64(y: np.ndarray | torch.Tensor | list[int], n: int, what: str) -> torch.Tensor:
    """Labels as an int64 vector of length ``n``; Keras' (N, 1) label columns are flattened."""
    t = _tensor(y)
    if t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.ndim != 1 or len(t) != n or t.is_floating_point():
        raise DataError(f"{what}: labels must be {n} integers, got {t.dtype} of shape {tuple(t.shape)}")
    t = t.to(torch.int64).contiguous()
    if beyond := int((t >= MAX_CLASSES).sum()):  # before a loader makes a class name for every index up to it
        raise DataError(
            f"{what}: {beyond:,} of {n:,} labels are {MAX_CLASSES:,} or more (the largest {int(t.max()):,}); labels "
            f"are class indices 0..C-1, at most {MAX_CLASSES:,} classes"
        )
    return t
