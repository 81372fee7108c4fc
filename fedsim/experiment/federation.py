"""The federation a config describes: the dataset and its split among clients.

Two kinds, one interface (every client's samples, the classes, the input shape, the fingerprint):
a :class:`Federation` of a loaded dataset split by a partitioner, computed once per process (the
server and every client worker derive the same split from the seed, so no indices travel over the
wire), and a :class:`GeneratedFederation` of a dataset generated per client
(:mod:`fedsim.data.generated`), which holds no per-client table at all. Both are cached by the parts
of the config they depend on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from fedsim.config import RunConfig
from fedsim.data import ArrayDataset, DatasetLoader, data_source, read_dataset
from fedsim.data.batches import to_float
from fedsim.data.fingerprint import fingerprint
from fedsim.data.generated import ClientArrays, GeneratedLoader
from fedsim.errors import DataError, FedsimError
from fedsim.partitions import Labels, Partition, Partitioner, class_counts


@dataclass(frozen=True)
class InputTransform:
    """uint8 images -> the float inputs every model sees: [0, 1], optionally standardised per channel (float
    feature vectors pass unchanged).

    One object for the clients' training and test batches, the server's global evaluation and the
    diagnostics probe, so all of them see the same inputs.
    """

    stats: tuple[torch.Tensor, torch.Tensor] | None = None  # per-channel (mean, std) of the train set

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = to_float(x)
        if self.stats is not None:
            mean, std = (v.to(x.device).view(1, -1, 1, 1) for v in self.stats)
            x = (x - mean) / std
        return x


@dataclass(frozen=True)
class Federation:
    """A loaded dataset split among clients."""

    dataset: ArrayDataset
    partition: Partition
    train_counts: np.ndarray  # (num_clients, num_classes)
    test_counts: np.ndarray

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return self.dataset.in_shape

    @property
    def note(self) -> str:
        return self.partition.note

    @property
    def counts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The (clients, classes) train and test counts partition.csv holds."""
        return self.train_counts, self.test_counts

    def client(self, pid: int) -> ClientArrays:
        """Client ``pid``'s slices of the dataset."""
        ds, part = self.dataset, self.partition
        tr, te = torch.from_numpy(part.train[pid]), torch.from_numpy(part.test[pid])
        return ClientArrays(ds.x_train[tr], ds.y_train[tr], ds.x_test[te], ds.y_test[te])

    @cached_property
    def data_sha256(self) -> str:
        """The dataset's fingerprint (:mod:`fedsim.data.fingerprint`), once per process: the server records it and
        every client node reports it before round 1."""
        return fingerprint(self.dataset)

    @cached_property
    def channel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std of the training images in [0, 1], in chunks (no float copy of all): the mean
        first, then the squared deviations from it, so each variance is a sum of non-negative terms (a sum of
        squares less n·mean² cancels to 0, or below it, on a near-constant channel). A channel whose std is under
        one grey level (1/255) has next to no spread to divide by: a pixel one level off lands beyond a standard
        deviation, and a test image that differs from the training ones far beyond; it is refused, naming the field
        that asks for the division."""
        x = self.dataset.x_train
        chunks = [x[start : start + 4096] for start in range(0, len(x), 4096)]
        n = len(x) * x.shape[2] * x.shape[3]
        mean = sum(c.double().div_(255).sum((0, 2, 3)) for c in chunks) / n
        centred = mean.view(1, -1, 1, 1)
        squares = sum(c.double().div_(255).sub_(centred).square_().sum((0, 2, 3)) for c in chunks)
        std = (squares / (n - 1)).sqrt()
        if flat := [int(c) for c in torch.nonzero(std < 1 / 255).flatten()]:
            low = torch.stack([c.amin((0, 2, 3)) for c in chunks]).amin(0)
            high = torch.stack([c.amax((0, 2, 3)) for c in chunks]).amax(0)
            said = ", ".join(
                f"channel {c} holds {int(low[c])} in every pixel (std 0)" if low[c] == high[c] else f"channel {c} has "
                f"std {float(std[c]):.2g}, under one grey level (1/255)" for c in flat
            )  # fmt: skip
            raise DataError(
                f"data.normalize: true divides each channel of the training images by its std, and {said}; set "
                "data.normalize: false, or drop the channel from the dataset"
            )
        return mean.float(), std.float()

    def input_transform(self, normalize: bool) -> InputTransform:
        return InputTransform(self.channel_stats if normalize else None)


@dataclass(frozen=True)
class GeneratedFederation:
    """A dataset generated per client: client ``pid`` is the loader's client ``pid``; nothing is held per client."""

    loader: GeneratedLoader
    name: str
    dataset = None  # no whole dataset: no global test set, no probe batch (refused by the config checks)
    counts = None  # no partition table: a million clients would make it a million rows, drawn for nothing
    note = ""

    @property
    def classes(self) -> list[str]:
        return self.loader.classes

    @property
    def num_classes(self) -> int:
        return len(self.loader.classes)

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return self.loader.in_shape

    @cached_property
    def data_sha256(self) -> str:
        return self.loader.fingerprint()

    def client(self, pid: int) -> ClientArrays:
        return self.loader.client(pid)

    def input_transform(self, normalize: bool) -> InputTransform:
        return InputTransform(None)  # normalize is refused for generated data (fedsim.experiment.resolve)


