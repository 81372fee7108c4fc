"""The federation a config describes: the dataset and its split among clients.

Computed once per process (the server and every client worker derive the same split from the
seed, so no indices travel over the wire) and cached by the parts of the config it depends on.
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
from fedsim.errors import DataError, FedsimError
from fedsim.partitions import Labels, Partition, Partitioner, class_counts


@dataclass(frozen=True)
class InputTransform:
    """uint8 images -> the float inputs every model sees: [0, 1], optionally standardised per channel.

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
    dataset: ArrayDataset
    partition: Partition
    train_counts: np.ndarray  # (num_clients, num_classes)
    test_counts: np.ndarray

    @cached_property
    def data_sha256(self) -> str:
        """The dataset's fingerprint (:mod:`fedsim.data.fingerprint`), once per process: the server records it and
        every client node reports it before round 1."""
        return fingerprint(self.dataset)

    @cached_property
    def channel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std of the training images in [0, 1], in chunks (no float copy of all)."""
        x = self.dataset.x_train
        total = torch.zeros(x.shape[1], dtype=torch.float64)
        squares = torch.zeros_like(total)
        for start in range(0, len(x), 4096):
            chunk = x[start : start + 4096].double().div_(255)
            total += chunk.sum((0, 2, 3))
            squares += chunk.square().sum((0, 2, 3))
        n = len(x) * x.shape[2] * x.shape[3]
        mean = total / n
        std = ((squares - n * mean.square()) / (n - 1)).sqrt()
        return mean.float(), std.float()

    def input_transform(self, normalize: bool) -> InputTransform:
        return InputTransform(self.channel_stats if normalize else None)


def load_federation(cfg: RunConfig, loader: DatasetLoader, partitioner: Partitioner) -> Federation:
    """The dataset and its split for ``cfg`` (``loader`` and ``partitioner`` are its resolved plugins).

    Cached by what the split depends on: ``(dataset, partition, number of clients, seed)``."""
    key = json.dumps(
        {
            "data": cfg.data.model_dump(mode="json"),
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


_CACHE: dict[str, Federation] = {}
_CACHE_SIZE = 4


def _split(cfg: RunConfig, loader: DatasetLoader, partitioner: Partitioner) -> Federation:
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
