"""The LN-FL normalisers (fedsim/norms/basic.py: none, ln, fn, gn, bn), each site's module against its definition
in docs/normalizers.md, written here with plain torch ops in float64: LN over all of (C, H, W) or D, feature
normalisation √d·x / max(ε, ‖x‖), GroupNorm over contiguous groups, BatchNorm's batch and running statistics;
that each option (eps, affine, inside, groups, momentum) reaches the module. Placement in the models and parameter
counts: tests/test_cnn.py, test_mlp.py, test_resnet.py; every model with every normaliser: tests/test_models.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms import NORM_SITE_ATTR, create_norm
from fedsim.norms.basic import FeatureNorm

F64 = torch.float64
EPS32 = torch.finfo(torch.float32).eps
pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def assert_within(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float = 0.0) -> None:
    """|actual − expected| ≤ atol + rtol·|expected| everywhere, compared in float64 (torch.testing's first call
    costs seconds of imports)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    error = (actual.detach().to(F64) - expected.to(F64)).abs()
    bound = atol + rtol * expected.to(F64).abs()
    k = int((error - bound).argmax())  # the entry furthest beyond its bound
    assert bool((error <= bound).all()), f"entry {k}: off by {error.flatten()[k]:.3g} > {bound.flatten()[k]:.3g}"


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, reduced: int) -> None:
    """``actual`` (float32) is ``expected`` (float64) up to float32 rounding of sums over ``reduced`` terms:
    relative to each entry and to the largest one (centring cancels, so small entries carry the large ones' error)."""
    assert actual.dtype == torch.float32
    tol = reduced * EPS32
    assert_within(actual, expected, rtol=tol, atol=tol * expected.abs().max().item())


def randomise_affine(m: nn.Module) -> nn.Module:
    """γ, β drawn at random (their defaults 1 and 0 would hide a misplaced affine map)."""
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    return m


