"""Weierstrass-smoothed LN: 1/√v replaced by its Gaussian smoothing f̃σ(v), an entire function (SMOOTH).

f̃σ(v) = E_{ξ~N(0,σ²)}[(v + ξ)₊^-½] = σ^-½ F(v/σ), F a parabolic-cylinder function. The naive
closed form exp(-a²/4)·D_{-½}(-a) overflows (0·∞ at a ≈ 19 in float32), so F is evaluated as
in docs/normalizers.md (`ln_weierstrass`): 48-node Gauss-Legendre on
F(a) = √(2/π) ∫₀^∞ exp(-(t² - a)²/2) dt for a ≤ 12, the 5-term asymptotic series beyond.
Pure torch ops, so autograd (and double backward) goes through; relative error ≤ 3e-9 in
float64, worst at the switch.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field
from torch import nn

from fedsim.norms.base import NORMS, Sigma
from fedsim.norms.ln_variants import LNHost, ScaledNorm

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(48)
_GX = torch.tensor((_NODES + 1) / 2, dtype=torch.float64)  # nodes and weights on [0, 1]
_GW = torch.tensor(_WEIGHTS / 2, dtype=torch.float64)
# F(a) ~ a^-½ Σ C(-½, 2k)(2k-1)!! a^-2k; the next terms are O(e^{-a²/2}).
_ASYMPTOTIC = (1.0, 0.375, 0.8203125, 3.3837890625, 20.619964599609375)
_SWITCH = 12.0  # branches agree to < 1e-8 relative here
_TAIL = 8.0  # exp(-(t² - a)²/2) < e^-32 beyond t² = a + 8


def weierstrass_F(a: torch.Tensor) -> torch.Tensor:
    """F(a) = √σ·f̃σ(σa), elementwise, in ``a``'s dtype (use float64 for accuracy)."""
    # Clamp each branch's input *before* torch.where: the unused branch must not see values
    # whose gradient is NaN (0·∞ leaks through where's backward otherwise).
    near_a = a.clamp(max=_SWITCH)
    upper = (near_a.clamp(min=0.0) + _TAIL).sqrt()
    t = upper.unsqueeze(-1) * _GX.to(a)
    q = torch.exp(-0.5 * (t * t - near_a.unsqueeze(-1)).square())
    near = math.sqrt(2 / math.pi) * upper * (q * _GW.to(a)).sum(-1)
    far_a = a.clamp(min=_SWITCH)
    r2 = far_a.reciprocal().square()
    series = torch.zeros_like(far_a)
    for c in reversed(_ASYMPTOTIC):
        series = series * r2 + c
    return torch.where(a > _SWITCH, series * far_a.rsqrt(), near)


def weierstrass_rsqrt(v: torch.Tensor, sigma: float) -> torch.Tensor:
    """f̃σ(v) = σ^-½ F(v/σ): the smoothed 1/√v, finite (0.86/√σ) at v = 0 and ≈ 0 for v ≪ -σ."""
    # The statistic tensor is tiny, so float64 costs nothing; MPS has no float64.
    work = torch.float32 if v.device.type == "mps" else torch.float64
    return (weierstrass_F(v.to(work) / sigma) / math.sqrt(sigma)).to(v.dtype)


class WeierstrassNorm(ScaledNorm):
    """s(v) = f̃σ(v): no ε needed, f̃σ is entire and bounded by 1.0211/√σ."""

    def __init__(self, num_features: int, sigma: float, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        self.sigma = sigma

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        return weierstrass_rsqrt(v, self.sigma)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sigma={self.sigma}"


@NORMS.register("ln_weierstrass")
class LNWeierstrass(LNHost):
    """LN with 1/√v replaced by the Gaussian-smoothed f̃σ(v), an entire function (SMOOTH §1.1.1).

    Sites as ``ln``: conv (over C,H,W) and hidden linear; Identity at the feature site.
    ``sigma`` is in units of v (a variance): f̃σ is within 1% of 1/√v for v > 6.3σ and tends to
    0.86/√σ as v → 0, so σ is at most 1 (fedsim.norms.base.Sigma says why). The default 1e-3 is ~1e-2
    of the v ≈ 0.1 of post-ReLU sites at init.
    """

    class Params(LNHost.Params):
        sigma: Annotated[Sigma, Field(gt=0)] = 1e-3

    params: Params

    def module(self, num_features: int, **host: bool) -> nn.Module:
        return WeierstrassNorm(num_features, self.params.sigma, **host)
