"""Scoring a model on labelled images (fedsim/models/evaluation.py), against numpy written here: the summed loss,
the per-class correct counts and totals, and the per-class feature statistics CCVR's clients send."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.models.evaluation import FORWARD_CHUNK, class_feature_stats, evaluate
from tests.tiny_model import TinyLinear

CLASSES = 4


def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, 1, 2), dtype=torch.uint8, generator=g), torch.randint(0, 3, (n,), generator=g)


def to_inputs(x: torch.Tensor) -> torch.Tensor:
    return x.float() / 255 - 0.5


class Scored(TinyLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.forward_features(x))


def model() -> Scored:
    torch.manual_seed(0)
    net = Scored(CLASSES, bias=True)
    net.train()  # evaluation puts it in eval mode: its buffer must not move
    return net


@pytest.mark.parametrize("batch_size", [1, 7, 500])
def test_loss_sum_and_per_class_counts_are_numpys(batch_size: int) -> None:
    n = 2 * FORWARD_CHUNK + 13  # several forward chunks
    x, y = images(n, 1)
    net = model()
    running = net.running.clone()
    loss, correct, totals = evaluate(net, x, y, batch_size, CLASSES, to_inputs)
    w, b = net.classifier.weight.detach().double().numpy(), net.classifier.bias.detach().double().numpy()
    logits = to_inputs(x).flatten(1).double().numpy() @ w.T + b
    top = logits.max(1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
    labels = y.numpy()
    assert loss == pytest.approx(-log_softmax[np.arange(n), labels].sum(), rel=1e-5)
    hit = logits.argmax(1) == labels
    assert correct.tolist() == [int(hit[labels == c].sum()) for c in range(CLASSES)]
    assert totals.tolist() == [int((labels == c).sum()) for c in range(CLASSES)]  # class 3 absent: 0
    assert not net.training and torch.equal(net.running, running)


def test_class_feature_stats_are_each_classs_count_mean_and_unbiased_covariance() -> None:
    x, y = images(3 * FORWARD_CHUNK + 5, 2)
    y[0] = 3  # class 3 has one sample: covariance 0
    counts, means, covariances = class_feature_stats(model(), x, y, CLASSES + 1, to_inputs)
    z = to_inputs(x).flatten(1).double().numpy()  # TinyLinear's features are its inputs
    labels = y.numpy()
    assert counts.tolist() == [int((labels == c).sum()) for c in range(CLASSES + 1)]
    for c in range(3):
        zc = z[labels == c]
        np.testing.assert_allclose(means[c].numpy(), zc.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(covariances[c].numpy(), np.cov(zc.T), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(means[3].numpy(), z[labels == 3][0])
    assert not covariances[3].any()
    assert not means[4].any() and not covariances[4].any()  # a class without samples
    assert means.dtype == covariances.dtype == torch.float64


def test_a_client_without_samples_has_counts_and_no_feature_width() -> None:
    x, y = images(0, 3)
    counts, means, covariances = class_feature_stats(model(), x, y, CLASSES, to_inputs)
    assert counts.tolist() == [0] * CLASSES and means.shape == (CLASSES, 0) and covariances.shape == (CLASSES, 0, 0)
