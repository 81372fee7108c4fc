"""The Weierstrass-smoothed LayerNorm (fedsim/norms/weierstrass.py) against the specs/ tables (SMOOTH)."""

from __future__ import annotations

import pytest
import torch

from fedsim.norms.weierstrass import WeierstrassNorm, weierstrass_F, weierstrass_rsqrt

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


F_TABLE = {  # specs W1
    -3: 0.00437903774463, -1: 0.3596437053977, 0: 0.8600399873245, 0.1: 0.8989007151995,
    0.5: 1.002227386868, 1: 1.007989078407, 2: 0.7960233788177, 3: 0.6119625415007,
    5: 0.4546437679618, 10: 0.3174407018223, 100: 0.1000037508207, 1000: 0.03162278846025,
}
DF_TABLE = {  # specs W2
    -3: 0.01377896367324, -1: 0.4637973807055, 0: 0.4110894793312, 0.5: 0.1455557600692,
    1: -0.107386147137, 2: -0.235406159496, 5: -0.04880565700406, 10: -0.01612028234108,
    100: -5.000937869361e-4,
}


def test_weierstrass_values_and_derivatives_match_the_tables() -> None:
    a = torch.tensor(list(F_TABLE), dtype=F64)
    expected = torch.tensor(list(F_TABLE.values()), dtype=F64)
    torch.testing.assert_close(weierstrass_F(a), expected, rtol=1e-8, atol=0)
    a = torch.tensor(list(DF_TABLE), dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(weierstrass_F(a).sum(), a)
    torch.testing.assert_close(grad, torch.tensor(list(DF_TABLE.values()), dtype=F64), rtol=1e-6, atol=1e-12)
    for sigma, expected in [(0.1, 1.0038356398), (0.01, 1.000037508207), (0.001, 1.000000375001)]:  # W3
        value = weierstrass_rsqrt(torch.tensor(1.0, dtype=F64), sigma)
        torch.testing.assert_close(value, torch.tensor(expected, dtype=F64), rtol=1e-9, atol=0)


def test_weierstrass_gradients_finite_across_the_branch_switch() -> None:
    a = torch.tensor([-5.0, 0.0, 0.5, 11.99, 12.01, 1e4], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(weierstrass_F, (a,))
    assert torch.autograd.gradgradcheck(weierstrass_F, (a,))
    edge = torch.tensor([12 - 1e-9, 12 + 1e-9], dtype=F64)
    near, far = weierstrass_F(edge)
    assert abs(near - far) / far < 1e-8
    deep = torch.tensor([-1e6], dtype=F64, requires_grad=True)
    value = weierstrass_F(deep)
    value.backward()
    assert value.item() == 0.0 and torch.isfinite(deep.grad).all()


def test_weierstrass_ln_output_variance() -> None:
    """specs W7: Var(y) = a·F(a)² with a = v/σ; 1.016042 at a = 1."""
    m = WeierstrassNorm(4, sigma=1.0, weight=False, bias=False)
    y = m(torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=F64))  # v = 1
    assert abs(y.square().mean().item() - 1.016042) < 1e-6


