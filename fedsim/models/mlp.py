"""A bias-free multi-layer perceptron (the LN-FL setting without convolutions)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedsim.models import MODELS, FedsimModel
from fedsim.norms import Normaliser


@MODELS.register("mlp")
class MLP(FedsimModel):
    """MLP: flatten -> hidden (linear -> act -> norm) layers -> feature norm -> classifier."""

    class Params(FedsimModel.Params):
        hidden: list[PositiveInt] = Field(default_factory=lambda: [200, 200])

    params: Params

    def __init__(
        self, num_classes: int, in_shape: tuple[int, int, int], norm: Normaliser, **args: Any
    ) -> None:
        super().__init__(num_classes, in_shape, norm, **args)
        p = self.params
        dims = [math.prod(in_shape), *p.hidden]
        self.fcs = nn.ModuleList(norm.linear(i, o, p.bias) for i, o in itertools.pairwise(dims))
        self.fc_norms = nn.ModuleList(norm.norm("linear", o) for o in dims[1:])
        self.feature_dim = dims[-1]
        self.feature_norm = norm.norm("feature", self.feature_dim)
        self.classifier = norm.linear(self.feature_dim, num_classes, p.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for fc, fc_norm in zip(self.fcs, self.fc_norms, strict=True):
            x = self.act_norm(fc(x), fc_norm)
        return self.feature_norm(x)
