"""What every partitioner (ALGORITHMS.md, "Partitions") holds to, on synthetic labels of 10 classes: the registry,
the same split for the same seed, input validation. Each partitioner against its definition: tests/test_iid.py,
tests/test_dirichlet.py, tests/test_n_class.py, tests/test_centralised.py, tests/test_natural.py; the shared checks
and class counts of partitions/base.py: tests/test_partitions_base.py; the helpers here are theirs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fedsim.errors import DataError
from fedsim.partitions import PARTITIONERS, Labels, Partition, class_counts

C = 10
TRAIN = np.repeat(np.arange(C), 100)  # 10 classes x 100 train samples
TEST = np.repeat(np.arange(C), 20)  # 10 classes x 20 test samples
SEEDS = st.integers(0, 2**32 - 1)
FAST = settings(max_examples=40, deadline=None)


def split(name: str, num_clients: int, seed: int, train: np.ndarray = TRAIN, **params: object) -> Partition:
    cls = PARTITIONERS.get(name)
    return cls(cls.Params(**params)).split(Labels(train, TEST, C), num_clients, np.random.default_rng(seed))


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every index 0..n-1 appears in exactly one part; parts are sorted int64."""
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def mean_max_class_share(part: Partition) -> float:
    counts = class_counts(TRAIN, part.train, C)
    total = counts.sum(axis=1)
    held = total > 0
    return float((counts.max(axis=1)[held] / total[held]).mean())


def test_registry_and_class_counts() -> None:
    assert {"centralised", "dirichlet", "iid", "n_class"} <= set(PARTITIONERS.names())
    labels = np.array([0, 0, 1, 2, 2, 2])
    counts = class_counts(labels, [np.array([0, 3]), np.array([], dtype=np.int64), np.array([1, 2, 4, 5])], 3)
    np.testing.assert_array_equal(counts, [[1, 0, 1], [0, 0, 0], [1, 1, 2]])
    assert counts.dtype == np.int64


@pytest.mark.parametrize("name,params", [("dirichlet", {"beta": 0.3}), ("n_class", {}), ("iid", {})])
def test_same_seed_same_split_other_seed_differs(name: str, params: dict[str, object]) -> None:
    a, b, other = (split(name, 10, seed, **params) for seed in (7, 7, 8))
    for x, y in zip(a.train + a.test, b.train + b.test, strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a.train, other.train, strict=True))


@pytest.mark.parametrize("name", ["dirichlet", "n_class", "iid"])
@pytest.mark.parametrize("num_clients", [0, 1001])
def test_num_clients_out_of_range_raises(name: str, num_clients: int) -> None:
    with pytest.raises(DataError, match=rf"num_clients\b.*1\.\.1000.*\b{num_clients}\b"):
        split(name, num_clients, seed=0)


@pytest.mark.parametrize(
    "name,params",
    [
        ("dirichlet", {"alpha": 0.5}),
        ("n_class", {"k": 2}),
        ("iid", {"beta": 1.0}),
        ("n_class", {"classes_per_client": 0}),
    ],
)
def test_params_reject_unknown_keys_and_bad_values(name: str, params: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=next(iter(params))):
        PARTITIONERS.get(name).Params(**params)
