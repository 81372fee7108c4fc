"""The LN-FL CIFAR CNN (Zhang et al., TMLR 2024, Table 7 and App. C.1)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedsim.errors import ConfigError
from fedsim.models import MODELS, FedsimModel
from fedsim.norms import Normaliser

_WIDTH, _KERNEL = 64, 5


@MODELS.register("cnn")
class CNN(FedsimModel):
    """LN-FL CNN: two conv5x5(64)+maxpool stages, hidden fc layers, classifier (LN-FL Table 7).

    ``hidden`` defaults to [384, 192] as in the paper's released code; Table 7 lists only 384
    (``hidden: [384]``). Padding 0, so 32x32 inputs give 32->28->14->10->5 and a 1600-d flatten.
    """

    class Params(FedsimModel.Params):
        hidden: list[PositiveInt] = Field(default_factory=lambda: [384, 192])

    params: Params

    def __init__(
        self, num_classes: int, in_shape: tuple[int, int, int], norm: Normaliser, **args: Any
    ) -> None:
        super().__init__(num_classes, in_shape, norm, **args)
        p = self.params
        c, h, w = in_shape
        h, w = _spatial_out(h), _spatial_out(w)
        if h < 1 or w < 1:
            raise ConfigError(f"model 'cnn' needs inputs of at least 16x16 pixels, got {in_shape}")
        self.conv1 = norm.conv(c, _WIDTH, _KERNEL, bias=p.bias)
        self.norm1 = norm.norm("conv", _WIDTH)
        self.conv2 = norm.conv(_WIDTH, _WIDTH, _KERNEL, bias=p.bias)
        self.norm2 = norm.norm("conv", _WIDTH)
        self.pool = nn.MaxPool2d(2)
        dims = [_WIDTH * h * w, *p.hidden]
        self.fcs = nn.ModuleList(norm.linear(i, o, p.bias) for i, o in itertools.pairwise(dims))
        self.fc_norms = nn.ModuleList(norm.norm("linear", o) for o in dims[1:])
        self.feature_dim = dims[-1]
        self.feature_norm = norm.norm("feature", self.feature_dim)
        self.classifier = norm.linear(self.feature_dim, num_classes, p.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act_norm(self.conv1(x), self.norm1))
        x = self.pool(self.act_norm(self.conv2(x), self.norm2))
        x = x.flatten(1)
        for fc, fc_norm in zip(self.fcs, self.fc_norms, strict=True):
            x = self.act_norm(fc(x), fc_norm)
        return self.feature_norm(x)


def _spatial_out(size: int) -> int:
    """Side length after two (valid conv5x5, maxpool2) stages."""
    for _ in range(2):
        size = (size - _KERNEL + 1) // 2
    return size