AnyFederation = Federation | GeneratedFederation


def load_federation(cfg: RunConfig, loader: DatasetLoader, partitioner: Partitioner) -> AnyFederation:
    """The dataset and its split for ``cfg`` (``loader`` and ``partitioner`` are its resolved plugins).

    Cached by what the split depends on: the data section less what is applied batch by batch (``augment``,
    ``normalize``: the channel statistics are the dataset's), the partition, the number of clients, the seed."""
    key = json.dumps(
        {
            "data": cfg.data.model_dump(mode="json", exclude={"augment", "normalize"}),
            "partition": cfg.partition.model_dump(mode="json"),
            "num_clients": cfg.train.num_clients,
            "seed": cfg.seed,
        },
        sort_keys=True,
    )
    if key not in _CACHE:
        while len(_CACHE) >= _CACHE_SIZE:  # oldest first: a sweep in one process moves on
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _split(cfg, loader, partitioner)
    return _CACHE[key]


_CACHE: dict[str, AnyFederation] = {}
_CACHE_SIZE = 4


def _split(cfg: RunConfig, loader: DatasetLoader, partitioner: Partitioner) -> AnyFederation:
    if isinstance(loader, GeneratedLoader):
        return GeneratedFederation(loader, cfg.data.dataset.name)
    d = cfg.data
    dataset = read_dataset(loader, data_source(d.root, d.download, d.cache_dir), cfg.data.dataset.name)
    # the split depends on (seed, dataset, N, params) only: a fixed stream for the partitioner
    rng = np.random.default_rng([cfg.seed, 0x9A27])
    y_train, y_test = dataset.y_train.numpy(), dataset.y_test.numpy()
    labels = Labels(y_train, y_test, dataset.num_classes)
    if dataset.domains is not None and dataset.d_train is not None and dataset.d_test is not None:
        domains, d_train, d_test = tuple(dataset.domains), dataset.d_train.numpy(), dataset.d_test.numpy()
        labels = Labels(y_train, y_test, dataset.num_classes, domains, d_train, d_test)
    try:
        partition = partitioner.split(labels, cfg.train.num_clients, rng)
    except FedsimError:
        raise
    except Exception as err:  # a plugin partitioner's bug: say whose
        raise DataError(f"partition: {cfg.partition.name!r} raised {type(err).__name__}: {err}") from err
    return Federation(
        dataset=dataset,
        partition=partition,
        train_counts=class_counts(y_train, partition.train, dataset.num_classes),
        test_counts=class_counts(y_test, partition.test, dataset.num_classes),
    )