def per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over ``x`` (N, C, ...)."""
    return t.detach().to(F64).view(1, -1, *([1] * (x.dim() - 2)))


def mean_variance(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    """(x − μ) / √(v + ε), μ and the biased v over ``dims``, in float64."""
    x = x.to(F64)
    mu = x.mean(dims, keepdim=True)
    v = ((x - mu) ** 2).mean(dims, keepdim=True)
    return (x - mu) / torch.sqrt(v + eps)


# --- which module at which site ---------------------------------------------------------------------------------

TABLE = {  # docs/normalizers.md's summary: conv, linear, feature
    "none": (nn.Identity, nn.Identity, nn.Identity),
    "ln": (nn.GroupNorm, nn.LayerNorm, nn.Identity),
    "fn": (nn.Identity, nn.Identity, FeatureNorm),
    "gn": (nn.GroupNorm, nn.GroupNorm, nn.Identity),
    "bn": (nn.BatchNorm2d, nn.BatchNorm1d, nn.Identity),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_each_normaliser_makes_its_documented_module_at_each_site_marked_with_the_site(name: str) -> None:
    norm = create_norm(name)
    for site, cls in zip(("conv", "linear", "feature"), TABLE[name], strict=True):
        m = norm.make(site, 8)
        assert type(m) is cls, (name, site)
        assert getattr(m, NORM_SITE_ATTR, None) == (None if cls is nn.Identity else site), (name, site)


def test_none_hands_every_site_its_input_unchanged() -> None:
    norm, x = create_norm("none"), torch.randn(3, 4, 2, 2)
    for site in ("conv", "linear", "feature"):
        m = norm.make(site, 4)
        assert m(x) is x and list(m.parameters()) == [] and list(m.buffers()) == []


# --- ln ---------------------------------------------------------------------------------------------------------


def test_ln_conv_site_normalises_each_sample_over_c_h_w_with_gamma_beta_per_channel() -> None:
    m = randomise_affine(create_norm("ln").make("conv", 4))
    x = torch.randn(3, 4, 5, 5) * 3 + 1
    assert [tuple(p.shape) for p in m.parameters()] == [(4,), (4,)]
    expected = mean_variance(x, (1, 2, 3), 1e-5) * per_channel(m.weight, x) + per_channel(m.bias, x)
    y = m(x)
    assert_matches(y, expected, 4 * 5 * 5)
    # not torch's LayerNorm over C at each pixel (LN-FL Table 7): that is another function
    per_pixel = F.layer_norm(x.movedim(1, -1), (4,), m.weight, m.bias, 1e-5).movedim(-1, 1)
    assert (y - per_pixel).abs().max() > 0.1


def test_ln_linear_site_normalises_each_sample_over_d() -> None:
    m = randomise_affine(create_norm("ln").make("linear", 16))
    x = torch.randn(5, 16) * 2 - 3
    expected = mean_variance(x, (1,), 1e-5) * m.weight.detach().to(F64) + m.bias.detach().to(F64)
    assert_matches(m(x), expected, 16)


@pytest.mark.parametrize(("site", "shape"), [("conv", (4, 3, 2, 2)), ("linear", (4, 12))])
def test_ln_eps_sits_inside_the_root_and_static_ln_has_no_parameters(site: str, shape: tuple[int, ...]) -> None:
    """eps = 0.5 against a variance of about 0.09: ‖y‖²/d = v/(v + ε) per sample, Σ y = 0 (docs/normalizers.md)."""
    m = create_norm("ln", {"eps": 0.5, "affine": False}).make(site, shape[1])
    assert list(m.parameters()) == []
    x = torch.randn(shape) * 0.3
    y = m(x)
    dims = tuple(range(1, len(shape)))
    assert_matches(y, mean_variance(x, dims, 0.5), math.prod(shape[1:]))
    x64 = x.to(F64)
    v = ((x64 - x64.mean(dims, keepdim=True)) ** 2).mean(dims)
    d = math.prod(shape[1:])
    assert_within(y.square().mean(dims), v / (v + 0.5), rtol=d * EPS32)
    assert y.to(F64).sum(dims).abs().max() < d * EPS32


def test_ln_of_a_sample_of_one_value_is_beta() -> None:
    """h = x − μ = 0 exactly (the mean of 16 copies of a binary-exact value is the value); torch's fused kernel
    computes x·s + (β − μ·s) with s = γ/√ε, so y = β up to the rounding of those two terms of size |x|·|γ|/√ε."""
    m = randomise_affine(create_norm("ln").make("conv", 4))
    values = torch.tensor([-2.0, 0.5, 3.0])
    x = values.view(3, 1, 1, 1).expand(3, 4, 2, 2).contiguous()
    gamma, beta = m.weight.detach().view(1, 4, 1, 1), m.bias.detach().view(1, 4, 1, 1)
    bound = 2 * EPS32 * (x.abs() * gamma.abs() / math.sqrt(1e-5) + beta.abs())
    assert ((m(x).detach() - beta).abs() <= bound).all()
    assert (bound < 1e-3).all()  # the same sample with its mean not removed would be off by |x|·|γ|/√ε ≈ 10²


# --- fn and its feature normalisation ---------------------------------------------------------------------------


def feature_norm_ref(x: torch.Tensor, eps: float) -> torch.Tensor:
    """√d · x / max(ε, ‖x‖₂) per sample, over all non-batch dims, in float64."""
    x = x.to(F64)
    d = x[0].numel()
    norm = x.reshape(len(x), -1).square().sum(1).sqrt().clamp(min=eps)
    return math.sqrt(d) * x / norm.view(-1, *([1] * (x.dim() - 1)))


def test_feature_norm_scales_each_sample_over_all_non_batch_dims_to_norm_sqrt_d() -> None:
    x = torch.randn(3, 2, 3, 4) * torch.tensor([0.1, 1.0, 30.0]).view(3, 1, 1, 1)
    y = FeatureNorm(1e-5)(x)
    assert_matches(y, feature_norm_ref(x, 1e-5), 24)
    assert_within(y.to(F64).flatten(1).norm(dim=1), torch.full((3,), math.sqrt(24), dtype=F64), rtol=24 * EPS32)


def test_feature_norm_divides_by_eps_below_it_and_takes_eps_from_the_options() -> None:
    m = create_norm("fn", {"eps": 0.25}).make("feature", 16)
    assert isinstance(m, FeatureNorm) and m.eps == 0.25 and m.extra_repr() == "eps=0.25"
    x = torch.randn(2, 16)
    x[0] *= 0.1 / x[0].norm()  # ‖x‖ = 0.1 < ε: √d·x/ε, not norm √d
    x[1] *= 3.0 / x[1].norm()
    y = m(x)
    assert_matches(y, feature_norm_ref(x, 0.25), 16)
    assert_within(y[0], 4.0 * x[0].to(F64) / 0.25, rtol=16 * EPS32)
    assert abs(y[1].norm().item() - 4.0) < 16 * EPS32 * 4.0


def test_feature_norm_keeps_no_state_for_fedavg_to_average() -> None:
    m = create_norm("fn", {"eps": 1e-3}).make("feature", 8)
    assert m.state_dict() == {} and list(m.parameters()) == [] and type(m.eps) is float


def test_feature_norm_gradient_below_eps_treats_the_norm_as_a_constant() -> None:
    """max(ε, ‖x‖) = ε passes no gradient to ‖x‖: d(Σ y)/dx = √d/ε; above ε it is √d (1/‖x‖ − x Σx / ‖x‖³)."""
    d, eps = 9, 1e-2
    small = (torch.randn(1, d) * 1e-4).requires_grad_()
    FeatureNorm(eps)(small).sum().backward()
    assert_within(small.grad, torch.full((1, d), math.sqrt(d) / eps, dtype=F64), rtol=4 * EPS32)
    big = torch.randn(2, d).requires_grad_()
    FeatureNorm(eps)(big).sum().backward()
    x = big.detach().to(F64)
    n = x.norm(dim=1, keepdim=True)
    expected = math.sqrt(d) * (1 / n - x * x.sum(1, keepdim=True) / n**3)
    assert_within(big.grad, expected, rtol=d * EPS32, atol=d * EPS32 * expected.abs().max().item())


def test_feature_norm_in_half_precision_takes_the_norm_in_float32() -> None:
    """d = 1024 entries of ±16: ‖x‖² = 262144 overflows float16 (max 65504); the output √d·x/512 = ±1 exactly."""
    signs = torch.randint(0, 2, (2, 1024)) * 2 - 1
    x = (signs * 16).to(torch.float16)
    y = FeatureNorm(1e-5)(x)
    assert y.dtype == torch.float16
    assert torch.equal(y, signs.to(torch.float16))


@pytest.mark.parametrize("inside", ["none", "ln", "scale"])
def test_fn_inside_puts_ln_or_the_feature_norm_at_conv_and_linear_sites_with_its_eps(inside: str) -> None:
    """LN-FL Table 13: the feature keeps FN whatever ``inside`` puts at the other sites."""
    norm = create_norm("fn", {"eps": 0.5, "inside": inside})
    feature = norm.make("feature", 12)
    assert isinstance(feature, FeatureNorm) and feature.eps == 0.5
    x_conv, x_lin = torch.randn(2, 3, 2, 2) * 0.3, torch.randn(2, 12) * 0.3
    conv, linear = norm.make("conv", 3), norm.make("linear", 12)
    if inside == "none":
        assert conv(x_conv) is x_conv and linear(x_lin) is x_lin
    elif inside == "ln":  # γ = 1, β = 0 at initialisation
        assert [tuple(p.shape) for p in conv.parameters()] == [(3,), (3,)]
        assert_matches(conv(x_conv), mean_variance(x_conv, (1, 2, 3), 0.5), 12)
        assert_matches(linear(x_lin), mean_variance(x_lin, (1,), 0.5), 12)
    else:
        assert_matches(conv(x_conv), feature_norm_ref(x_conv, 0.5), 12)
        assert_matches(linear(x_lin), feature_norm_ref(x_lin, 0.5), 12)


# --- gn ---------------------------------------------------------------------------------------------------------


def group_norm_ref(x: torch.Tensor, groups: int, eps: float, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Each sample's channels (dim 1) cut into ``groups`` contiguous slices, each MV-normalised on its own."""
    k = x.shape[1] // groups
    parts = [mean_variance(x[:, g * k : (g + 1) * k], tuple(range(1, x.dim())), eps) for g in range(groups)]
    return torch.cat(parts, dim=1) * per_channel(gamma, x) + per_channel(beta, x)


