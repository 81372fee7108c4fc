"""Dirichlet label skew: per class k, p_k ~ Dir(beta * 1_N) over clients.

NIID-Bench's scheme (Li et al., "Federated Learning on Non-IID Data Silos: An Experimental
Study", ICDE 2022, ``partition_data``, ``noniid-labeldir``): shuffle class k, draw p_k, cut at
floor(cumsum(p_k) * n_k). Small beta concentrates each class on few clients; beta -> inf is IID.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from fedsim.errors import DataError
from fedsim.partitions.base import PARTITIONERS, Labels, Partition, Partitioner, sorted_int64


def _cut(idx: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """Split ``idx`` at floor(cumsum(proportions) * len(idx)), NIID-Bench's rule."""
    cuts = (np.cumsum(proportions) * len(idx)).astype(np.int64)[:-1]
    return np.split(idx, cuts)


# The most draws min_size may take: 100,000 took 56 s on 5,000 samples (a draw is linear in the samples, so about a
# minute on CIFAR-10's 50,000 at this bound); max_tries: 1000000000 would have run for days before its DataError
MAX_TRIES = 10_000


@PARTITIONERS.register("dirichlet")
class DirichletPartitioner(Partitioner):
    """Dir(beta) label skew per class over clients (NIID-Bench, Li et al. 2022); test split follows train."""

    class Params(Partitioner.Params):
        beta: float = Field(0.5, gt=0, description="Dirichlet concentration; smaller = more skewed")
        min_size: int = Field(0, ge=0, description="redraw until every client has this many train samples")
        balance: bool = Field(False, description="NIID-Bench's mask: full clients get no more classes")
        max_tries: int = Field(1000, ge=1, le=MAX_TRIES, description="draws before min_size gives up with DataError")

    params: Params

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        train_labels, test_labels, num_classes = labels.train, labels.test, labels.num_classes
        p = self.params
        n_total = len(train_labels)
        if p.min_size * num_clients > n_total:  # no draw can succeed: fail now, not after max_tries
            raise DataError(
                f"dirichlet: min_size={p.min_size} x num_clients={num_clients} exceeds the "
                f"{n_total} train samples (beta={p.beta}); lower min_size"
            )
        for tries in range(1, p.max_tries + 1):  # noqa: B007 (read after the loop, in the note)
            train, props = self._draw(train_labels, num_clients, num_classes, p, rng)
            if min(len(t) for t in train) >= p.min_size:
                break
        else:
            more = f" or raise max_tries (at most {MAX_TRIES:,})" if p.max_tries < MAX_TRIES else ""
            raise DataError(
                f"dirichlet: no split with every client holding >= min_size={p.min_size} train samples "
                f"after max_tries={p.max_tries} tries (beta={p.beta}, num_clients={num_clients}, "
                f"{n_total / num_clients:.0f} train samples per client on average); raise beta, lower min_size{more}"
            )
        test = self._follow(test_labels, train, train_labels, props, num_clients, num_classes, rng)
        note = f"dirichlet: {tries} draws to reach min_size={p.min_size}" if tries > 1 else ""
        return Partition(train=sorted_int64(train), test=sorted_int64(test), note=note)

    @staticmethod
    def _draw(
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        p: DirichletPartitioner.Params,
        rng: np.random.Generator,
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """One NIID-Bench draw; returns the train parts and the (C, N) proportions actually used."""
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        used = np.zeros((num_classes, num_clients))
        for k in range(num_classes):
            idx_k = rng.permutation(np.flatnonzero(labels == k))
            prop = rng.dirichlet(np.full(num_clients, p.beta))
            if p.balance:
                # Integer form of NIID-Bench's `len(idx_j) < N / n_parties`, exact for any N.
                open_ = sizes * num_clients < len(labels)
                prop = prop * open_
                if prop.sum() <= 0:  # tiny beta can underflow every open client's share to 0.0
                    prop = open_.astype(float)
            if prop.sum() <= 0:
                prop = np.full(num_clients, 1.0)
            prop = prop / prop.sum()
            used[k] = prop
            for i, chunk in enumerate(_cut(idx_k, prop)):
                parts[i].append(chunk)
                sizes[i] += len(chunk)
        return [np.concatenate(c) if c else np.empty(0, np.int64) for c in parts], used

    @staticmethod
    def _follow(
        test_labels: np.ndarray,
        train: list[np.ndarray],
        train_labels: np.ndarray,
        props: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
    ) -> list[np.ndarray]:
        """Cut each class's test samples with that class's realised train shares (drawn p_k if absent)."""
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for k in range(num_classes):
            idx_k = rng.permutation(np.flatnonzero(test_labels == k))
            counts = np.array([np.count_nonzero(train_labels[t] == k) for t in train], dtype=np.int64)
            n_k = int(counts.sum())
            if n_k > 0:
                # floor(cumsum(counts / n_k) * m_k) in integers, so float rounding never moves a cut.
                cuts = (np.cumsum(counts) * len(idx_k) // n_k)[:-1]
                chunks = np.split(idx_k, cuts)
            else:
                chunks = _cut(idx_k, props[k])
            for i, chunk in enumerate(chunks):
                parts[i].append(chunk)
        return [np.concatenate(c) if c else np.empty(0, np.int64) for c in parts]
