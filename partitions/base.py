"""The partitioner contract (:class:`Partitioner`), the :class:`Partition` it returns and its
registry; :mod:`fedsim.partitions` lists the built-ins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsim.errors import DataError
from fedsim.registry import PluginParams, Registry


@dataclass(frozen=True)
class Labels:
    """What a partitioner splits: a dataset's train and test labels (1-D integers in ``range(num_classes)``),
    and for a dataset of several domains each sample's domain (integers in ``range(len(domains))``)."""

    train: np.ndarray
    test: np.ndarray
    num_classes: int
    domains: tuple[str, ...] = ()
    train_domain: np.ndarray | None = None
    test_domain: np.ndarray | None = None


@dataclass(frozen=True)
class Partition:
    """Per-client index arrays into the train and test sets (int64, each sorted)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    note: str = ""  # e.g. "n_class: 7 clients x 3 classes does not divide 10 classes evenly"


class Partitioner(ABC):
    """Base of every partitioner: deterministic from ``(rng, labels, num_clients, params)``."""

    Params = PluginParams
    params: Any

    def __init__(self, params: PluginParams) -> None:
        self.params = params

    def split(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        """Every client's train and test indices; inputs no partitioner can split raise :class:`DataError`."""
        self.check_clients(num_clients)
        name = PARTITIONERS.name_of(type(self))
        check_split_inputs(name, labels.train, labels.test, num_clients, labels.num_classes)
        partition = self.assign(labels, num_clients, rng)
        check_assignment(name, partition, num_clients, len(labels.train), len(labels.test))
        return partition

    def check_clients(self, num_clients: int) -> None:
        """Refuse a number of clients this partitioner can split for no dataset (:class:`ConfigError`).

        Called when a config is resolved, before any data is read or any run of a sweep starts.
        """
        return None  # most partitioners take any count that check_split_inputs allows

    @abstractmethod
    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        """The split itself, on inputs :meth:`split` has checked."""


PARTITIONERS: Registry[Partitioner] = Registry("partitions", Partitioner)


def check_assignment(name: str, partition: Partition, num_clients: int, n_train: int, n_test: int) -> None:
    """Refuse what a partitioner (a plugin's, most likely) returned unless it is a :class:`Partition` of one
    array of integer indices per client and split, each index within its images and given once per client: a
    repeated index counted one image many times in partition.csv, a negative one wrapped round to the last image,
    a boolean mask was read as the indices 0 and 1. Clients may share indices (a test image scored by several)."""
    if not isinstance(partition, Partition):
        raise DataError(f"partition: {name!r} returned a {type(partition).__name__}, not a Partition")
    for split, parts, n in (("training", partition.train, n_train), ("test", partition.test, n_test)):
        if len(parts) != num_clients:
            raise DataError(f"partition: {name!r} gave {len(parts)} arrays of {split} indices for {num_clients} "
                            "clients (train.num_clients): one per client")  # fmt: skip
        for client, idx in enumerate(parts):
            if not isinstance(idx, np.ndarray) or idx.ndim != 1 or idx.dtype.kind not in "iu":
                kind = f"{idx.dtype} array of shape {idx.shape}" if isinstance(idx, np.ndarray) else type(idx).__name__
                raise DataError(f"partition: {name!r} gave client {client}'s {split} indices as a {kind}, not a 1-D "
                                f"array of integer indices into the {split} images")  # fmt: skip
            if len(idx) and not (0 <= idx.min() and idx.max() < n):
                bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
                raise DataError(f"partition: {name!r} gave client {client} {split} index {bad}, outside 0..{n - 1} "
                                f"(the {split} images)")  # fmt: skip
            values, counts = np.unique(idx, return_counts=True)
            if len(values) != len(idx):
                first = int(values[counts > 1][0])
                raise DataError(f"partition: {name!r} gave client {client} {split} index {first} "
                                f"{int(counts[counts > 1][0])} times: each image once per client")  # fmt: skip


def check_participation(partition: Partition, per_round: int, scored_per_round: int) -> None:
    """Refuse a split where a round may train nothing, or score nothing: ``per_round`` sampled clients
    (train.clients_per_round) that can all be clients without training images (Dirichlet leaves some at small
    beta; their average would divide by zero samples), or ``scored_per_round`` (eval.clients) that can all be
    clients without test images (no client-mean accuracy to take). With every client in every round one
    non-empty client suffices: paper splits with empty clients still run."""
    for split, idx, drawn, field, does, remedy in (
        ("training", partition.train, per_round, "train.clients_per_round", "train",
         "give fewer clients, more per round, or a split that fills every client (dirichlet: min_size: 1)"),
        ("test", partition.test, scored_per_round, "eval.clients", "score",
         "score more clients per round (eval.clients; null: every client), or give fewer clients"),
    ):  # fmt: skip
        empty = [i for i, part in enumerate(idx) if not len(part)]
        if len(empty) >= drawn:
            shown = ", ".join(map(str, empty[:3])) + (", ..." if len(empty) > 3 else "")
            raise DataError(
                f"partition: {len(empty):,} of {len(idx):,} clients get no {split} images (client {shown}) and a "
                f"round samples {drawn:,} ({field}): a round may {does} nothing; {remedy}"
            )


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
        raise DataError(f"{name}: num_clients must be in 1..{n_train} (the number of train samples), got {num_clients}")
    for split, labels in (("train", train_labels), ("test", test_labels)):
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"{name}: {split} labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise DataError(
                f"{name}: {split} labels must lie in 0..{num_classes - 1}, found {labels.min()}..{labels.max()}"
            )


def sorted_int64(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
