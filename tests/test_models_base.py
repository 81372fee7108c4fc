"""The model contract (fedsim/models/base.py): ``norm_position`` (the site's norm after or before the
activation) and MOON's projection head between the features and the classifier."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.model_support import CIFAR, build, n_params

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


@pytest.mark.parametrize(("position", "sees_negatives"), [("after", False), ("before", True)])
def test_norm_position(position: str, sees_negatives: bool) -> None:
    model = build("cnn", "ln", norm_position=position)
    seen: list[torch.Tensor] = []
    model.norm1.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    model(torch.randn(4, *CIFAR))
    assert bool((seen[0] < 0).any()) is sees_negatives  # after ReLU the norm sees no negatives


@pytest.mark.parametrize("model_name", ["cnn", "resnet18"])
def test_the_projection_head_sits_between_the_features_and_the_classifier(model_name: str) -> None:
    # MOON Sec. 3.2: base encoder -> projection head (d -> d -> ReLU ... -> width) -> output layer on the head
    plain, projected = build(model_name, "ln"), build(model_name, "ln", projection=32)
    d = plain.feature_dim
    assert plain.projector is None and projected.feature_dim == d
    l1, act, l2 = projected.projector  # type: ignore[misc]
    assert (l1.in_features, l1.out_features, l2.in_features, l2.out_features) == (d, d, d, 32)
    assert isinstance(act, nn.ReLU) and projected.classifier.in_features == 32  # type: ignore[union-attr]
    assert n_params(projected) - n_params(plain) == d * d + d * 32 + 32 * 10 - d * 10  # no biases by default
    x = torch.randn(3, *CIFAR)
    h = projected.forward_features(x)
    assert h.shape == (3, d)
    torch.testing.assert_close(projected(x), projected.classifier(l2(F.relu(l1(h)))))
