"""FedRS's mathematics on tiny deterministic problems, against values computed here (numpy, or plain
torch autograd on a copy of the model), never by calling the strategy code under test; servers driven
through tests/strategy_harness.py."""

from __future__ import annotations

import pytest
import torch
from flwr.app import RecordDict

from tests.strategy_harness import info, mlp, spec

pytestmark = pytest.mark.usefixtures("seeded")


def test_fedrs_binary_scales_only_absent_classes() -> None:
    alpha = 0.3
    spec_ = spec("fedrs", alpha=alpha)
    hooks = spec_.client()
    counts = [4, 0, 2, 0]
    hooks.begin_round(mlp(classes=4, bias=True), RecordDict(), RecordDict(), info(counts))
    logits = torch.tensor([[1.0, 2.0, -3.0, 4.0], [0.5, -1.5, 2.5, 0.25]])
    out = hooks.adjust_logits(logits, info(counts))
    expected = torch.stack([logits[:, 0], alpha * logits[:, 1], logits[:, 2], alpha * logits[:, 3]], 1)
    torch.testing.assert_close(out, expected)


def test_fedrs_soft_follows_the_authors_form() -> None:
    alpha = 0.4
    spec_ = spec("fedrs", alpha=alpha, mode="soft")
    hooks = spec_.client()
    counts = [8, 0, 2, 6]
    model = mlp(classes=4, bias=True)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    hooks.begin_round(model, RecordDict(), RecordDict(), info(counts))
    z = torch.randn(5, model.feature_dim)
    out = hooks.adjust_logits(model.forward_head(z), info(counts))
    # FedRS code: logits = cdist * (h @ W^T), cdist = alpha + (1 - alpha) * n / n.max(), no bias
    cdist = torch.tensor([alpha + (1 - alpha) * n / 8 for n in counts])
    expected = cdist * (z @ model.classifier.weight.T)
    torch.testing.assert_close(out, expected)


