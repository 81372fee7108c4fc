"""ResNet-18 with a CIFAR stem and no built-in normalisation (LN-FL App. C.1)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedsim.models.base import MODELS, FedsimModel, act_norm
from fedsim.norms import Normaliser

_WIDTHS, _DEPTHS = (64, 128, 256, 512), (2, 2, 2, 2)


class BasicBlock(nn.Module):
    """conv3x3 -> act -> norm1 -> conv3x3 -> (+ shortcut) -> act -> norm2.

    The norm follows each activation, including the one after the residual add, so a
    normaliser's ``conv`` site sits where LN-FL inserts it. ``norm_sites: inner`` keeps only
    norm1, the site inside the residual branch (LN-FL Table 13: block(x) = ρ(x + A₂ n ρ A₁ x)).
    """

    def __init__(
        self, params: ResNet18.Params, act: nn.Module, normaliser: Normaliser, c_in: int, c_out: int, stride: int
    ) -> None:
        super().__init__()
        bias = params.bias
        self.act, self.norm_position = act, params.norm_position
        self.conv1 = normaliser.conv(c_in, c_out, 3, stride, 1, bias)
        self.norm1 = normaliser.make("conv", c_out)
        self.conv2 = normaliser.conv(c_out, c_out, 3, 1, 1, bias)
        self.norm2 = normaliser.make("conv", c_out) if params.norm_sites == "all" else nn.Identity()
        # 1x1 projection only when the shape changes (torchvision's option B), without a norm:
        # with norms after activations there is no activation on the shortcut to follow.
        self.shortcut = (
            normaliser.conv(c_in, c_out, 1, stride, 0, bias) if stride != 1 or c_in != c_out else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = act_norm(self.conv1(x), self.act, self.norm1, self.norm_position)
        return act_norm(self.conv2(out) + self.shortcut(x), self.act, self.norm2, self.norm_position)


@MODELS.register("resnet18")
class ResNet18(FedsimModel):
    """ResNet-18, CIFAR stem (conv3x3, stride 1, no maxpool), norm after each activation (LN-FL App. C.1)."""

    class Params(FedsimModel.Params):
        norm_sites: Literal["all", "inner"] = Field(
            "all",
            description="conv sites that get the normaliser: after every activation, or only inside each block's "
            "residual branch (LN-FL Table 13; the stem's and the post-addition sites are then Identity)",
        )

    params: Params

    def build(self, normaliser: Normaliser) -> None:
        bias = self.params.bias
        self.conv1 = normaliser.conv(self.in_shape[0], _WIDTHS[0], 3, 1, 1, bias)
        self.norm1 = normaliser.make("conv", _WIDTHS[0]) if self.params.norm_sites == "all" else nn.Identity()
        blocks: list[nn.Module] = []
        c_in = _WIDTHS[0]
        for stage, (width, depth) in enumerate(zip(_WIDTHS, _DEPTHS, strict=True)):
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(self.params, self.act, normaliser, c_in, width, stride))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = _WIDTHS[-1]
        self.feature_norm = normaliser.make("feature", self.feature_dim)
        self.classifier = normaliser.linear(self.feature_dim, self.num_classes, bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act_norm(self.conv1(x), self.norm1)
        x = self.pool(self.blocks(x)).flatten(1)
        return self.feature_norm(x)
