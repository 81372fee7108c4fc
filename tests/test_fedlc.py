"""FedLC's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import copy

import pytest
import torch
from flwr.app import RecordDict

from fedsim.client.sgd import LocalSgd
from tests.strategy_harness import images, info, mlp, spec, stream, train_one

pytestmark = pytest.mark.usefixtures("seeded")


def test_fedlc_calibrated_logits() -> None:
    tau = 0.7
    spec_ = spec("fedlc", tau=tau)
    hooks = spec_.client()
    model = mlp(classes=4)
    counts = [0, 1, 16, 81]
    hooks.begin_round(model, RecordDict(), RecordDict(), info(counts))
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]])
    out = hooks.adjust_logits(logits, info(counts))
    expected = logits.clone()
    expected[:, 1] -= tau * 1.0
    expected[:, 2] -= tau * 0.5  # 16^(-1/4)
    expected[:, 3] -= tau / 3  # 81^(-1/4)
    assert torch.isneginf(out[:, 0]).all()
    torch.testing.assert_close(out[:, 1:], expected[:, 1:])


def test_fedlc_one_class_client_has_zero_loss_and_learns_nothing() -> None:
    spec_ = spec("fedlc")
    hooks = spec_.client()
    model = mlp(classes=3)
    start = copy.deepcopy(model.state_dict())
    y = torch.full((6,), 2)
    rinfo = info([0, 0, 6], lr=0.5, steps=3)
    hooks.begin_round(model, RecordDict(), RecordDict(), rinfo)
    result = train_one(model, stream(images(6), y, 3), LocalSgd(model.parameters(), lr=0.5), hooks, rinfo)
    assert result.steps == 3 and result.mean_loss == 0.0
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, start[k]), k


