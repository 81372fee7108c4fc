"""The normaliser zoo against its definitions and specs/ reference values (LN-FL, PLN, SMOOTH, AFFDIV)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from numpy.polynomial import Polynomial
from torch import nn

from fedsim.errors import ConfigError
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm, list_norms, seed_norm_noise
from fedsim.norms.affine_divergence import AffineLinear, L2Linear, PatchNormConv2d
from fedsim.norms.ln_variants import (
    EpsNorm,
    GoldschmidtNorm,
    ParallelNorm,
    RandomizedNorm,
    goldschmidt_rsqrt,
)
from fedsim.norms.weierstrass import WeierstrassNorm, weierstrass_F, weierstrass_rsqrt

CIFAR = (3, 32, 32)
ZOO = [
    "scale", "ln_reduced", "rms", "pln", "ln_weierstrass", "ln_goldschmidt", "ln_randomized",
    "ln_clamped", "l2", "affine_like", "patchnorm",
]
F64 = torch.float64


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()  # tiny batches: intra-op threads only spin on a shared CPU
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(model: str, norm: str, norm_options: dict | None = None, **args) -> FedsimModel:
    return create_model(model, 10, CIFAR, create_norm(norm, norm_options), args)


def test_zoo_registered_with_a_paper_summary() -> None:
    from fedsim.norms import get_norm

    assert set(ZOO) <= set(list_norms())
    for name in ZOO:
        summary = get_norm(name).__doc__.strip().splitlines()[0]
        assert any(key in summary for key in ("LN-FL", "PLN", "SMOOTH", "AFFDIV")), name


# --- pln, rms --------------------------------------------------------------------------------


def _randomise_affine(m: nn.Module) -> nn.Module:
    for p in m.parameters():
        nn.init.normal_(p)
    return m


def test_pln_matches_layer_norm_and_group_norm_on_vectors() -> None:
    x = torch.randn(5, 24)
    pln = _randomise_affine(ParallelNorm(24, 24, 1e-5, center=True, affine=True))
    torch.testing.assert_close(pln(x), F.layer_norm(x, (24,), pln.weight, pln.bias, 1e-5))
    pln8 = _randomise_affine(ParallelNorm(24, 8, 1e-5, center=True, affine=True))
    torch.testing.assert_close(pln8(x), F.group_norm(x, 3, pln8.weight, pln8.bias, 1e-5))
    pls = _randomise_affine(ParallelNorm(24, 24, 1e-5, center=False, affine=True))
    rms = nn.RMSNorm(24, eps=1e-5)
    rms.weight.data.copy_(pls.weight)
    torch.testing.assert_close(pls(x) - pls.bias, rms(x))


def test_pln_is_per_pixel_on_images() -> None:
    x = torch.randn(2, 16, 5, 5)
    full = _randomise_affine(ParallelNorm(16, 16, 1e-5, center=True, affine=True))
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
    site = _randomise_affine(norm.make("linear", 12))
    ref = nn.RMSNorm(12, eps=1e-5)
    ref.weight.data.copy_(site.weight)
    x = torch.randn(4, 12)
    torch.testing.assert_close(site(x), ref(x))
    conv = _randomise_affine(norm.make("conv", 3))
    img = torch.randn(2, 3, 4, 4)
    expected = img * torch.rsqrt(img.square().mean((1, 2, 3), keepdim=True) + 1e-5)
    torch.testing.assert_close(conv(img), expected * conv.weight.view(1, -1, 1, 1))


# --- LN-FL propositions: the site decisions of scale and ln_reduced ------------------------


@pytest.mark.parametrize(("layerwise", "reduced"), [("fn", "scale"), ("ln", "ln_reduced")])
def test_lnfl_props_1_and_2(layerwise: str, reduced: str) -> None:
    """Bias-free ReLU nets: n^L = fn (Prop. 1) and n_MV^L = n_MV s^(L-1) (Prop. 2)."""
    args = {"eps": 1e-10} | ({} if layerwise == "fn" else {"affine": False})
    a = build("mlp", layerwise, args, hidden=[48, 32, 16])
    b = build("mlp", reduced, args, hidden=[48, 32, 16])
    b.load_state_dict(a.state_dict())
    x = torch.randn(6, *CIFAR)
    torch.testing.assert_close(a.forward_features(x), b.forward_features(x), atol=1e-5, rtol=1e-4)


# --- Weierstrass -----------------------------------------------------------------------------

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


# --- Goldschmidt -----------------------------------------------------------------------------


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


# --- randomized ------------------------------------------------------------------------------


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


# --- clamped ---------------------------------------------------------------------------------


def test_clamped_is_exactly_scale_invariant_above_eps() -> None:
    m = create_norm("ln_clamped", {"affine": False}).make("linear", 8)
    x = torch.randn(3, 8, dtype=F64)
    torch.testing.assert_close(m(5 * x), m(x))


# --- affine divergence -----------------------------------------------------------------------


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
    conv = _randomise_affine(PatchNormConv2d(5, 3, 1, bias=True, mode=mode).double())
    fc = AffineLinear(5, 3).double() if mode == "affine" else L2Linear(5, 3, eps=conv.eps).double()
    fc.load_state_dict({"weight": conv.weight.view(3, 5), "bias": conv.bias})
    x = torch.randn(2, 5, 4, 4, dtype=F64)
    torch.testing.assert_close(conv(x), fc(x.movedim(1, -1)).movedim(-1, 1))


def test_patchnorm_zero_patch_and_scale_behaviour() -> None:
    affine = _randomise_affine(PatchNormConv2d(2, 3, 3, padding=1, bias=True).double())
    zero = affine(torch.zeros(1, 2, 5, 5, dtype=F64))
    torch.testing.assert_close(zero, affine.bias.view(1, 3, 1, 1).expand_as(zero))  # specs P5: y = b
    l2 = _randomise_affine(PatchNormConv2d(2, 3, 3, padding=1, bias=True, mode="l2", eps=1e-14).double())
    x = torch.randn(1, 2, 5, 5, dtype=F64)
    torch.testing.assert_close(l2(7 * x), l2(x))  # specs P4


# --- every normaliser: degenerate inputs, models, what travels -------------------------------


def _site_modules(name: str, args: dict) -> list[tuple[nn.Module, tuple[int, ...]]]:
    norm = create_norm(name, args)
    return [
        (norm.make("conv", 16), (2, 16, 4, 4)),
        (norm.make("linear", 16), (2, 16)),
        (norm.make("feature", 16), (2, 16)),
        (norm.linear(16, 8, True), (2, 16)),
        (norm.conv(16, 8, 3, 1, 1, True), (2, 16, 4, 4)),
    ]


DEGENERATE = [(name, {}) for name in ZOO] + [
    ("patchnorm", {"mode": "l2", "linear": True}),
    ("pln", {"group_size": 1, "center": False}),
    ("ln_goldschmidt", {"delta_range": None}),
    ("rms", {"affine": False}),
]


@pytest.mark.parametrize(("name", "args"), DEGENERATE)
def test_finite_at_zero_variance_and_zero_input(name: str, args: dict) -> None:
    for module, shape in _site_modules(name, args):
        for train in (True, False):
            module.train(train)
            for fill in (0.0, 1.5):  # all-zero, then constant (zero variance)
                x = torch.full(shape, fill, requires_grad=True)
                y = module(x)
                y.square().sum().backward()
                assert torch.isfinite(y).all(), (name, module, fill)
                grads = [x.grad, *(p.grad for p in module.parameters())]
                assert all(torch.isfinite(g).all() for g in grads), (name, module, fill)
    model = build("cnn", name, args)
    x = torch.zeros(2, *CIFAR, requires_grad=True)
    model(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()), name


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("model_name", ["cnn", "resnet18", "mlp"])
def test_forward_backward_in_every_model(model_name: str, name: str) -> None:
    model = build(model_name, name)
    logits = model(torch.randn(2, *CIFAR))
    assert logits.shape == (2, 10) and logits.dtype == torch.float32
    F.cross_entropy(logits, torch.arange(2)).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ZOO)
def test_only_parameters_and_running_statistics_travel(name: str) -> None:
    model = build("cnn", name)
    params = dict(model.named_parameters())
    assert all(key.endswith((".weight", ".bias")) for key in params)  # no σ, steps, eps, group_size
    travelling = set(model.state_dict()) - set(params)
    assert all(key.endswith(".running_var") for key in travelling), travelling
    assert bool(travelling) == (name == "ln_goldschmidt")
    for key in travelling:  # a genuine statistic: it moves with training
        before = model.state_dict()[key].clone()
        model(torch.randn(2, *CIFAR))
        assert not torch.equal(before, model.state_dict()[key])


@pytest.mark.parametrize("name", ["l2", "affine_like", "patchnorm"])
def test_layer_replacements_keep_the_plain_parameter_set(name: str) -> None:
    plain = build("resnet18", "none")
    replaced = build("resnet18", name)
    assert {k: v.shape for k, v in replaced.state_dict().items()} == {
        k: v.shape for k, v in plain.state_dict().items()
    }
    assert isinstance(replaced.classifier, nn.Linear)


def test_ln_variant_sites_follow_ln() -> None:
    for name in ("ln_weierstrass", "ln_goldschmidt", "ln_randomized", "ln_clamped"):
        model = build("cnn", name)
        assert isinstance(model.feature_norm, nn.Identity)
        assert isinstance(model.norm1, EpsNorm | WeierstrassNorm) and model.norm1.weight.shape == (64,)
