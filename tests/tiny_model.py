"""The tiny model of the strategy-maths tests: logits = W·x (+ b) on 2 inputs, and a running mean of the inputs as
a buffer (like BN's), so a strategy's treatment of parameters and buffers both show. It follows the model contract
the training loop uses (``forward_features``, ``project``, ``classifier``) without a FedsimModel's layers."""

from __future__ import annotations

import torch
from torch import nn


class TinyLinear(nn.Module):
    def __init__(self, classes: int, bias: bool) -> None:
        super().__init__()
        self.classifier = nn.Linear(2, classes, bias=bias)
        self.register_buffer("running", torch.zeros(2, dtype=torch.get_default_dtype()))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        if self.training:
            with torch.no_grad():
                self.running.mul_(0.5).add_(0.5 * x.mean(0))
        return x

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return z  # no projection head

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(z)
