"""SCAFFOLD's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.engines.local import LocalGrid
from fedsim.server.sampling import ClientSampler
from fedsim.strategies.hooks import ClientHooks
from fedsim.strategies.scaffold import SCAFFOLD_C, SCAFFOLD_C_I, SCAFFOLD_DELTA_C
from tests.strategy_harness import (
    Clients,
    images,
    info,
    mlp,
    numpy_of,
    play_round,
    reply,
    server,
    softmax,
    spec,
    stream,
    train_one,
)
from tests.tiny_model import TinyLinear

pytestmark = pytest.mark.usefixtures("seeded")


def scaffold_reference(W, buf, X, Y, K, lr, c, c_i):
    """K full-batch steps of w <- w - lr (grad f - c_i + c) on mean cross-entropy, by hand."""
    onehot = np.eye(2)[Y]
    W0, W = W, W.copy()
    for _ in range(K):
        grad = (softmax(X @ W.T) - onehot).T @ X / len(X)
        W = W - lr * (grad - c_i + c)
        buf = 0.5 * buf + 0.5 * X.mean(0)
    c_plus = c_i - c + (W0 - W) / (K * lr)
    return W, buf, c_plus, c_plus - c_i


SCAFFOLD_DATA = {  # client -> (uint8 inputs N x 1 x 1 x 2, labels)
    0: (torch.tensor([[200, 10], [30, 250], [120, 90], [255, 0]], dtype=torch.uint8), [0, 1, 1, 0]),
    1: (torch.tensor([[5, 180], [240, 60]], dtype=torch.uint8), [1, 1]),
    2: (torch.tensor([[90, 90], [10, 20], [220, 230]], dtype=torch.uint8), [0, 1, 0]),
}


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_scaffold_two_rounds_match_the_hand_computation(weighting: str) -> None:
    K, lr, eta_g, N = 3, 0.5, 2.0, 3
    model = TinyLinear(2, bias=False)
    spec_ = spec("scaffold", eta_g=eta_g, weighting=weighting)
    hooks = spec_.client()
    seen: dict[int, dict[str, np.ndarray]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        x_u8, y = SCAFFOLD_DATA[pid]
        x_u8, y = x_u8.view(-1, 1, 1, 2), torch.tensor(y)
        rinfo = info([int((y == k).sum()) for k in range(2)], lr, K, pid)
        hooks.load_global(model, msg.content[wire.ARRAYS], state)
        hooks.begin_round(model, msg.content, state, rinfo)
        result = train_one(model, stream(x_u8, y), LocalSgd(model.parameters(), lr=lr), hooks, rinfo)
        extra = hooks.end_round(model, state, rinfo, result.steps)
        out = hooks.reply_arrays(model, state)
        seen[pid] = {
            "y": numpy_of(out)["classifier.weight"],
            "delta_c": numpy_of(extra[SCAFFOLD_DELTA_C])["classifier.weight"],
            "c_i": numpy_of(state[SCAFFOLD_C_I])["classifier.weight"],
        }
        return reply(out, pid, len(y), extra)

    clients = Clients(client, N)
    grid = LocalGrid(clients)
    strategy = server("scaffold", N, {"classifier.weight"}, eta_g=eta_g, weighting=weighting)
    sampler = ClientSampler(N, 2, seed=0)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor([[0.3, -0.2], [-0.1, 0.4]]))
    arrays = to_array_record(model.state_dict())

    W, buf = numpy_of(arrays)["classifier.weight"], np.zeros(2)
    c, c_i = np.zeros((2, 2)), {p: np.zeros((2, 2)) for p in range(N)}  # c_i starts at zero
    for server_round in (1, 2):
        seen.clear()
        arrays = play_round(strategy, grid, server_round, arrays, sampler)
        sampled = sampler.sample(server_round)
        assert sorted(seen) == sampled and len(sampled) == 2
        ys, bufs, deltas, weights = [], [], [], []
        for pid in sampled:
            x_u8, y = SCAFFOLD_DATA[pid]
            X = x_u8.double().numpy() / 255
            y_i, buf_i, c_plus, delta = scaffold_reference(W, buf, X, np.array(y), K, lr, c, c_i[pid])
            np.testing.assert_allclose(seen[pid]["y"], y_i, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(seen[pid]["c_i"], c_plus, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(seen[pid]["delta_c"], delta, rtol=1e-5, atol=1e-6)
            c_i[pid] = c_plus
            ys.append(y_i)
            bufs.append(buf_i)
            deltas.append(delta)
            weights.append(len(y))
        w = np.array(weights) / sum(weights)
        u = w if weighting == "samples" else np.full(len(ys), 1 / len(ys))
        W = W + eta_g * sum(ui * (yi - W) for ui, yi in zip(u, ys, strict=True))
        buf = sum(wi * b for wi, b in zip(w, bufs, strict=True))  # FedAvg's average: no η_g, no correction
        c = c + (len(sampled) / N) * np.mean(deltas, axis=0)
        got = numpy_of(arrays)
        np.testing.assert_allclose(got["classifier.weight"], W, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["running"], buf, rtol=1e-6)
        np.testing.assert_allclose(numpy_of(strategy.server_state())["c/classifier.weight"], c, rtol=1e-5, atol=1e-7)
        assert not np.allclose(c, 0)
    # a checkpoint of the server state restores c
    fresh = server("scaffold", N, {"classifier.weight"}, eta_g=eta_g, weighting=weighting)
    fresh.load_server_state(strategy.server_state())
    np.testing.assert_array_equal(numpy_of(fresh.server_state())["c/classifier.weight"], numpy_of(
        strategy.server_state())["c/classifier.weight"])
    # round 2 reused the c_i each sampled client kept in its own state from round 1
    assert set(sampler.sample(1)) & set(sampler.sample(2))
    for pid in range(N):
        if pid in sampler.sample(1) or pid in sampler.sample(2):
            kept = numpy_of(clients.states[pid][SCAFFOLD_C_I])["classifier.weight"]
            np.testing.assert_allclose(kept, c_i[pid], rtol=1e-5, atol=1e-6)
        else:
            assert SCAFFOLD_C_I not in clients.states[pid]


def test_scaffold_with_zero_control_variates_steps_like_fedavg() -> None:
    model = mlp("bn")
    x_u8, y = images(8), torch.randint(0, 3, (8,))
    start = copy.deepcopy(model.state_dict())
    spec_ = spec("scaffold")
    scaffold = spec_.client()
    c_zero = to_array_record({n: torch.zeros_like(p) for n, p in model.named_parameters()})
    scaffold.begin_round(model, RecordDict({SCAFFOLD_C: c_zero}), RecordDict(), info([3, 3, 2]))
    train_one(model, stream(x_u8, y, 4), LocalSgd(model.parameters(), lr=0.1), scaffold, info([3, 3, 2]))
    after_scaffold = model.state_dict()

    fedavg = copy.deepcopy(model)
    fedavg.load_state_dict(start)
    plain = ClientHooks(None)
    train_one(fedavg, stream(x_u8, y, 4), LocalSgd(fedavg.parameters(), lr=0.1), plain, info([3, 3, 2]))
    for k, v in fedavg.state_dict().items():
        assert torch.equal(after_scaffold[k], v), k
    assert not torch.equal(after_scaffold["classifier.weight"], start["classifier.weight"])


def test_scaffold_control_variates_cover_parameters_not_buffers() -> None:
    model = mlp("bn")
    spec_ = spec("scaffold")
    hooks = spec_.client()
    c = to_array_record({n: torch.full_like(p, 0.01) for n, p in model.named_parameters()})
    state = RecordDict()
    rinfo = info([3, 3, 2], steps=2)
    hooks.begin_round(model, RecordDict({SCAFFOLD_C: c}), state, rinfo)
    train_one(model, stream(images(8), torch.randint(0, 3, (8,)), 4), LocalSgd(model.parameters(), lr=0.1),
                hooks, rinfo)
    extra = hooks.end_round(model, state, rinfo, 2)
    params = {n for n, _ in model.named_parameters()}
    buffers = {n for n, _ in model.named_buffers()}
    assert buffers  # running statistics exist ...
    assert set(extra[SCAFFOLD_DELTA_C]) == set(state[SCAFFOLD_C_I]) == params  # ... and are not covered