def test_gn_conv_site_normalises_contiguous_channel_groups_over_h_w() -> None:
    m = randomise_affine(create_norm("gn", {"groups": 3}).make("conv", 6))
    x = torch.randn(2, 6, 3, 3) * 2 + 1
    assert_matches(m(x), group_norm_ref(x, 3, 1e-5, m.weight, m.bias), 2 * 3 * 3)
    one = create_norm("gn", {"groups": 1}).make("conv", 6)  # G = 1 is ln at a conv site
    assert_matches(one(x), mean_variance(x, (1, 2, 3), 1e-5), 6 * 3 * 3)


def test_gn_linear_site_splits_d_into_two_contiguous_halves_by_default() -> None:
    m = randomise_affine(create_norm("gn", {"eps": 0.5}).make("linear", 16))
    x = torch.randn(4, 16)
    x[:, 8:] *= 10  # halves of different scales: a split other than [0:8], [8:16] would not match
    assert_matches(m(x), group_norm_ref(x, 2, 0.5, m.weight, m.bias), 8)


def test_gn_groups_must_divide_a_conv_or_linear_width_but_not_the_feature_sites() -> None:
    norm = create_norm("gn", {"groups": 4})
    with pytest.raises(ConfigError, match=r"model\.norm\.groups\b") as err:
        norm.make("linear", 10)
    assert "linear" in str(err.value) and "10" in str(err.value)
    with pytest.raises(ConfigError, match=r"model\.norm\.groups\b"):
        norm.make("conv", 6)
    assert isinstance(norm.make("feature", 10), nn.Identity)  # nothing normalises there: no width to divide


