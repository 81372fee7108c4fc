"""The affine-divergence layers (fedsim/norms/affine_divergence.py: l2, affine_like, patchnorm) against their
definitions (AFFDIV)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.norms.affine_divergence import AffineLinear, L2Linear, PatchNormConv2d
from tests.test_ln_variants import randomise_affine

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def _one_step_ratio(layer: nn.Module, x: torch.Tensor, eta: float = 0.1) -> torch.Tensor:
    """(z' - z)/(-η g) after one SGD step on this layer alone, g = ∂L/∂z (specs A1)."""
    z = layer(x)
    g = torch.randn_like(z)
    (z * g).sum().backward()
    with torch.no_grad():
        for p in layer.parameters():
            p -= eta * p.grad
        return (layer(x) - z) / (-eta * g)


def test_one_step_identity() -> None:
    x = torch.randn(1, 6, dtype=F64)
    sq = x.square().sum()
    affine_like = AffineLinear(6, 4).double()
    ones = torch.ones(1, 4, dtype=F64)
    torch.testing.assert_close(_one_step_ratio(affine_like, x), ones, rtol=1e-10, atol=0)
    plain = nn.Linear(6, 4).double()
    torch.testing.assert_close(_one_step_ratio(plain, x), (sq + 1).expand(1, 4), rtol=1e-10, atol=0)
    l2 = L2Linear(6, 4, eps=1e-12).double()
    torch.testing.assert_close(_one_step_ratio(l2, x), torch.full((1, 4), 2.0, dtype=F64), rtol=1e-9, atol=0)


def test_affine_like_equals_its_separable_form() -> None:
    """specs A5: (Wx + b)/√(‖x‖² + 1) = [W | b]·[x, 1]/‖[x, 1]‖."""
    layer = AffineLinear(5, 3).double()
    x = torch.randn(4, 5, dtype=F64)
    xe = torch.cat([x, torch.ones(4, 1, dtype=F64)], 1)
    separable = F.linear(xe / xe.norm(dim=1, keepdim=True), torch.cat([layer.weight, layer.bias[:, None]], 1))
    torch.testing.assert_close(layer(x), separable)


@pytest.mark.parametrize(("k", "stride", "padding", "dilation"), [(3, 1, 1, 1), (2, 2, 1, 1), (3, 2, 1, 2)])
def test_patch_norms_equal_unfold(k: int, stride: int, padding: int, dilation: int) -> None:
    x = torch.randn(2, 3, 9, 9, dtype=F64)
    conv = PatchNormConv2d(3, 4, k, stride=stride, padding=padding, dilation=dilation).double()
    q = conv.patch_sq(x)
    cols = F.unfold(x, k, dilation=dilation, padding=padding, stride=stride).square().sum(1)
    torch.testing.assert_close(q, cols.view(q.shape))


@pytest.mark.parametrize("mode", ["affine", "l2"])
def test_patchnorm_1x1_is_per_pixel_fc(mode: str) -> None:
    conv = randomise_affine(PatchNormConv2d(5, 3, 1, bias=True, mode=mode).double())
    fc = AffineLinear(5, 3).double() if mode == "affine" else L2Linear(5, 3, eps=conv.eps).double()
    fc.load_state_dict({"weight": conv.weight.view(3, 5), "bias": conv.bias})
    x = torch.randn(2, 5, 4, 4, dtype=F64)
    torch.testing.assert_close(conv(x), fc(x.movedim(1, -1)).movedim(-1, 1))


def test_patchnorm_zero_patch_and_scale_behaviour() -> None:
    affine = randomise_affine(PatchNormConv2d(2, 3, 3, padding=1, bias=True).double())
    zero = affine(torch.zeros(1, 2, 5, 5, dtype=F64))
    torch.testing.assert_close(zero, affine.bias.view(1, 3, 1, 1).expand_as(zero))  # specs P5: y = b
    l2 = randomise_affine(PatchNormConv2d(2, 3, 3, padding=1, bias=True, mode="l2", eps=1e-14).double())
    x = torch.randn(1, 2, 5, 5, dtype=F64)
    torch.testing.assert_close(l2(7 * x), l2(x))  # specs P4


