"""The IID split (partitions/iid.py): every sample once, client sizes within one of each other, and the split being
the documented procedure (shuffle, cut into near-equal parts) with exact sizes, on synthetic labels of 10 classes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.test_partitions import FAST, SEEDS, TEST, TRAIN, assert_exact_cover, split


@FAST
@given(seed=SEEDS, num_clients=st.integers(1, 60))
def test_iid_assigns_every_sample_once_evenly(seed: int, num_clients: int) -> None:
    part = split("iid", num_clients, seed)
    assert_exact_cover(part.train, len(TRAIN))
    assert_exact_cover(part.test, len(TEST))
    for parts in (part.train, part.test):
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_iid_sizes_are_n_over_clients_the_first_parts_one_larger() -> None:
    part = split("iid", 7, seed=3)
    assert [len(p) for p in part.train] == [143] * 6 + [142]  # 1000 = 7 x 142 + 6
    assert [len(p) for p in part.test] == [29] * 4 + [28] * 3  # 200 = 7 x 28 + 4


def test_iid_is_a_permutation_of_train_then_one_of_test_cut_in_order() -> None:
    """docs/algorithms.md: the training indices permuted and cut into N parts, the test indices likewise with an
    independent permutation; drawn here from the same seed, train's first, and cut by hand (4 clients: 250, 50)."""
    rng = np.random.default_rng(11)
    train_perm, test_perm = rng.permutation(len(TRAIN)), rng.permutation(len(TEST))
    part = split("iid", 4, seed=11)
    for i in range(4):
        np.testing.assert_array_equal(part.train[i], np.sort(train_perm[250 * i : 250 * (i + 1)]))
        np.testing.assert_array_equal(part.test[i], np.sort(test_perm[50 * i : 50 * (i + 1)]))
        assert part.train[i].dtype == part.test[i].dtype == np.int64


def test_iid_more_clients_than_test_samples_leaves_the_last_without_test_samples() -> None:
    part = split("iid", len(TRAIN), seed=0)  # 1000 clients: one train sample each; 200 test samples
    assert [len(p) for p in part.train] == [1] * 1000
    assert [len(p) for p in part.test] == [1] * 200 + [0] * 800
    assert_exact_cover(part.train, len(TRAIN))
    assert_exact_cover(part.test[:200], len(TEST))
    assert all(p.dtype == np.int64 for p in part.test[200:])
