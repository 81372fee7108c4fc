"""Layer-replacing normalisers l2, affine_like, patchnorm (AFFDIV eqs. 18, 19, 47, 48).

These normalise the *input* of each affine / conv layer and are built by the normaliser's
``linear()`` / ``conv()``; ``norm()`` is Identity at every site. The replacements subclass
``nn.Linear`` / ``nn.Conv2d``, so parameter names, shapes and counts match the plain layers and
FedAvg sees the same state dict. Input statistics are float32 at least and not detached: the
gradient through ‖x‖ is part of AFFDIV's eqs. 27-28.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.norms.base import NORMS, Eps, Normaliser, Site
from fedsim.norms.ln_variants import stats_dtype


def _sum_sq(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Σ x² over ``dims`` (keepdim) in float32 at least."""
    return x.to(stats_dtype(x)).square().sum(dims, keepdim=True)


class L2Linear(nn.Linear):
    """W·x/√(‖x‖² + ε) + b: L2-normalise the input, then the affine map (AFFDIV eq. 18, "norm-like")."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = x.to(stats_dtype(x)) * torch.rsqrt(_sum_sq(x, (-1,)) + self.eps)
        return F.linear(x_hat.to(x.dtype), self.weight, self.bias)


class AffineLinear(nn.Linear):
    """(W·x + b)/√(‖x‖² + 1), AFFDIV eq. 19 ("affine-like"): with a bias, one SGD step moves z by exactly -η·g
    (without one, the models' default, by -η·g·‖x‖²/(‖x‖² + 1): set ``bias: true`` for the paper's form)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.linear(x, self.weight, self.bias)
        return (z.to(stats_dtype(z)) * torch.rsqrt(_sum_sq(x, (-1,)) + 1)).to(z.dtype)


class L2Conv2d(nn.Conv2d):
    """x/√(‖x‖² + ε) per sample over (C,H,W), then the conv (AFFDIV's layerwise L2, Figs. 8-9)."""

    def __init__(self, *args: Any, eps: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = x.to(stats_dtype(x)) * torch.rsqrt(_sum_sq(x, (1, 2, 3)) + self.eps)
        return super().forward(x_hat.to(x.dtype))


class PatchNormConv2d(nn.Conv2d):
    """Conv whose every output location is divided by the norm of its own input patch (AFFDIV §5).

    ``mode="affine"`` (eq. 47): (W_d·x̃_p + b_d)/√(‖x̃_p‖² + 1). ``mode="l2"`` (eq. 48):
    W_d·x̃_p/√(‖x̃_p‖² + ε) + b_d. x̃_p is the C_in·kh·kw patch, zero padding included, so
    neither norm→conv nor conv→norm can express it. One scalar per (sample, location, group).
    """

    def __init__(
        self, *args: Any, mode: Literal["affine", "l2"] = "affine", eps: float = 1e-5, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if self.padding_mode != "zeros":
            raise ValueError(f"PatchNormConv2d supports padding_mode 'zeros' only, got {self.padding_mode!r}")
        if mode not in ("affine", "l2"):
            raise ValueError(f"PatchNormConv2d mode must be 'affine' or 'l2', got {mode!r}")
        self.mode, self.eps = mode, eps

    def patch_sq(self, x: torch.Tensor) -> torch.Tensor:
        """‖x̃_p‖² as (N, groups, H', W'): a ones-kernel conv of x², not F.unfold's (C·k²)x copy."""
        sq = x.to(stats_dtype(x)).square()
        ones = sq.new_ones(self.groups, self.in_channels // self.groups, *self.kernel_size)
        return F.conv2d(sq, ones, None, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.patch_sq(x).repeat_interleave(self.out_channels // self.groups, dim=1)
        if self.mode == "affine":
            z = self._conv_forward(x, self.weight, self.bias)
            return (z.to(q.dtype) * torch.rsqrt(q + 1)).to(z.dtype)
        z = self._conv_forward(x, self.weight, None)
        y = (z.to(q.dtype) * torch.rsqrt(q + self.eps)).to(z.dtype)
        return y if self.bias is None else y + self.bias.view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        eps = f", eps={self.eps}" if self.mode == "l2" else ""
        return f"{super().extra_repr()}, mode={self.mode}{eps}"


class _LayerReplacement(Normaliser):
    """Identity at every site: the normalisation lives in the replaced layers."""

    def make(self, site: Site, num_features: int) -> nn.Module:
        return nn.Identity()


@NORMS.register("l2")
class L2(_LayerReplacement):
    """x/‖x‖ before every linear and conv layer, the "norm-like" correction (AFFDIV eq. 18).

    Layer replacement: linear layers (the classifier too) normalise their input over D, conv
    layers (ResNet shortcuts too) per sample over (C,H,W); ε inside the root keeps x = 0
    finite. Identity at every norm site.
    """

    class Params(Normaliser.Params):
        eps: Eps = 1e-5

    params: Params

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return L2Linear(in_features, out_features, bias, eps=self.params.eps)

    def conv(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
        bias: bool = False,
    ) -> nn.Module:
        eps = self.params.eps
        return L2Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias, eps=eps)


@NORMS.register("affine_like")
class AffineLike(_LayerReplacement):
    """Every Linear becomes (Wx + b)/√(‖x‖² + 1), every conv a PatchNorm in affine mode (AFFDIV eqs. 19, 47).

    Layer replacement (the classifier and ResNet shortcuts too); Identity at every norm site.
    No hyper-parameters: the "+1" is part of the definition.
    """

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return AffineLinear(in_features, out_features, bias)

    def conv(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
        bias: bool = False,
    ) -> nn.Module:
        return PatchNormConv2d(
            in_channels, out_channels, kernel_size, stride, padding, bias=bias, mode="affine"
        )


@NORMS.register("patchnorm")
class PatchNorm(_LayerReplacement):
    """PatchNorm convs: each output location divided by its input patch's norm (AFFDIV §5, eqs. 47/48).

    ``mode: affine`` (eq. 47) or ``l2`` (eq. 48, ε inside the root). Conv layers only by
    default, linear layers stay plain (AFFDIV leaves the FC head of its conv nets unstated);
    ``linear: true`` gives them the FC case of the same mode (affine-like, or L2 → Linear),
    which makes ``mode: affine`` identical to ``affine_like``. Identity at every norm site.
    """

    class Params(Normaliser.Params):
        mode: Literal["affine", "l2"] = "affine"
        eps: Eps = 1e-5
        linear: bool = False

    params: Params

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        p = self.params
        if not p.linear:
            return nn.Linear(in_features, out_features, bias=bias)
        if p.mode == "affine":
            return AffineLinear(in_features, out_features, bias)
        return L2Linear(in_features, out_features, bias, eps=p.eps)

    def conv(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
        bias: bool = False,
    ) -> nn.Module:
        p = self.params
        return PatchNormConv2d(
            in_channels, out_channels, kernel_size, stride, padding, bias=bias, mode=p.mode, eps=p.eps
        )
