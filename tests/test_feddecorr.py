"""FedDecorr's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.client.sgd import LocalSgd
from tests.strategy_harness import images, info, mlp, spec, stream, train_one

pytestmark = pytest.mark.usefixtures("seeded")


def decorr_reference(z: np.ndarray) -> float:
    b, d = z.shape
    if b == 1:
        return 0.0
    z = z - z.mean(0)
    z = z / np.sqrt(1e-8 + z.var(0, ddof=1))
    m = z.T @ z
    off = [m[i, j] for i in range(d) for j in range(d) if i != j]
    return float(np.mean(np.square(off)) / b)


def test_feddecorr_regulariser_matches_the_reference() -> None:
    from fedsim.strategies.feddecorr import decorrelation_loss

    z = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 2.0], [3.0, 0.5, -0.5], [1.5, 1.5, 1.0], [-2.0, 0.0, 0.25]])
    expected = decorr_reference(z)
    assert expected > 0
    assert float(decorrelation_loss(torch.tensor(z))) == pytest.approx(expected, rel=1e-9)
    assert float(decorrelation_loss(torch.tensor(z[:1]))) == 0.0


def test_feddecorr_uses_the_features_entering_the_classifier() -> None:
    beta = 0.3
    spec_ = spec("feddecorr", beta=beta)
    inputs: list[torch.Tensor] = []
    given: list[tuple[torch.Tensor, float]] = []
    base = spec_.client()

    class Recording(type(base)):  # records what the loop hands the hook, and what it returns
        def extra_loss(self, model, x, features, logits, y):
            out = super().extra_loss(model, x, features, logits, y)
            given.append((features.detach().clone(), float(out.detach())))
            return out

    model = mlp("fn", in_shape=(1, 4, 4), classes=3, hidden=[6])  # FN normalises the classifier input
    model.classifier.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach().clone()))
    hooks = Recording(spec_.params)
    rinfo = info([3, 3, 2], steps=2)
    train_one(model, stream(images(8, (1, 4, 4)), torch.randint(0, 3, (8,)), 4),
                LocalSgd(model.parameters(), lr=0.1), hooks, rinfo)
    assert len(given) == len(inputs) == 2
    for (features, value), classifier_input in zip(given, inputs, strict=True):
        assert torch.equal(features, classifier_input)
        norms = classifier_input.norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(6)))  # after FN
        assert value == pytest.approx(beta * decorr_reference(classifier_input.double().numpy()), rel=1e-5)


