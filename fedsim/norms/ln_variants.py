"""LN relatives: scale, ln_reduced, rms, pln and the SMOOTH scale functions ln_clamped,
ln_goldschmidt, ln_randomized (LN-FL Props. 1-2, Table 3; PLN def. 1, §4.2; SMOOTH routes 2-3).

Most of them share one host, :class:`ScaledNorm`: ``y = (x - μ)·s(v)·γ + β`` with per-sample
statistics over every non-batch dim (as ``ln``: GroupNorm(1, C) on NCHW), where only ``s``
changes. Statistics are float32 at least; ε sits inside the root, s(v) = (v + ε)^-½.
Hyper-parameters are plain attributes (never parameters or buffers), so only γ, β and genuine
running statistics reach the state dict that FedAvg averages.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated, Any, TypeVar

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms.base import NORMS, Eps, Normaliser, Sigma, Site
from fedsim.norms.basic import FeatureNorm

T = TypeVar("T")


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 at least: half-precision sums of squares overflow and lose the small variances."""
    return torch.promote_types(x.dtype, torch.float32)


def channel_affine(y: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``y·γ + β`` with γ, β per channel (dim 1), as GroupNorm's affine."""
    shape = (1, -1) + (1,) * (y.dim() - 2)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y


class ScaledNorm(nn.Module):
    """``(x - μ)·s(v)·γ + β`` per sample over all non-batch dims; subclasses define ``s`` (SMOOTH §1.1).

    ``center=False`` drops μ, so v is the mean square (RMS host). v is the biased variance.
    """

    def __init__(
        self, num_features: int, center: bool = True, weight: bool = True, bias: bool = True
    ) -> None:
        super().__init__()
        self.num_features, self.center = num_features, center
        self.weight = nn.Parameter(torch.ones(num_features)) if weight else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if bias else None

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        """s(v), elementwise on the (N, 1, ...) statistic tensor; the LN choice is (v + ε)^-½."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(stats_dtype(x))
        dims = tuple(range(1, x.dim()))
        if self.center:
            h = h - h.mean(dims, keepdim=True)
        # mean of squares, not torch.var: its gradient 2(x - μ)/n stays 0 at zero variance.
        v = h.square().mean(dims, keepdim=True)
        return channel_affine((h * self.scale(v)).to(x.dtype), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.num_features}, center={self.center}, affine={self.weight is not None}"


class EpsNorm(ScaledNorm):
    """LayerNorm (center) or RMSNorm (no center): s(v) = (v + ε)^-½."""

    def __init__(self, num_features: int, eps: float, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        self.eps = eps

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(v + self.eps)


class ClampedNorm(EpsNorm):
    """s(v) = max(ε, v)^-½ (SMOOTH table): exactly scale invariant once v ≥ ε; ds/dv = 0 below."""

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(v.clamp_min(self.eps))


def goldschmidt_rsqrt(v: T, y0: Any, steps: int) -> T:
    """``steps`` Goldschmidt iterations for v^-½ from the guess y0 (SMOOTH route 3).

    Equal in exact arithmetic to Newton's y ← y(3 - v·y²)/2: with y0 fixed, a polynomial in v of
    degree (3^steps - 1)/2 with fixed point y(1/y0²) = y0. Only +, -, * are used, so ``v`` may be
    a tensor, a float or a ``numpy.polynomial.Polynomial`` (how the tests check the degree).
    """
    g, h = v * y0, y0 * 0.5  # g → √v, h → 1/(2√v)
    for _ in range(steps):
        r = 0.5 - g * h
        g, h = g + g * r, h + h * r
    return 2 * h


class GoldschmidtNorm(EpsNorm):
    """s(v) = Goldschmidt(v + ε) from y0 = (r + ε)^-½, r a detached running mean of v (a buffer).

    ``delta_range=(lo, hi)`` clamps δ = (v + ε)·y0² into [lo, hi] per sample by rescaling y0
    (detached) before iterating; ``None`` keeps the pure polynomial, which flips sign for δ > 3
    and diverges for δ > 5.
    """

    def __init__(
        self, num_features: int, eps: float, steps: int, momentum: float,
        delta_range: tuple[float, float] | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(num_features, eps, **kwargs)
        self.steps, self.momentum, self.delta_range = steps, momentum, delta_range
        # A genuine running statistic, so a persistent buffer: it travels and FedAvg averages it,
        # like BN's running_var. 0 means "not estimated yet".
        self.register_buffer("running_var", torch.zeros(()))

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        r = self.running_var
        batch = v.detach().mean().to(r.dtype)
        # y0 from the estimate *before* this batch, so s stays a polynomial in the current v;
        # the first batch (and eval before any training) falls back to the batch's own mean.
        y0 = torch.rsqrt(torch.where(r > 0, r, batch) + self.eps).to(v.dtype)
        if self.training:
            with torch.no_grad():
                r.copy_(torch.where(r > 0, torch.lerp(r, batch, self.momentum), batch))
        ve = v + self.eps
        if self.delta_range is not None:
            delta = ve.detach() * y0.square()
            y0 = y0 * torch.sqrt(delta.clamp(*self.delta_range) / delta)
        return goldschmidt_rsqrt(ve, y0, self.steps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, steps={self.steps}, delta_range={self.delta_range}"


class RandomizedNorm(EpsNorm):
    """s(v) = (max(0, v + ξ) + ε)^-½, ξ ~ N(0, σ²) per sample in training; (v + ε)^-½ in eval.

    A :class:`~fedsim.norms.base.NoiseSource`: ξ comes from a per-module ``torch.Generator`` once
    :meth:`reseed` (see :func:`~fedsim.norms.base.seed_norm_noise`) has run, else from torch's global RNG.
    """

    def __init__(self, num_features: int, eps: float, sigma: float, **kwargs: Any) -> None:
        super().__init__(num_features, eps, **kwargs)
        self.sigma = sigma
        self._seed: int | None = None
        self._generator: torch.Generator | None = None  # plain attribute: never in the state dict

    def reseed(self, seed: int) -> None:
        """Restart this module's noise stream from ``seed`` (the generator is made on first use)."""
        self._seed, self._generator = seed, None

    def _rng(self, device: torch.device) -> torch.Generator | None:
        if self._seed is None:
            return None
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self._seed)
        return self._generator

    def scale(self, v: torch.Tensor) -> torch.Tensor:
        if self.training and self.sigma > 0:
            xi = torch.randn(v.shape, generator=self._rng(v.device), device=v.device, dtype=v.dtype)
            v = (v + self.sigma * xi).clamp_min(0)
        return torch.rsqrt(v + self.eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sigma={self.sigma}"


class MeanShift(nn.Module):
    """s(x) = x - μ(x) per sample over all non-batch dims (LN-FL's shift operator, Prop. 2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(stats_dtype(x))
        return (h - h.mean(tuple(range(1, x.dim())), keepdim=True)).to(x.dtype)


class ParallelNorm(nn.Module):
    """PLN-d (center) / PLS-d: LN on contiguous groups of d features or channels (PLN def. 1).

    Statistics per sample *and per pixel* on NCHW (Channel-PLN, PLN §4.2): this pools d channels
    only, never H x W, so it is not GroupNorm when H·W > 1. γ, β per feature / channel.
    """

    def __init__(self, num_features: int, group_size: int, eps: float, center: bool, affine: bool) -> None:
        super().__init__()
        self.num_features, self.group_size, self.eps, self.center = num_features, group_size, eps, center
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.to(stats_dtype(x)).movedim(1, -1).unflatten(-1, (-1, self.group_size))
        if self.center:
            g = g - g.mean(-1, keepdim=True)
        g = g * torch.rsqrt(g.square().mean(-1, keepdim=True) + self.eps)
        return channel_affine(g.flatten(-2).movedim(-1, 1).to(x.dtype), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.num_features}, group_size={self.group_size}, center={self.center}, eps={self.eps}"


# --- the normalisers -------------------------------------------------------------------------


class LNHost(Normaliser):
    """Base of the LN variants with another s(v): :meth:`module` at conv and hidden linear sites.

    Identity at the feature site, as ``ln``: the last hidden site already normalises it.
    ``center: false`` turns the LN host into an RMS host.
    """

    class Params(Normaliser.Params):
        affine: bool = True
        center: bool = True

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        if site == "feature":
            return nn.Identity()
        p = self.params
        return self.module(num_features, center=p.center, weight=p.affine, bias=p.affine)

    @abstractmethod
    def module(self, num_features: int, **host: bool) -> nn.Module:
        """The ScaledNorm for ``num_features`` channels / features; ``host``: its center and affine flags."""


@NORMS.register("scale")
class Scale(Normaliser):
    """Scale-normalise after every layer, n^L: √d·x/max(ε, ‖x‖) at every site (LN-FL Table 3).

    The ``fn`` module at conv (over C,H,W), hidden linear and feature sites. By LN-FL Prop. 1
    it equals ``fn`` for bias-free ReLU nets; the feature site (idempotent after a linear
    site) makes the feature scale-normalised in ResNet too, where a conv site precedes it.
    """

    class Params(Normaliser.Params):
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        return FeatureNorm(self.params.eps)


@NORMS.register("ln_reduced")
class LNReduced(Normaliser):
    """MV-normalise the feature, only mean-shift the other sites, n_MV s^(L-1) (LN-FL Prop. 2).

    Conv and hidden linear sites: parameterless shift x - μ(x) per sample. Feature site: LN
    (γ, β unless ``affine: false``), which equals LN-FL's n_MV of the last layer since LN is
    shift invariant. In ResNet every conv site is shifted, so there it is *not* equivalent to
    ``ln``: LN-FL eq. 11 keeps n_MV inside each block, and a site cannot tell a block's inner
    norm from its outer one (the models must not special-case normalisers).
    """

    class Params(Normaliser.Params):
        affine: bool = True
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        if site != "feature":
            return MeanShift()
        p = self.params
        return EpsNorm(num_features, p.eps, weight=p.affine, bias=p.affine)


@NORMS.register("rms")
class RMS(Normaliser):
    """RMSNorm x·(mean(x²) + ε)^-½·γ at conv and hidden linear sites (SMOOTH, AFFDIV, ISO).

    Conv sites pool (C,H,W) per sample like ``ln`` with γ per channel; linear sites equal
    ``nn.RMSNorm(D, eps)``. No β (``affine: false`` drops γ too). Identity at the feature site.
    """

    class Params(Normaliser.Params):
        affine: bool = True
        eps: Eps = 1e-5

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        if site == "feature":
            return nn.Identity()
        return EpsNorm(num_features, self.params.eps, center=False, weight=self.params.affine, bias=False)


@NORMS.register("pln")
class PLN(Normaliser):
    """Parallel LN: LN on contiguous groups of ``group_size`` channels, per sample and pixel (PLN def. 1).

    Conv sites: Channel-PLN (PLN §4.2); hidden linear sites: PLN-d over D. Identity at the
    feature site, as ``ln``. ``center: false`` gives PLS. ``group_size`` must divide every width,
    and must be ≥ 2 with centering (PLN-1 outputs 0 identically).
    """

    class Params(Normaliser.Params):
        group_size: int = Field(8, ge=1)
        center: bool = True
        affine: bool = True
        eps: Eps = 1e-5

        @model_validator(mode="after")
        def _not_identically_zero(self) -> PLN.Params:
            if self.center and self.group_size == 1:
                raise ValueError(
                    "group_size = 1 with centering gives 0 everywhere (each group is its own mean); "
                    "use group_size >= 2, or center: false (PLS-1)"
                )
            return self

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        p = self.params
        if site == "feature":
            return nn.Identity()
        if num_features % p.group_size:
            raise ConfigError(
                f"model.norm.group_size = {p.group_size} for norm 'pln' does not divide the "
                f"{num_features} features of a {site} site"
            )
        return ParallelNorm(num_features, p.group_size, p.eps, p.center, p.affine)


@NORMS.register("ln_clamped")
class LNClamped(LNHost):
    """LN with s(v) = max(ε, v)^-½ instead of (v + ε)^-½ (SMOOTH table, ε-clamped).

    Sites as ``ln``: conv (over C,H,W) and hidden linear; Identity at the feature site.
    """

    class Params(LNHost.Params):
        eps: Eps = 1e-5

    params: Params

    def module(self, num_features: int, **host: bool) -> nn.Module:
        return ClampedNorm(num_features, self.params.eps, **host)


@NORMS.register("ln_goldschmidt")
class LNGoldschmidt(LNHost):
    """LN with ``steps`` Goldschmidt/Newton steps for (v + ε)^-½ from a running y0 (SMOOTH route 3).

    Sites as ``ln``. y0 = (r + ε)^-½ with r the detached running mean of v (buffer
    ``running_var``, ``momentum``; the first training batch sets it). With y0 fixed, s is a
    polynomial of degree (3^steps - 1)/2 in v, accurate only while δ = v·y0² stays in the band
    of docs/normalizers.md (steps 4: [0.48, 1.64] for 1e-6), and δ > 3 flips its sign: one SGD step can
    move v 10x past r. ``delta_range`` (default [0.25, 2], error < 2^-8 at steps 4) clamps δ
    per sample by rescaling y0, detached, so training stays finite; ``null`` is the pure form.
    """

    class Params(LNHost.Params):
        steps: int = Field(4, ge=1, le=8)
        momentum: float = Field(0.1, gt=0, le=1)
        delta_range: tuple[float, float] | None = (0.25, 2.0)
        eps: Eps = 1e-5

        @field_validator("delta_range")
        @classmethod
        def _convergent(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
            if band is not None and not 0 < band[0] <= band[1] < 3:
                raise ValueError("needs 0 < lo <= hi < 3 (the iteration converges to +v^-1/2 for 0 < δ < 3)")
            return band

    params: Params

    def module(self, num_features: int, **host: bool) -> nn.Module:
        p = self.params
        return GoldschmidtNorm(num_features, p.eps, p.steps, p.momentum, p.delta_range, **host)


@NORMS.register("ln_randomized")
class LNRandomized(LNHost):
    """LN with s = (max(0, v + ξ) + ε)^-½, ξ ~ N(0, σ²) in training, ξ = 0 in eval (SMOOTH route 2).

    Sites as ``ln``. One ξ per sample and site, redrawn every forward pass; σ is in units of v.
    A noisy regulariser: E[s] is not the Weierstrass f̃σ (it is ≈ ε^-½/2 at v = 0). Eval is
    plain LN. Seeding: call :func:`~fedsim.norms.base.seed_norm_noise` (model, seed) at the start of each local
    round with a per-client, per-round seed (fedsim's ``round_seed``); until then ξ comes from
    torch's global RNG, reproducible only under ``torch.manual_seed``.
    """

    class Params(LNHost.Params):
        sigma: Annotated[Sigma, Field(ge=0)] = 1e-3
        eps: Eps = 1e-5

    params: Params

    def module(self, num_features: int, **host: bool) -> nn.Module:
        return RandomizedNorm(num_features, self.params.eps, self.params.sigma, **host)
