"""The LN-FL normalisers: none, ln, fn, gn, bn (Zhang et al., TMLR 2024; Tables 3, 4, 6, 7)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms.base import NORMS, Eps, Normaliser, Site


@NORMS.register("none")
class NoNorm(Normaliser):
    """Identity at every site: the un-normalised "vanilla" baseline (LN-FL Table 3)."""

    def make(self, site: Site, num_features: int) -> nn.Module:
        return nn.Identity()


@NORMS.register("ln")
class LN(Normaliser):
    """Layer norm: per-sample mean-variance over all of (C,H,W) or D at conv/linear sites (LN-FL eq. 3).

    Conv sites use ``GroupNorm(1, C)``, not torch ``LayerNorm`` over C only (LN-FL Table 7);
    γ, β are per channel. ``affine: false`` is LN-FL's "static" variant (Table 6). Identity at
    the feature site: the last hidden linear site already normalises that feature.
    """

    class Params(Normaliser.Params):
        affine: bool = True
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        p = self.params
        if site == "conv":
            return nn.GroupNorm(1, num_features, eps=p.eps, affine=p.affine)
        if site == "linear":
            return nn.LayerNorm(num_features, eps=p.eps, elementwise_affine=p.affine, bias=p.affine)
        return nn.Identity()


class FeatureNorm(nn.Module):
    """n(x) = √d · x / max(ε, ‖x‖₂) per sample over all non-batch dims (LN-FL eq. 6–7)."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps  # a plain float, not a buffer: FedAvg must not average config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        # Norm in float32 at least: half-precision sums of squares overflow at d ~ 512.
        norm = torch.linalg.vector_norm(flat.to(torch.promote_types(x.dtype, torch.float32)), dim=1)
        # max(ε, ‖x‖) keeps the gradient finite at x = 0 (the clamp's gradient is 0 there).
        scale = math.sqrt(flat.shape[1]) / norm.clamp(min=self.eps)
        return x * scale.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


@NORMS.register("fn")
class FN(Normaliser):
    """Feature norm: √d·x / max(ε, ‖x‖) on the classifier's input only (LN-FL eq. 6–7; on the projection
    head's input when the model has one).

    Identity at conv and linear sites; by LN-FL Prop. 1 this equals scale-normalising every
    layer of a bias-free ReLU network. ``inside`` puts a normaliser at the conv and linear sites
    too, LN-FL Table 13's "FedFN - n_MV inside" (``ln``) and "FedFN - n inside" (``scale``, the
    feature norm's own n); with ResNet-18's ``norm_sites: inner`` those are the blocks' inner sites.
    """

    class Params(Normaliser.Params):
        eps: Eps = 1e-5
        inside: Literal["none", "ln", "scale"] = Field(
            "none", description="the normaliser at conv and linear sites (LN-FL Table 13): none, ln or scale"
        )

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        p = self.params
        if site == "feature" or p.inside == "scale":
            return FeatureNorm(p.eps)
        if p.inside == "ln":
            return LN(LN.Params(eps=p.eps)).make(site, num_features)
        return nn.Identity()


@NORMS.register("gn")
class GN(Normaliser):
    """Group norm with ``groups`` groups (default 2) at conv and hidden linear sites (LN-FL Table 4).

    On N x D linear features GroupNorm splits D into ``groups`` contiguous groups. Identity at
    the feature site.
    """

    class Params(Normaliser.Params):
        groups: int = Field(2, ge=1)
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        if site == "feature":
            return nn.Identity()
        if num_features % self.params.groups:
            raise ConfigError(
                f"model.norm.groups = {self.params.groups} for norm 'gn' does not divide the "
                f"{num_features} features of a {site} site"
            )
        return nn.GroupNorm(self.params.groups, num_features, eps=self.params.eps)


@NORMS.register("bn")
class BN(Normaliser):
    """Batch norm at conv and hidden linear sites; FedAvg averages its running stats (LN-FL Table 4).

    The FedBN *strategy* keeps these modules local (it finds them with ``is_norm_module``).
    Identity at the feature site. ``momentum: null`` is torch's cumulative average.
    """

    class Params(Normaliser.Params):
        momentum: float | None = Field(0.1, ge=0, le=1)
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        p = self.params
        if site == "conv":
            return nn.BatchNorm2d(num_features, eps=p.eps, momentum=p.momentum)
        if site == "linear":
            return nn.BatchNorm1d(num_features, eps=p.eps, momentum=p.momentum)
        return nn.Identity()
