"""Flower's server optimisers as fedsim registers them (strategies/server_opt.py): FedAdam, FedAdagrad and FedAvgM
give Flower's own numbers bit for bit, and a server half rebuilt from its saved state (a resume) continues as the
uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM

from fedsim.engines.local import LocalGrid
from tests.strategy_harness import Clients, numpy_of, play_round, reply, server
from tests.test_fedyogi import drive, yogi_replies
from tests.test_resume import check_resume

SIZES = [5, 2, 9]
CASES = [
    ("fedadam", FedAdam, {"eta": 0.05, "beta_1": 0.8, "beta_2": 0.95, "tau": 1e-2}),
    ("fedadagrad", FedAdagrad, {"eta": 0.05, "tau": 1e-2}),
    ("fedavgm", FedAvgM, {"server_learning_rate": 0.7, "server_momentum": 0.9}),
]


@pytest.mark.parametrize(("name", "flower", "options"), CASES, ids=[c[0] for c in CASES])
def test_each_is_flowers_own_bit_for_bit(name: str, flower: type, options: dict[str, Any]) -> None:
    ours, theirs = drive(server(name, 3, {"w", "b"}, **options)), drive(flower(**options))
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert any(not np.array_equal(ours[-1][k], ours[0][k]) for k in ours[0])  # it moved


def rounds(strategy, first: int, last: int, arrays):  # type: ignore[no-untyped-def]
    """Rounds ``first`` to ``last``, each client replying with that round's tensors."""
    for server_round in range(first, last + 1):
        grid = LocalGrid(Clients(lambda m, pid, s, r=server_round: reply(yogi_replies(r, pid), pid, SIZES[pid]), 3))
        arrays = play_round(strategy, grid, server_round, arrays)
    return arrays


@pytest.mark.parametrize(("name", "flower", "options"), CASES, ids=[c[0] for c in CASES])
def test_a_server_rebuilt_from_its_saved_state_continues_as_the_uninterrupted_one(
    name: str, flower: type, options: dict[str, Any]
) -> None:
    start = yogi_replies(0, 7)
    uninterrupted = numpy_of(rounds(server(name, 3, {"w", "b"}, **options), 1, 4, start))
    first = server(name, 3, {"w", "b"}, **options)
    at_two = rounds(first, 1, 2, start)
    resumed = server(name, 3, {"w", "b"}, **options)
    resumed.load_server_state(first.server_state())
    continued = numpy_of(rounds(resumed, 3, 4, at_two))
    for k in uninterrupted:
        np.testing.assert_array_equal(continued[k], uninterrupted[k], err_msg=k)
    state = numpy_of(first.server_state())  # what the checkpoint carries: moments (or momentum) that moved
    assert state and all(np.abs(v).max() > 0 for k, v in state.items() if k.endswith("/w")), state.keys()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [{"name": "fedadam"}, {"name": "fedyogi", "scope": "all"}])
def test_a_killed_run_whose_model_has_a_scalar_buffer_resumes_to_the_uninterrupted_one(
    tmp_path: Path, strategy: dict[str, str]
) -> None:
    # ln_goldschmidt's running_var is 0-d: its moments went through the checkpoint as 1-d, and the resumed
    # FedAdam's aggregate had a (1,) tensor where the model's is ()
    check_resume(tmp_path, stateful=False, model={"name": "mlp", "norm": "ln_goldschmidt", "hidden": [16]},
                 strategy=strategy)  # fmt: skip
