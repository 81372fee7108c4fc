"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 through ``torchvision.datasets``."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ClassVar

from fedsim.data.base import DATASETS, ArrayDataset, DatasetLoader, DataSource, labels_int64, nchw_uint8
from fedsim.errors import DataError


def _expected_dir(cls: type, root: Path) -> Path:
    # Where torchvision looks: CIFAR keeps a `base_folder`, the MNIST family `<root>/<ClassName>/raw`.
    base = getattr(cls, "base_folder", None)
    return (root / base if base else root / cls.__name__ / "raw").resolve()


def _gist(err: BaseException) -> str:
    # torchvision's download errors span lines (the file, each mirror tried, why): the file and the last reason
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(dict.fromkeys(lines[:1] + lines[-1:])) or type(err).__name__


def _files(cls: type) -> str:
    # The MNIST family reads uncompressed IDX files: name them, for users with an offline copy.
    idx_files = [Path(url).name.removesuffix(".gz") for url, _ in getattr(cls, "resources", [])]
    return f" ({', '.join(idx_files)})" if idx_files else ""


def _source(cls: type, root: Path) -> str:
    """Where the files come from and where to put them, in one sentence."""
    if hasattr(cls, "base_folder"):  # CIFAR: one archive that unpacks to base_folder/
        return (
            f"To use a copy you have, extract {cls.filename} ({cls.url}) so that {cls.base_folder}/ sits in "
            f"data.root (now {root.resolve()})."
        )
    mirror = next(iter(getattr(cls, "mirrors", [])), "")
    return f"To use a copy you have, gunzip the IDX files{f' from {mirror}' if mirror else ''} into that folder."


class TorchvisionSet(DatasetLoader):
    """A ``torchvision.datasets`` class, read from (or, with ``data.download``, downloaded into) ``data.root``."""

    torchvision_class: ClassVar[str]  # the torchvision.datasets class name

    def __init_subclass__(cls, torchvision_class: str = "", **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.torchvision_class = torchvision_class

    def load(self, source: DataSource) -> ArrayDataset:
        return load_torchvision(DATASETS.name_of(type(self)), self.torchvision_class, source.root, source.download)


@DATASETS.register("mnist")
class MNIST(TorchvisionSet, torchvision_class="MNIST"):
    """MNIST via torchvision.datasets (root: its download folder; data.download to fetch)."""


@DATASETS.register("fashion_mnist")
class FashionMNIST(TorchvisionSet, torchvision_class="FashionMNIST"):
    """Fashion-MNIST via torchvision.datasets (root: its download folder; data.download to fetch)."""


@DATASETS.register("cifar10")
class CIFAR10(TorchvisionSet, torchvision_class="CIFAR10"):
    """CIFAR-10 via torchvision.datasets (root: its download folder; data.download to fetch)."""


@DATASETS.register("cifar100")
class CIFAR100(TorchvisionSet, torchvision_class="CIFAR100"):
    """CIFAR-100 via torchvision.datasets (root: its download folder; data.download to fetch)."""


def load_torchvision(name: str, class_name: str, root: Path, download: bool) -> ArrayDataset:
    """Both splits of ``torchvision.datasets.<class_name>`` under ``root`` as uint8 arrays."""
    # Imported here: torchvision.datasets is slow to import and only these loaders need it.
    from torchvision import datasets

    cls = getattr(datasets, class_name)
    where = _expected_dir(cls, root)
    # the folders torchvision makes before it downloads: a failed download leaves none of them behind
    made = [p for p in (where, *where.parents) if not p.exists()]
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except (RuntimeError, OSError) as err:
        if download:
            for folder in made:  # deepest first; a folder something was written into stays
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise DataError(
                f"data.download: could not download {name} into {where} (no network?): {_gist(err)}"
            ) from err
        raise DataError(
            f"{name}: dataset files{_files(cls)} not found in {where}, and downloading is off (data.download: "
            f"false). {_source(cls, root)} Or set `data.download: true` to let torchvision download them into "
            f"{root.resolve()} (needs internet), or load a local copy with the `npz` or `imagefolder` dataset."
        ) from err
    x_train = nchw_uint8(train.data, f"{name} train")
    x_test = nchw_uint8(test.data, f"{name} test")
    return ArrayDataset(
        x_train=x_train,
        y_train=labels_int64(train.targets, len(x_train), f"{name} train"),
        x_test=x_test,
        y_test=labels_int64(test.targets, len(x_test), f"{name} test"),
        classes=[str(c) for c in train.classes],
        name=name,
    )
