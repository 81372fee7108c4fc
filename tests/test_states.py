"""The nodes a worker serves (fedsim.engines.states): a Context only for a node being served or holding state in
memory, states beyond the budget on disk, so a million-client federation holds what its rounds touch."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from fedsim.engines.local import node_states, partition_of_node_id
from fedsim.engines.states import state_bytes


def give_state(states, node: int, value: float) -> None:  # type: ignore[no-untyped-def]
    states.context(node).state["c"] = ArrayRecord({"c": Array(np.full(1000, value, dtype=np.float32))})


def test_a_million_nodes_are_a_range_and_no_context_is_made_before_a_node_is_served() -> None:
    states = node_states(1, range(1_000_000), 1_000_000, memory_mb=1)
    assert states.node_ids() == range(1, 1_000_001) and states.contexts == {}
    with states.serving([7, 999_999]):
        assert sorted(states.contexts) == [7, 999_999]
        assert partition_of_node_id(7) == 6 == states.contexts[7].node_config["partition-id"]
    assert states.contexts == {}  # nothing to keep: their contexts went, made again when served again


def test_a_node_with_state_keeps_it_in_memory_within_the_budget_and_on_disk_beyond() -> None:
    one = 4000 + 128  # 1,000 float32 and the .npy header Flower's Array keeps them with
    states = node_states(1, range(100), 100, memory_mb=2.5 * one / 2**20)  # room for two states
    try:
        for node in (1, 2, 3):
            with states.serving([node]):
                give_state(states, node, node)
        # nodes 2 and 3 in memory; node 1, the least recently used, on disk with no Context held
        assert sorted(states.contexts) == [2, 3] and states.spilled == {1}
        assert sum(state_bytes(c) for c in states.contexts.values()) == 2 * one
        with states.serving([1]):
            restored = states.contexts[1].state["c"]["c"].numpy()  # type: ignore[index]
        np.testing.assert_array_equal(restored, np.full(1000, 1.0, dtype=np.float32))
        assert states.spilled == {2} and sorted(states.contexts) == [1, 3]
    finally:
        states.close()


def test_an_adopted_node_is_served_from_then_on() -> None:
    states = node_states(1, [0, 2], 4, memory_mb=1)
    assert sorted(states.node_ids()) == [1, 3]
    states.adopt([2])
    assert sorted(states.node_ids()) == [1, 2, 3]
