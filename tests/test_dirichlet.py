"""The Dirichlet label skew (partitions/dirichlet.py): every sample once, β from IID to concentrated, the test
split in the train split's proportions, min_size and balance, on synthetic labels of 10 classes; β > 0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fedsim.errors import DataError
from fedsim.partitions import PARTITIONERS, class_counts
from fedsim.partitions.dirichlet import MAX_TRIES
from tests.test_partitions import FAST, SEEDS, TEST, TRAIN, C, assert_exact_cover, mean_max_class_share, split


@FAST
@given(seed=SEEDS, num_clients=st.integers(1, 60), beta=st.floats(0.01, 100.0), balance=st.booleans())
def test_dirichlet_assigns_every_sample_once(seed: int, num_clients: int, beta: float, balance: bool) -> None:
    part = split("dirichlet", num_clients, seed, beta=beta, balance=balance)
    assert len(part.train) == len(part.test) == num_clients
    assert_exact_cover(part.train, len(TRAIN))
    assert_exact_cover(part.test, len(TEST))


def test_dirichlet_large_beta_approaches_iid_small_beta_concentrates() -> None:
    near_iid = split("dirichlet", 10, seed=0, beta=1e4)
    props = class_counts(TRAIN, near_iid.train, C) / np.array([[len(t)] for t in near_iid.train])
    assert np.abs(props - 1 / C).max() < 0.03
    assert mean_max_class_share(near_iid) < 0.15
    # Averaged over seeds: one draw at beta=0.05 can land anywhere in roughly 0.5..0.8.
    skewed = np.mean([mean_max_class_share(split("dirichlet", 10, seed=s, beta=0.05)) for s in range(10)])
    assert skewed > 0.6


@FAST
@given(seed=SEEDS, num_clients=st.integers(1, 30), beta=st.floats(0.05, 10.0))
def test_dirichlet_test_split_follows_train_proportions(seed: int, num_clients: int, beta: float) -> None:
    part = split("dirichlet", num_clients, seed, beta=beta)
    train_counts = class_counts(TRAIN, part.train, C)
    test_counts = class_counts(TEST, part.test, C)
    expected = train_counts * (20 / 100)  # m_k / n_k: each client gets its train share of class k
    assert np.abs(test_counts - expected).max() < 1  # floor-cumsum cuts move a count by less than 1


def test_dirichlet_min_size_honoured() -> None:
    plain = [min(len(t) for t in split("dirichlet", 10, s, beta=0.5).train) for s in range(5)]
    assert min(plain) < 60  # so the option below has something to do
    for s in range(5):
        part = split("dirichlet", 10, s, beta=0.5, min_size=60)
        assert min(len(t) for t in part.train) >= 60
        assert_exact_cover(part.train, len(TRAIN))


def test_dirichlet_impossible_min_size_raises() -> None:
    with pytest.raises(DataError, match=r"min_size=101.*num_clients=10.*beta=0\.5"):
        split("dirichlet", 10, seed=0, min_size=101)  # 10 x 101 > 1000 samples: fails before drawing
    with pytest.raises(
        DataError, match=r"min_size=95.*max_tries=5\b.*beta=0\.05.*max_tries.*10,000"
    ):
        split("dirichlet", 10, seed=0, beta=0.05, min_size=95, max_tries=5)


@pytest.mark.slow
def test_dirichlet_min_size_at_the_bound_on_max_tries_advises_no_more_tries() -> None:
    """At the bound on max_tries (10,000 draws) the advice no longer says to raise it."""
    with pytest.raises(DataError, match=r"max_tries=10000 tries.*100 train samples per client.*lower min_size$"):
        split("dirichlet", 10, seed=0, beta=0.05, min_size=95, max_tries=MAX_TRIES)


def test_dirichlet_balance_caps_client_size() -> None:
    # NIID-Bench's mask: a client stops receiving classes once at N_total/N = 100, so it can
    # overshoot by at most one class (100 samples). Without the mask seed 1 exceeds that bound.
    assert max(len(t) for t in split("dirichlet", 10, 1, beta=0.1).train) > 200
    for s in range(10):
        assert max(len(t) for t in split("dirichlet", 10, s, beta=0.1, balance=True).train) <= 200


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_params_reject_nonpositive_beta(beta: float) -> None:
    with pytest.raises(ValidationError, match="beta"):
        PARTITIONERS.get("dirichlet").Params(beta=beta)
