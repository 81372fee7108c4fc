"""FedYogi's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedYogi

from fedsim.arrays import to_array_record
from fedsim.engines.local import LocalGrid
from tests.strategy_harness import Clients, numpy_of, play_round, reply, server, spec

pytestmark = pytest.mark.usefixtures("seeded")


YOGI_KEYS = {"w": (3, 2), "b": (4,), "stat": (3,)}  # "stat" is a buffer (not a parameter)


def yogi_replies(server_round: int, pid: int) -> ArrayRecord:
    g = torch.Generator().manual_seed(100 * server_round + pid)
    tensors = {k: torch.randn(shape, generator=g) for k, shape in YOGI_KEYS.items()}
    tensors["count"] = torch.tensor(server_round * 10 + pid)  # an integer buffer, like num_batches_tracked
    return to_array_record(tensors)


def drive(strategy, rounds: int = 3) -> list[dict[str, np.ndarray]]:
    sizes = [5, 2, 9]
    grid = LocalGrid(Clients(lambda m, pid, s: reply(yogi_replies(r[0], pid), pid, sizes[pid]), 3))
    r = [0]
    arrays = yogi_replies(0, 7)
    out = []
    for server_round in range(1, rounds + 1):
        r[0] = server_round
        arrays = play_round(strategy, grid, server_round, arrays)
        out.append(numpy_of(arrays))
    return out


def test_fedyogi_with_flower_choices_equals_flowers_fedyogi() -> None:
    hp = {"eta": 0.05, "beta_1": 0.8, "beta_2": 0.95, "tau": 1e-2}
    ours = server("fedyogi", 3, {"w", "b"}, v0=0.0, scope="all", **hp)
    flower = FedYogi(**hp)
    for a, b in zip(drive(ours), drive(flower), strict=True):
        assert set(a) == set(b)
        for k in a:  # Flower's float operations in Flower's order: the same bits
            np.testing.assert_array_equal(a[k], b[k])


def test_fedyogi_paper_choices_follow_the_formula() -> None:
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    params = spec("fedyogi", eta=eta).params  # defaults: v0 = tau², parameters only
    assert (params.beta_1, params.beta_2, params.tau) == (b1, b2, tau)
    strategy = server("fedyogi", 3, {"w", "b"}, eta=eta)
    got = drive(strategy)

    sizes = np.array([5, 2, 9]) / 16
    x = numpy_of(yogi_replies(0, 7))
    m = {k: np.zeros(YOGI_KEYS[k]) for k in ("w", "b")}
    v = {k: np.full(YOGI_KEYS[k], tau**2) for k in ("w", "b")}
    for server_round, result in enumerate(got, start=1):
        ys = [numpy_of(yogi_replies(server_round, pid)) for pid in range(3)]
        avg = {k: sum(s * y[k] for s, y in zip(sizes, ys, strict=True)) for k in x}
        for k in ("w", "b"):
            delta = avg[k] - x[k]
            m[k] = b1 * m[k] + (1 - b1) * delta
            v[k] = v[k] - (1 - b2) * delta**2 * np.sign(v[k] - delta**2)
            x[k] = x[k] + eta * m[k] / (np.sqrt(v[k]) + tau)
        x["stat"], x["count"] = avg["stat"], avg["count"]  # buffers: plain weighted average
        for k in x:
            np.testing.assert_allclose(result[k], x[k], rtol=1e-4, atol=1e-6)
    state = numpy_of(strategy.server_state())
    assert set(state) == {"m_t/w", "m_t/b", "v_t/w", "v_t/b"}
    np.testing.assert_allclose(state["v_t/w"], v["w"], rtol=1e-4)
    np.testing.assert_allclose(state["m_t/b"], m["b"], rtol=1e-4, atol=1e-8)
    fresh = server("fedyogi", 3, {"w", "b"}, eta=eta)
    fresh.load_server_state(strategy.server_state())
    assert {k: v.tolist() for k, v in numpy_of(fresh.server_state()).items()} == {
        k: v.tolist() for k, v in state.items()}


