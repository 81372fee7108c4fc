"""What a strategy's server half keeps and is checked for (strategies/server_half.py): its state as one ArrayRecord
of named slots, read back with every array's shape, dtype and bytes; a Flower strategy that would not configure every
node refused before round 1."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fedsim.errors import ConfigError
from fedsim.strategies.server_half import check_strategy, state_record, state_slots


def test_state_slots_read_back_every_array_as_it_was_a_scalar_buffers_included() -> None:
    slots = {
        "m_t": {
            "w": np.arange(6, dtype=np.float32).reshape(2, 3),
            "running_var": np.array(0.25, dtype=np.float32),  # a 0-d buffer's moment (ln_goldschmidt)
            "wt": np.asfortranarray(np.arange(6.0).reshape(2, 3)),  # a transposed weight's layout
        },
        "v_t": {"count": np.array(7, dtype=np.int64)},
        "empty": None,  # a slot not filled yet (before the first round)
    }
    back = state_slots(state_record(slots))
    assert back.keys() == {"m_t", "v_t"}
    for slot, arrays in back.items():
        for name, value in arrays.items():
            original = slots[slot][name]
            assert (value.shape, value.dtype) == (original.shape, original.dtype), (slot, name)
            assert np.array_equal(value, original), (slot, name)
            assert value.flags.writeable  # a copy the strategy may update in place


def test_a_flower_strategy_that_samples_or_waits_for_more_nodes_is_refused() -> None:
    check_strategy(FedAvg(min_available_nodes=1, min_train_nodes=1, min_evaluate_nodes=1), 4)
    with pytest.raises(ConfigError, match=r"^strategy: FedAvg has fraction_train=0\.5; .*set fraction_train: 1\.0$"):
        check_strategy(FedAvg(fraction_train=0.5), 4)
    with pytest.raises(ConfigError, match=r"waits for min_available_nodes=5 nodes .* train\.num_clients = 4"):
        check_strategy(FedAvg(min_available_nodes=5, min_train_nodes=1, min_evaluate_nodes=1), 4)
