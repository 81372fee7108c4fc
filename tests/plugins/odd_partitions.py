"""Partitioners with a bug each, as a user's plugin may have one: what they return is refused before a run
(tests/test_bad_inputs.py, partitions.base.check_assignment)."""

from __future__ import annotations

import numpy as np

from fedsim.partitions import Labels, Partition, Partitioner


def _halves(n: int, num_clients: int) -> list[np.ndarray]:
    return np.array_split(np.arange(n), num_clients)


class Repeats(Partitioner):
    """Client 0's training indices all 0: one image counted as many."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        train = _halves(len(labels.train), num_clients)
        train[0] = np.zeros(len(train[0]), dtype=np.int64)
        return Partition(train, _halves(len(labels.test), num_clients))


class OffByOne(Partitioner):
    """Every index one less: -1 would wrap round to the last image."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        return Partition([i - 1 for i in _halves(len(labels.train), num_clients)],
                         _halves(len(labels.test), num_clients))  # fmt: skip


class Masks(Partitioner):
    """Boolean masks where indices belong."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        masks = [np.arange(len(labels.train)) % num_clients == c for c in range(num_clients)]
        return Partition(masks, _halves(len(labels.test), num_clients))


class OneShort(Partitioner):
    """One client fewer than asked."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        return Partition(_halves(len(labels.train), num_clients - 1), _halves(len(labels.test), num_clients - 1))
