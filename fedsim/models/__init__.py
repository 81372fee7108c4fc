"""Model registry and the :class:`FedsimModel` base: feature extractor + ``classifier``.

Models decide *where* the normalisation sites are and take *what* they are from a
:class:`~fedsim.norms.Normaliser` resolved once, at the boundary (:func:`create_model`). Every
model ends ``... -> [norm "feature"] -> classifier``, so strategies and diagnostics can reach the
feature g_θ(x) (:meth:`FedsimModel.forward_features`) and the class embeddings w_c (the rows of
``classifier.weight``) uniformly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from fedsim.config import validate_options
from fedsim.errors import ConfigError, RegistryError
from fedsim.norms import Normaliser
from fedsim.registry import Registry

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def act_norm(
    x: torch.Tensor, act: nn.Module, norm: nn.Module, position: Literal["after", "before"]
) -> torch.Tensor:
    """``norm(act(x))`` for ``position="after"`` (LN-FL's placement), else ``act(norm(x))``."""
    return norm(act(x)) if position == "after" else act(norm(x))


class FedsimModel(nn.Module):
    """Base of every model: ``forward(x) = forward_head(forward_features(x))``.

    Subclasses extend the nested ``Params`` (the YAML ``model.args`` schema; unknown keys are
    errors), call ``super().__init__`` first, then build their layers with ``norm.conv`` /
    ``norm.linear`` / ``norm.norm`` and set ``feature_dim`` and ``classifier``.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        # No biases by default: LN-FL Assumption 1 (scale-equivariance of the network).
        bias: bool = False
        activation: Literal["relu", "tanh", "gelu"] = "relu"
        # LN-FL puts the norm after the activation; "before" is the conventional conv-norm-act.
        norm_position: Literal["after", "before"] = "after"

    params: Params
    feature_dim: int
    classifier: nn.Module

    def __init__(
        self, num_classes: int, in_shape: tuple[int, int, int], norm: Normaliser, **args: Any
    ) -> None:
        super().__init__()
        self.params = validate_options(self.Params, args, "model.args", owner=f"model {self.name()!r}")
        self.num_classes = num_classes
        self.in_shape = tuple(in_shape)
        self.act = ACTIVATIONS[self.params.activation]()  # stateless: one instance serves every site

    @classmethod
    def name(cls) -> str:
        """The registered name (for messages), else the ``module:Class`` path."""
        for entry in MODELS:
            if entry.obj is cls:
                return entry.name
        return f"{cls.__module__}:{cls.__qualname__}"

    def act_norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """Activation and the site's norm, in the order ``params.norm_position`` asks for."""
        return act_norm(x, self.act, norm, self.params.norm_position)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The N x ``feature_dim`` feature entering the classifier, after the feature-site norm."""
        raise NotImplementedError

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        """Logits from features."""
        return self.classifier(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


MODELS: Registry[type[FedsimModel]] = Registry("models")


def get_model(name: str) -> type[FedsimModel]:
    """The model class for a registered name, entry point or ``package.module:Name`` path."""
    cls = MODELS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, FedsimModel)):
        raise RegistryError(f"model {name!r} is {cls!r}, not a fedsim.models.FedsimModel subclass")
    return cls


def create_model(
    name: str,
    num_classes: int,
    in_shape: tuple[int, int, int],
    norm: Normaliser,
    args: Mapping[str, Any] | None = None,
) -> FedsimModel:
    """Build model ``name`` for ``num_classes`` classes and C x H x W inputs with YAML ``model.args``."""
    cls = get_model(name)
    if args is None:
        args = {}
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise ConfigError(f"model.args for model {name!r} must be a mapping with string keys")
    return cls(num_classes, in_shape, norm, **args)


def list_models() -> list[str]:
    """Every registered model name (built-ins and installed plugins)."""
    return MODELS.names()


# Registration happens on import; kept last because the model modules import from this one.
from fedsim.models import cnn as _cnn  # noqa: F401
from fedsim.models import mlp as _mlp  # noqa: F401
from fedsim.models import resnet as _resnet  # noqa: F401
