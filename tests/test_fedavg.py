"""FedAvg (McMahan et al., AISTATS 2017) against its algorithm written here: each client takes K steps of SGD
(``torch.optim.SGD``, momentum and weight decay on) from the global model; the server's new model is Σ n_i/n of every
tensor the clients send, parameters and buffers alike, computed in float64. fedsim's clients train through the one
training loop with FedAvg's hooks, its server half through tests/strategy_harness.py (fedsim's ``LocalGrid``)."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Message, RecordDict

from fedsim.arrays import to_array_record
from fedsim.data.batches import BatchStream
from fedsim.engines.local import LocalGrid
from fedsim.strategies.hooks import RoundInfo
from tests.strategy_harness import Clients, client_round, numpy_of, play_round, reply, server, spec
from tests.tiny_model import TinyLinear

LR, MOMENTUM, WD, STEPS, BATCH = 0.2, 0.9, 0.01, 3, 4
SIZES = {0: 12, 1: 8, 2: 4}  # unequal n_i: the weights show


def stream(pid: int, server_round: int) -> BatchStream:
    g = torch.Generator().manual_seed(100 + pid)
    x, y = torch.randn(SIZES[pid], 1, 1, 2, generator=g) * 2, torch.randint(0, 3, (SIZES[pid],), generator=g)
    return BatchStream(x, y, BATCH, torch.Generator().manual_seed(10 * server_round + pid))


def reference_round(
    net: TinyLinear, weights: dict[str, torch.Tensor], server_round: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The new global model (Σ n_i/n), and the clients' unweighted mean beside it."""
    trained = {}
    for pid in SIZES:
        w = copy.deepcopy(net)
        w.load_state_dict(weights)
        w.train()
        sgd = torch.optim.SGD(w.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
        for x, y in stream(pid, server_round).batches(STEPS):
            sgd.zero_grad()
            F.cross_entropy(w.classifier(w.forward_features(x)), y).backward()
            sgd.step()
        trained[pid] = {k: v.detach().double().numpy() for k, v in w.state_dict().items()}
    n = sum(SIZES.values())
    weighted = {k: sum(SIZES[pid] / n * trained[pid][k] for pid in SIZES) for k in weights}
    return weighted, {k: sum(trained[pid][k] for pid in SIZES) / len(SIZES) for k in weights}


def fedsim_round(net: TinyLinear, weights: dict[str, torch.Tensor], server_round: int) -> dict[str, np.ndarray]:
    hooks = spec("fedavg").client()

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        info = RoundInfo(server_round, pid, STEPS, None, LR, MOMENTUM, torch.ones(3))
        sent, extra = client_round(net, hooks, msg, state, info, stream(pid, server_round), WD)
        assert set(sent) == set(weights)  # every tensor, buffers included
        return reply(sent, pid, SIZES[pid], extra)

    strategy = server("fedavg", len(SIZES), {k for k, _ in net.named_parameters()})
    grid = LocalGrid(Clients(client, len(SIZES)))
    return numpy_of(play_round(strategy, grid, server_round, to_array_record(weights)))


def test_two_rounds_are_the_sample_weighted_average_of_the_clients_sgd() -> None:
    torch.manual_seed(0)
    net = TinyLinear(3, bias=True)
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    for server_round in (1, 2):
        (expected, uniform), got = reference_round(net, weights, server_round), fedsim_round(net, weights, server_round)
        assert got.keys() == expected.keys() == {"classifier.weight", "classifier.bias", "running"}
        for k in expected:
            # float32 weighted sums of three float32 terms against float64: a few ulps of values of order 1
            np.testing.assert_allclose(got[k], expected[k], rtol=1e-6, atol=1e-6, err_msg=k)
        # the model moved, the buffer too, and the n_i/n weights matter: an unweighted mean is far from it
        assert all(np.abs(got[k] - weights[k].double().numpy()).max() > 1e-2 for k in got)
        assert max(np.abs(got[k] - uniform[k]).max() for k in got) > 1e-3
        weights = {k: torch.from_numpy(v).float() for k, v in got.items()}
