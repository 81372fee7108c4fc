"""Normaliser registry: a normaliser decides *what* each normalisation site is; models decide *where*.

A normaliser is a :class:`Normaliser` subclass registered in :data:`NORMS` under a name. Its
constructor takes the YAML ``model.norm_args`` as keyword arguments (hyper-parameters: config,
never learnable). A model calls, at build time:

- ``norm.norm(site, num_features)`` at every normalisation site, where ``site`` is one of
  ``"conv"`` (after a conv activation, NCHW), ``"linear"`` (after a hidden linear activation,
  N x D) and ``"feature"`` (the feature that enters the classifier, N x D; one per model);
- ``norm.linear(in_features, out_features, bias)`` and ``norm.conv(in_ch, out_ch, kernel_size,
  stride, padding, bias)`` to build its layers, so layer-replacing normalisers (PatchNorm,
  affine_like) plug in through the same registry.

Marking: every module a normaliser returns from ``norm()`` gets the attribute
:data:`NORM_SITE_ATTR` (``fedsim_norm_site``) set to its site, so code that must treat
normalisation specially (FedBN keeps it local) asks :func:`is_norm_module` /
:func:`norm_modules` instead of testing for concrete classes such as ``BatchNorm2d``. The base
class applies the mark around any subclass's ``norm()`` (plugins included), except on
``nn.Identity`` placeholders, which hold no state. Layers from ``linear()`` / ``conv()`` are not
marked: their weights are ordinary model weights.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict
from torch import nn

from fedsim.config import validate_options
from fedsim.errors import ConfigError, RegistryError
from fedsim.registry import Registry

Site = Literal["conv", "linear", "feature"]
SITES: tuple[str, ...] = get_args(Site)
NORM_SITE_ATTR = "fedsim_norm_site"

P = TypeVar("P", bound=BaseModel)


class Normaliser(ABC):
    """Base of every normaliser: builds the module at each normalisation site and the layers.

    Subclasses declare their hyper-parameters once, in a nested ``Params`` model deriving from
    ``Normaliser.Params`` (unknown keys are errors), and implement :meth:`norm`. Override
    :meth:`linear` / :meth:`conv` only to replace layers (AFFDIV's affine_like, PatchNorm).
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

    params: Params

    def __init__(self, **args: Any) -> None:
        self.params = validate_options(self.Params, args, "model.norm_args", owner=f"norm {self.name()!r}")

    @classmethod
    def name(cls) -> str:
        """The registered name (for messages), else the ``module:Class`` path a YAML file would use."""
        for entry in NORMS:
            if entry.obj is cls:
                return entry.name
        return f"{cls.__module__}:{cls.__qualname__}"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        impl = cls.__dict__.get("norm")
        # Wrap here, not in the models, so a plugin's modules are marked without its cooperation.
        if impl is not None and not getattr(impl, "_fedsim_marks", False):
            cls.norm = _marking(impl)  # type: ignore[method-assign]

    @abstractmethod
    def norm(self, site: Site, num_features: int) -> nn.Module:
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
    def norm(self: Normaliser, site: Site, num_features: int) -> nn.Module:
        if site not in SITES:  # a model bug, not a config error
            raise ValueError(f"unknown normalisation site {site!r}; valid: {', '.join(SITES)}")
        module = impl(self, site, num_features)
        if not isinstance(module, nn.Identity):
            setattr(module, NORM_SITE_ATTR, site)
        return module

    norm._fedsim_marks = True  # type: ignore[attr-defined]
    return norm


def is_norm_module(m: nn.Module) -> bool:
    """True for a module some normaliser's ``norm()`` returned (other than an Identity placeholder)."""
    return getattr(m, NORM_SITE_ATTR, None) is not None


def norm_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, module)`` for every normalisation module in ``model`` (FedBN's question)."""
    return ((name, m) for name, m in model.named_modules() if is_norm_module(m))


NORMS: Registry[type[Normaliser]] = Registry("norms")


def get_norm(name: str) -> type[Normaliser]:
    """The normaliser class for a registered name, entry point or ``package.module:Name`` path."""
    cls = NORMS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Normaliser)):
        raise RegistryError(f"norm {name!r} is {cls!r}, not a fedsim.norms.Normaliser subclass")
    return cls


def create_norm(name: str, args: Mapping[str, Any] | None = None) -> Normaliser:
    """Instantiate normaliser ``name`` with the YAML ``model.norm_args`` ``args``."""
    cls = get_norm(name)
    if args is None:
        args = {}
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise ConfigError(f"model.norm_args for norm {name!r} must be a mapping with string keys")
    return cls(**args)


def list_norms() -> list[str]:
    """Every registered normaliser name (built-ins and installed plugins)."""
    return NORMS.names()


# Registration happens on import; kept last because these modules import from this one.
from fedsim.norms import affine_divergence as _affine_divergence  # noqa: E402, F401
from fedsim.norms import basic as _basic  # noqa: E402, F401
from fedsim.norms import ln_variants as _ln_variants  # noqa: E402, F401
from fedsim.norms import weierstrass as _weierstrass  # noqa: E402, F401