# --- bn ---------------------------------------------------------------------------------------------------------


def batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per channel (dim 1) over every other dim, in float64: mean, biased and unbiased variance."""
    x = x.to(F64)
    dims = tuple(d for d in range(x.dim()) if d != 1)
    n = x.numel() // x.shape[1]
    mu = x.mean(dims)
    biased = ((x - per_channel(mu, x)) ** 2).mean(dims)
    return mu, biased, biased * n / (n - 1)


@pytest.mark.parametrize(("site", "shape"), [("conv", (4, 3, 2, 2)), ("linear", (8, 5))])
def test_bn_trains_on_batch_statistics_and_moves_its_running_ones_by_momentum(
    site: str, shape: tuple[int, ...]
) -> None:
    m = randomise_affine(create_norm("bn").make(site, shape[1]))  # momentum 0.1, eps 1e-5
    x = torch.randn(shape) * 2 + 1
    n = math.prod(shape) // shape[1]
    mu, biased, unbiased = batch_stats(x)
    expected = (x.to(F64) - per_channel(mu, x)) / torch.sqrt(per_channel(biased, x) + 1e-5)
    assert_matches(m(x), expected * per_channel(m.weight, x) + per_channel(m.bias, x), n)
    assert_matches(m.running_mean, 0.9 * 0.0 + 0.1 * mu, n)
    assert_matches(m.running_var, 0.9 * 1.0 + 0.1 * unbiased, n)
    assert m.num_batches_tracked.item() == 1
    # eval: the running statistics, left as they are
    m.eval()
    x2 = torch.randn(shape)
    r_mu, r_var = m.running_mean.clone(), m.running_var.clone()
    expected = (x2.to(F64) - per_channel(r_mu, x2)) / torch.sqrt(per_channel(r_var, x2) + 1e-5)
    assert_matches(m(x2), expected * per_channel(m.weight, x2) + per_channel(m.bias, x2), n)
    assert torch.equal(m.running_mean, r_mu) and torch.equal(m.running_var, r_var)


def test_bn_momentum_null_is_the_cumulative_average_of_the_batches() -> None:
    m = create_norm("bn", {"momentum": None, "eps": 0.5}).make("conv", 3)
    assert m.momentum is None and m.eps == 0.5
    a, b = torch.randn(4, 3, 2, 2) * 2 + 1, torch.randn(4, 3, 2, 2) - 1
    m(a)
    m(b)
    (mu_a, _, u_a), (mu_b, _, u_b) = batch_stats(a), batch_stats(b)
    assert_matches(m.running_mean, (mu_a + mu_b) / 2, 16)
    assert_matches(m.running_var, (u_a + u_b) / 2, 16)  # the initial 1 is not averaged in
