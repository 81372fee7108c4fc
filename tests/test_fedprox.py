"""FedProx's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, RecordDict

from fedsim import wire
from fedsim.client.sgd import LocalSgd
from fedsim.strategies.fedprox import PROXIMAL_MU
from tests.strategy_harness import images, info, mlp, spec, stream, train_one

pytestmark = pytest.mark.usefixtures("seeded")


def test_fedprox_gradient_is_grad_f_plus_mu_w_minus_x_on_parameters_only() -> None:
    mu, lr = 0.5, 0.1
    model = mlp("bn")  # BatchNorm brings buffers, which the proximal term must ignore
    spec_ = spec("fedprox", mu=mu)
    hooks = spec_.client()
    x = {k: v.clone() for k, v in model.state_dict().items()}
    content = RecordDict({wire.CONFIG: ConfigRecord({PROXIMAL_MU: mu})})
    hooks.begin_round(model, content, RecordDict(), info([1, 1, 1], lr))
    with torch.no_grad():  # local weights w != x, buffers moved far away too
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for b in model.buffers():
            if b.is_floating_point():
                b.add_(5.0)
    w = {k: v.clone() for k, v in model.state_dict().items()}
    param_names = {n for n, _ in model.named_parameters()}

    prox = hooks.extra_loss(model, torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
    expected = 0.5 * mu * sum(float(((w[n] - x[n]).double() ** 2).sum()) for n in param_names)
    assert float(prox.detach()) == pytest.approx(expected, rel=1e-6)
    assert expected > 0

    data_x, data_y = images(6), torch.tensor([0, 1, 2, 0, 1, 2])
    # grad f(w) on a copy with plain cross-entropy on the same (whole-client) batch
    plain = copy.deepcopy(model)
    plain.train()
    F.cross_entropy(plain(data_x.float() / 255), data_y).backward()
    grad_f = {n: p.grad.clone() for n, p in plain.named_parameters()}

    opt = LocalSgd(model.parameters(), lr=lr)
    train_one(model, stream(data_x, data_y), opt, hooks, info([2, 2, 2], lr))
    for n, p in model.named_parameters():
        expected_grad = grad_f[n] + mu * (w[n] - x[n])
        torch.testing.assert_close(p.detach(), w[n] - lr * expected_grad, rtol=1e-5, atol=1e-6)


