"""FedBN's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.engines.local import LocalGrid
from tests.strategy_harness import (
    Clients,
    images,
    info,
    mlp,
    numpy_of,
    play_round,
    reply,
    server,
    spec,
    stream,
    train_one,
)

pytestmark = pytest.mark.usefixtures("seeded")


def bn_keys(model: nn.Module) -> set[str]:
    """Independently of fedsim: every state-dict key of a torch BatchNorm module."""
    return {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, _BatchNorm) for k in m.state_dict()}


def test_fedbn_client_keeps_bn_weights_and_statistics() -> None:
    spec_ = spec("fedbn")
    hooks = spec_.client()
    model = mlp("bn")
    local = bn_keys(model)
    assert {k.rsplit(".", 1)[1] for k in local} >= {"weight", "bias", "running_mean", "running_var"}
    state = RecordDict()
    global_arrays = to_array_record(model.state_dict())
    rinfo = info([3, 3, 2])
    hooks.load_global(model, global_arrays, state)
    hooks.begin_round(model, RecordDict(), state, rinfo)
    train_one(model, stream(images(8), torch.randint(0, 3, (8,)), 4), LocalSgd(model.parameters(), lr=0.1),
                hooks, rinfo)
    hooks.end_round(model, state, rinfo, 1)
    sent = hooks.reply_arrays(model, state)
    assert set(sent) == set(model.state_dict()) - local  # never leave the client
    mine = {k: v.clone() for k, v in model.state_dict().items() if k in local}
    assert not torch.equal(mine[next(k for k in local if k.endswith("running_mean"))], torch.zeros(4))

    with torch.no_grad():  # another client trains on the shared model object meanwhile
        for k in local:
            model.state_dict()[k].fill_(-3)
    # the server sends garbage for every tensor: BN comes back as the client's own, the rest as sent
    garbage = to_array_record({k: torch.full_like(v, 7) for k, v in model.state_dict().items()})
    hooks.load_global(model, garbage, state)
    for k, v in model.state_dict().items():
        assert torch.equal(v, mine[k]) if k in local else bool((v == 7).all()), k


def test_fedbn_server_keeps_its_own_bn_tensors() -> None:
    model = mlp("bn")
    local = bn_keys(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = server("fedbn", 2, {n for n, _ in model.named_parameters()})
    sizes = [1, 3]

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        sent = {k: torch.full_like(v, pid + 1.0) for k, v in start.items() if k not in local}
        return reply(to_array_record(sent), pid, sizes[pid])

    grid = LocalGrid(Clients(client, 2))
    arrays = to_array_record(start)
    for server_round in (1, 2):
        arrays = play_round(strategy, grid, server_round, arrays)
    got = numpy_of(arrays)
    assert list(got) == list(start)
    for k, v in got.items():
        expected = start[k].double().numpy() if k in local else np.full(v.shape, (1 * 1 + 3 * 2) / 4)
        np.testing.assert_allclose(v, expected, rtol=1e-6)
