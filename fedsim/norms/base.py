"""The normaliser contract (:class:`Normaliser`, and :class:`NoiseSource` for modules that draw their own
noise) and its registry; :mod:`fedsim.norms` says how a normaliser plugs into a model.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, Literal, Protocol, get_args

import numpy as np
from pydantic import Field
from torch import nn

from fedsim.registry import PluginParams, Registry

Site = Literal["conv", "linear", "feature"]
SITES: tuple[str, ...] = get_args(Site)
NORM_SITE_ATTR = "fedsim_norm_site"

# A normaliser's eps, added to the statistic it divides by (a variance, a squared norm): beyond 1 it outweighs
# that of features scaled to about 1, the normaliser stops normalising and shrinks every output towards 0
Eps = Annotated[float, Field(gt=0, le=1)]

# A smoothing σ (ln_weierstrass, ln_randomized) is in units of v, the variance it smooths: f̃σ(v) = σ^-½ F(v/σ) is
# within 1% of 1/√v only for v > 6.3σ and is ≈ 0.86/√σ, a constant, for v ≪ σ. Beyond 1, σ outweighs the variance
# of features scaled to about 1, so the norm stops normalising and shrinks every site's output by ~√σ, towards a
# constant model. ln_randomized's ξ ~ N(0, σ²) likewise drowns v beyond 1
Sigma = Annotated[float, Field(le=1)]


class Normaliser(ABC):
    """Base of every normaliser: builds the module at each normalisation site and the layers.

    Subclasses declare their hyper-parameters once, in a nested ``Params`` deriving from
    ``Normaliser.Params``, and implement :meth:`make`. Override :meth:`linear` / :meth:`conv` only
    to replace layers (AFFDIV's affine_like, PatchNorm).
    """

    Params = PluginParams
    params: Any

    def __init__(self, params: PluginParams) -> None:
        self.params = params

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        impl = cls.__dict__.get("make")
        # Wrap here, not in the models, so a plugin's modules are marked without its cooperation.
        if impl is not None and not getattr(impl, "_fedsim_marks", False):
            cls.make = _marking(impl)  # type: ignore[method-assign]

    @abstractmethod
    def make(self, site: Site, num_features: int) -> nn.Module:
        """The module applied at a ``site`` with ``num_features`` channels / features."""

    def linear(self, in_features: int, out_features: int, bias: bool) -> nn.Module:
        """A fully connected layer; plain ``nn.Linear`` unless the normaliser replaces layers."""
        return nn.Linear(in_features, out_features, bias=bias)

    def conv(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        bias: bool = False,
    ) -> nn.Module:
        """A 2-d convolution; plain ``nn.Conv2d`` unless the normaliser replaces layers."""
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


def _marking(impl: Callable[[Any, Site, int], nn.Module]) -> Callable[[Any, Site, int], nn.Module]:
    @functools.wraps(impl)
    def make(self: Normaliser, site: Site, num_features: int) -> nn.Module:
        if site not in SITES:  # a model bug, not a config error
            raise ValueError(f"unknown normalisation site {site!r}; valid: {', '.join(SITES)}")
        module = impl(self, site, num_features)
        if not isinstance(module, nn.Identity):
            setattr(module, NORM_SITE_ATTR, site)
        return module

    make._fedsim_marks = True  # type: ignore[attr-defined]
    return make


def is_norm_module(m: nn.Module) -> bool:
    """True for a module some normaliser's ``make()`` returned (other than an Identity placeholder)."""
    return getattr(m, NORM_SITE_ATTR, None) is not None


def norm_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, module)`` for every normalisation module in ``model`` (FedBN's question)."""
    return ((name, m) for name, m in model.named_modules() if is_norm_module(m))


class NoiseSource(Protocol):
    """A module a normaliser makes that draws random noise in training (``ln_randomized``'s ξ) from a stream of its
    own. Seeded through :func:`seed_norm_noise`, its noise depends on the seed alone, not on which process runs it
    nor on what drew from torch's global RNG before; until seeded, it may draw from torch's global RNG."""

    def reseed(self, seed: int) -> None:
        """Restart this module's noise stream from ``seed``."""


def draws_own_noise(module: nn.Module) -> bool:
    """True for a module that implements :class:`NoiseSource` (a ``reseed(seed)`` method)."""
    return callable(getattr(module, "reseed", None))


def seed_norm_noise(model: nn.Module, seed: int) -> int:
    """Seed every :class:`NoiseSource` module of ``model`` from one ``seed``; returns how many there are.

    Each module gets its own stream, derived from (seed, its index among them in ``model.modules()``), so a
    client that calls this at the start of each round with a per-client, per-round seed reproduces its noise
    whatever process runs it. A model without such modules is left as it is.
    """
    targets = [m for m in model.modules() if draws_own_noise(m)]
    for k, m in enumerate(targets):
        m.reseed(int(np.random.SeedSequence([seed, k]).generate_state(1)[0]))
    return len(targets)


NORMS: Registry[Normaliser] = Registry("norms", Normaliser)


def get_norm(name: str) -> type[Normaliser]:
    """The normaliser class for a registered name, entry point or ``package.module:Name`` path."""
    return NORMS.get(name)


def create_norm(name: str, options: Mapping[str, Any] | None = None) -> Normaliser:
    """Normaliser ``name`` with YAML options ``options`` (``model.norm: {name: ..., <options>}``)."""
    return NORMS.resolve(name, options, "model.norm").create()


def list_norms() -> list[str]:
    """Every registered normaliser name (built-ins and installed plugins)."""
    return NORMS.names()
