"""The LayerNorm variants (fedsim/norms/ln_variants.py: scale, ln_reduced, rms, pln, ln_goldschmidt,
ln_randomized, ln_clamped) against their definitions and specs/ reference values (LN-FL, PLN, SMOOTH)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from numpy.polynomial import Polynomial
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms import create_norm, seed_norm_noise
from fedsim.norms.ln_variants import (
    GoldschmidtNorm,
    ParallelNorm,
    RandomizedNorm,
    goldschmidt_rsqrt,
)
from tests.test_norms_zoo import CIFAR, build
from tests.test_weierstrass import F_TABLE

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def randomise_affine(m: nn.Module) -> nn.Module:
    for p in m.parameters():
        nn.init.normal_(p)
    return m


def test_pln_matches_layer_norm_and_group_norm_on_vectors() -> None:
    x = torch.randn(5, 24)
    pln = randomise_affine(ParallelNorm(24, 24, 1e-5, center=True, affine=True))
    torch.testing.assert_close(pln(x), F.layer_norm(x, (24,), pln.weight, pln.bias, 1e-5))
    pln8 = randomise_affine(ParallelNorm(24, 8, 1e-5, center=True, affine=True))
    torch.testing.assert_close(pln8(x), F.group_norm(x, 3, pln8.weight, pln8.bias, 1e-5))
    pls = randomise_affine(ParallelNorm(24, 24, 1e-5, center=False, affine=True))
    rms = nn.RMSNorm(24, eps=1e-5)
    rms.weight.data.copy_(pls.weight)
    torch.testing.assert_close(pls(x) - pls.bias, rms(x))


def test_pln_is_per_pixel_on_images() -> None:
    x = torch.randn(2, 16, 5, 5)
    full = randomise_affine(ParallelNorm(16, 16, 1e-5, center=True, affine=True))
    per_pixel = F.layer_norm(x.movedim(1, -1), (16,), full.weight, full.bias, 1e-5).movedim(-1, 1)
    torch.testing.assert_close(full(x), per_pixel)
    pln = ParallelNorm(16, 8, 1e-5, center=True, affine=False)
    assert not torch.allclose(pln(x), F.group_norm(x, 2, eps=1e-5), atol=1e-2)  # H·W > 1: not GroupNorm
    pixel = x[:, :, :1, :1]
    torch.testing.assert_close(pln(pixel), F.group_norm(pixel, 2, eps=1e-5))  # H·W = 1: GroupNorm


def test_pln_group_size_errors() -> None:
    with pytest.raises(ConfigError, match=r"model\.norm\b.*'pln'.*\bgroup_size = 1\b.*\bcenter\b"):
        create_norm("pln", {"group_size": 1})
    create_norm("pln", {"group_size": 1, "center": False})  # PLS-1 is a valid soft sign
    with pytest.raises(ConfigError, match=r"model\.norm\.group_size = 3 .*'pln'"):
        build("cnn", "pln", {"group_size": 3})
    assert isinstance(build("mlp", "pln", {"group_size": 4}, hidden=[8]).fc_norms[0], ParallelNorm)


def test_rms_equals_torch_rmsnorm() -> None:
    norm = create_norm("rms")
    site = randomise_affine(norm.make("linear", 12))
    ref = nn.RMSNorm(12, eps=1e-5)
    ref.weight.data.copy_(site.weight)
    x = torch.randn(4, 12)
    torch.testing.assert_close(site(x), ref(x))
    conv = randomise_affine(norm.make("conv", 3))
    img = torch.randn(2, 3, 4, 4)
    expected = img * torch.rsqrt(img.square().mean((1, 2, 3), keepdim=True) + 1e-5)
    torch.testing.assert_close(conv(img), expected * conv.weight.view(1, -1, 1, 1))


@pytest.mark.parametrize(("layerwise", "reduced"), [("fn", "scale"), ("ln", "ln_reduced")])
def test_lnfl_props_1_and_2(layerwise: str, reduced: str) -> None:
    """Bias-free ReLU nets: n^L = fn (Prop. 1) and n_MV^L = n_MV s^(L-1) (Prop. 2)."""
    args = {"eps": 1e-10} | ({} if layerwise == "fn" else {"affine": False})
    a = build("mlp", layerwise, args, hidden=[48, 32, 16])
    b = build("mlp", reduced, args, hidden=[48, 32, 16])
    b.load_state_dict(a.state_dict())
    x = torch.randn(6, *CIFAR)
    torch.testing.assert_close(a.forward_features(x), b.forward_features(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_goldschmidt_polynomial_degree_and_fixed_point(steps: int) -> None:
    y0 = 0.7
    poly = goldschmidt_rsqrt(Polynomial([0.0, 1.0]), y0, steps)
    degree = (3**steps - 1) // 2
    assert poly.degree() == degree
    assert math.isclose(poly.coef[-1], (-1) ** steps * 2.0**-degree * y0 ** (3**steps), rel_tol=1e-9)
    assert math.isclose(poly(0.0), 1.5**steps * y0, rel_tol=1e-12)
    assert math.isclose(poly(1 / y0**2), y0, rel_tol=1e-9)  # degree 40 loses digits to cancellation
    assert math.isclose(goldschmidt_rsqrt(1 / y0**2, y0, steps), y0, rel_tol=1e-14)
    v = 2.0
    assert abs(goldschmidt_rsqrt(v, math.sqrt(3 / v), steps)) < 1e-12  # δ = 3 gives 0
    assert math.isclose(goldschmidt_rsqrt(v, math.sqrt(4 / v), 1), -1 / math.sqrt(v))  # δ = 4: -1/√v


def test_goldschmidt_gradient_at_zero_follows_the_recursion() -> None:
    y0, steps = 0.8, 4
    v = torch.zeros((), dtype=F64, requires_grad=True)
    goldschmidt_rsqrt(v, y0, steps).backward()
    d, y = 0.0, y0
    for _ in range(steps):
        d, y = 1.5 * d - y**3 / 2, 1.5 * y
    assert math.isclose(v.grad.item(), d, rel_tol=1e-12)


def test_goldschmidt_module_tracks_v_and_matches_ln() -> None:
    m = GoldschmidtNorm(16, eps=1e-5, steps=4, momentum=0.1)
    x = torch.randn(8, 16, 3, 3) * 3
    m(x)
    v = x.var((1, 2, 3), unbiased=False)
    torch.testing.assert_close(m.running_var, v.mean())  # the first batch sets the estimate
    m(x * 1.1)
    assert m.running_var > v.mean()
    m.eval()
    torch.testing.assert_close(m(x), F.group_norm(x, 1, eps=1e-5), atol=1e-4, rtol=1e-4)


def test_goldschmidt_delta_guard() -> None:
    x = torch.randn(4, 32, dtype=F64)
    m = GoldschmidtNorm(32, 1e-5, 4, 0.1, (0.25, 2.0), weight=False, bias=False).double().eval()
    m.running_var.fill_(x.var(1, unbiased=False).mean().item() / 100)  # δ ≈ 100: far out of band
    ln = F.layer_norm(x, (32,), eps=1e-5)
    assert (m(x) - ln).abs().max() < 2**-8 * ln.abs().max()
    m.delta_range = None  # the pure polynomial diverges there
    assert (m(x) - ln).abs().max() > 1
    with pytest.raises(ConfigError, match=r"model\.norm\.delta_range"):
        create_norm("ln_goldschmidt", {"delta_range": [0.5, 4.0]})


@pytest.mark.slow
def test_goldschmidt_trains() -> None:
    """One SGD step can move v ~10x past the running estimate; the δ guard keeps training finite."""
    model = build("mlp", "ln_goldschmidt", hidden=[64, 64])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, *CIFAR), torch.randint(0, 10, (16,))
    for _ in range(10):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def test_randomized_is_seeded_in_training_and_plain_ln_in_eval() -> None:
    a = build("mlp", "ln_randomized", {"sigma": 0.5}, hidden=[16, 16])
    b = copy.deepcopy(a)
    x = torch.randn(4, *CIFAR)
    assert seed_norm_noise(a, 7) == seed_norm_noise(b, 7) == 2
    torch.testing.assert_close(a(x), b(x))
    seed_norm_noise(b, 8)
    assert not torch.allclose(a(x), b(x))
    a.eval()
    site = a.fc_norms[0]
    h = torch.randn(3, 16)
    torch.testing.assert_close(site(h), F.layer_norm(h, (16,), site.weight, site.bias, 1e-5))
    unseeded = RandomizedNorm(16, eps=1e-5, sigma=0.5)
    torch.manual_seed(3)
    first = unseeded(h)
    torch.manual_seed(3)
    torch.testing.assert_close(unseeded(h), first)  # unseeded: torch's global RNG


def test_randomized_mean_scale_approaches_the_smoothed_one() -> None:
    """specs: at v = 10σ the sample mean of s matches f̃σ(v) = F(10)/√σ to ~1e-3."""
    m = RandomizedNorm(1, eps=1e-5, sigma=1.0)
    m.reseed(0)
    s = m.scale(torch.full((200_000,), 10.0, dtype=F64))
    assert abs(s.mean().item() / F_TABLE[10] - 1) < 1e-3


def test_clamped_is_exactly_scale_invariant_above_eps() -> None:
    m = create_norm("ln_clamped", {"affine": False}).make("linear", 8)
    x = torch.randn(3, 8, dtype=F64)
    torch.testing.assert_close(m(5 * x), m(x))


