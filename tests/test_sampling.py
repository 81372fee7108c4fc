"""fedsim's own client sampling (fedsim.server.sampling): the stream every result was drawn from, at any size."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedsim.server.sampling import EVAL_STREAM, TRAIN_STREAM, ClientSampler


@pytest.mark.parametrize(("n", "k"), [(10, 3), (1_000, 100), (20_000, 100), (50_000, 5_000)])
def test_a_round_samples_the_clients_numpy_draws_from_the_list_of_every_partition(n: int, k: int) -> None:
    # the draw every recorded run made: a sample of the sorted list of partition ids; drawing from the range
    # directly (no list of a million ids) must give the same clients, or no result would replay
    sampler = ClientSampler(n, k, seed=3)
    for server_round in (1, 2, 7):
        listed = np.random.default_rng([3, server_round, TRAIN_STREAM]).choice(list(range(n)), size=k, replace=False)
        assert sampler.sample(server_round) == sorted(listed.tolist())


def test_every_client_when_a_round_takes_them_all() -> None:
    assert ClientSampler(5, 5, seed=0).sample(1) == [0, 1, 2, 3, 4]
    assert ClientSampler(5, 9, seed=0).sample(1) == [0, 1, 2, 3, 4]


def test_a_sample_is_distinct_sorted_in_range_and_its_own_per_round_and_stream() -> None:
    train, scored = ClientSampler(1_000_000, 100, seed=0), ClientSampler(1_000_000, 100, seed=0, stream=EVAL_STREAM)
    a, b, c = train.sample(1), train.sample(2), scored.sample(1)
    assert a == sorted(set(a)) and len(a) == 100 and 0 <= a[0] and a[-1] < 1_000_000
    assert a != b and a != c  # another round, another stream: other clients (a chance of 1e-4 of any overlap each)
    assert a == ClientSampler(1_000_000, 100, seed=0).sample(1)  # replayed: the same in any process


def test_a_draw_holds_what_it_samples_not_the_federation() -> None:
    # Floyd's method for a small sample of a large range: a permutation (or a list of ids) of a million clients
    # would allocate 8 MB and more per round; numpy reports its allocations to tracemalloc
    sampler = ClientSampler(1_000_000, 100, seed=0)
    sampler.sample(1)  # imports and caches outside the measurement
    tracemalloc.start()
    try:
        sampler.sample(2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
