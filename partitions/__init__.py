"""Partitioners: split a labelled dataset's train and test indices among clients.

A partitioner is a class registered in :data:`PARTITIONERS` with a nested pydantic ``Params``
model (its YAML options, ``extra="forbid"``, documented defaults) and a ``split`` method.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from fedsim.errors import DataError
from fedsim.registry import Registry


@dataclass(frozen=True)
class Partition:
    """Per-client index arrays into the train and test sets (int64, each sorted)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    note: str = ""  # e.g. "n_class: 7 clients x 3 classes does not divide 10 classes evenly"


class PartitionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Partitioner:
    """Base class: subclasses set ``Params`` and implement ``split``."""

    Params: ClassVar[type[PartitionParams]] = PartitionParams

    def split(
        self,
        train_labels: np.ndarray,
        test_labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        params: PartitionParams,
        rng: np.random.Generator,
    ) -> Partition:
        raise NotImplementedError


PARTITIONERS: Registry[type[Partitioner]] = Registry("partitions")


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """The (num_clients, num_classes) int64 matrix of how many samples of each class a client holds."""
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, idx in enumerate(parts):
        counts[i] = np.bincount(labels[idx], minlength=num_classes)[:num_classes]
    return counts


def check_split_inputs(
    name: str, train_labels: np.ndarray, test_labels: np.ndarray, num_clients: int, num_classes: int
) -> None:
    """Shared input checks for every partitioner; raise :class:`DataError` naming what is wrong."""
    if num_classes < 1:
        raise DataError(f"{name}: num_classes must be >= 1, got {num_classes}")
    n_train = len(train_labels)
    if not 1 <= num_clients <= n_train:
        raise DataError(
            f"{name}: num_clients must be in 1..{n_train} (the number of train samples), got {num_clients}"
        )
    for split, labels in (("train", train_labels), ("test", test_labels)):
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(
                f"{name}: {split} labels must be a 1-D integer array, got {labels.dtype} {labels.shape}"
            )
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise DataError(
                f"{name}: {split} labels must lie in 0..{num_classes - 1}, "
                f"found {labels.min()}..{labels.max()}"
            )


def sorted_int64(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# Registers the built-ins on `import fedsim.partitions`. They are imported last because they import
# the names above from this package; import_module (not an import statement) needs no lint
# suppression, on which ruff versions disagree (E402 is enabled in some, flagged unused in others).
for _module in ("dirichlet", "iid", "n_class"):
    importlib.import_module(f"{__name__}.{_module}")
del _module
