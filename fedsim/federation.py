"""The federation a config describes: the dataset and its split among clients.

Computed once per process (the server and every client worker derive the same split from the
seed, so no indices travel over the wire) and cached by the parts of the config it depends on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedsim.config import RunConfig, validate_options
from fedsim.data import ArrayDataset, load_dataset
from fedsim.partitions import PARTITIONERS, Partition, class_counts


@dataclass(frozen=True)
class Federation:
    dataset: ArrayDataset
    partition: Partition
    train_counts: np.ndarray  # (num_clients, num_classes)
    test_counts: np.ndarray


def load_federation(cfg: RunConfig) -> Federation:
    key = json.dumps(
        {
            "data": cfg.data.model_dump(mode="json"),
            "partition": cfg.partition.model_dump(mode="json"),
            "num_clients": cfg.train.num_clients,
            "seed": cfg.seed,
        },
        sort_keys=True,
    )
    return _load(key)


@lru_cache(maxsize=4)
def _load(key: str) -> Federation:
    spec = json.loads(key)
    data = spec["data"]
    dataset = load_dataset(data["dataset"], data["root"], data["download"], data["cache_dir"])
    options = {k: v for k, v in spec["partition"].items() if k != "name"}
    partitioner = PARTITIONERS.get(spec["partition"]["name"])
    params = validate_options(partitioner.Params, options, "partition")
    # the split depends on (seed, dataset, N, params) only: a fixed stream for the partitioner
    rng = np.random.default_rng([spec["seed"], 0x9A27])
    partition = partitioner().split(
        dataset.y_train.numpy(), dataset.y_test.numpy(), spec["num_clients"], dataset.num_classes, params, rng
    )
    return Federation(
        dataset=dataset,
        partition=partition,
        train_counts=class_counts(dataset.y_train.numpy(), partition.train, dataset.num_classes),
        test_counts=class_counts(dataset.y_test.numpy(), partition.test, dataset.num_classes),
    )
