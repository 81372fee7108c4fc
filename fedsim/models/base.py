"""The model contract (:class:`FedsimModel`: feature extractor + ``classifier``) and its registry;
:mod:`fedsim.models` says how models and normalisers meet.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from fedsim.norms import Normaliser
from fedsim.registry import PluginParams, Registry

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def act_norm(
    x: torch.Tensor, act: nn.Module, norm: nn.Module, position: Literal["after", "before"]
) -> torch.Tensor:
    """``norm(act(x))`` for ``position="after"`` (LN-FL's placement), else ``act(norm(x))``."""
    return norm(act(x)) if position == "after" else act(norm(x))


class FedsimModel(nn.Module):
    """Base of every model: ``forward(x) = forward_head(forward_features(x))``.

    Subclasses extend the nested ``Params`` (the YAML ``model: {name: ..., <options>}`` schema;
    unknown keys are errors) and implement :meth:`build`, which makes their layers with
    ``normaliser.conv`` / ``normaliser.linear`` / ``normaliser.make`` and sets ``feature_dim`` and
    ``classifier``; ``params``, ``num_classes`` and ``in_shape`` are set before it runs.
    """

    class Params(PluginParams):
        # No biases by default: LN-FL Assumption 1 (scale-equivariance of the network).
        bias: bool = False
        activation: Literal["relu", "tanh", "gelu"] = "relu"
        # LN-FL puts the norm after the activation; "before" is the conventional conv-norm-act.
        norm_position: Literal["after", "before"] = "after"
        # MOON's projection head (Li et al. 2021, Sec. 3.2): features -> width -> act -> this, under the classifier
        projection: int | None = Field(None, ge=1)

    params: Params
    feature_dim: int
    classifier: nn.Module
    projector: nn.Module | None

    def __init__(
        self, params: Params, num_classes: int, in_shape: tuple[int, int, int], normaliser: Normaliser
    ) -> None:
        super().__init__()
        self.params = params
        self.num_classes = num_classes
        self.in_shape = tuple(in_shape)
        self.act = ACTIVATIONS[self.params.activation]()  # stateless: one instance serves every site
        self.build(normaliser)
        self.projector = None
        if params.projection is not None:
            self.build_projection(normaliser, params.projection)

    def build_projection(self, normaliser: Normaliser, width: int) -> None:
        """MOON's projection head between the features and a classifier on its ``width`` outputs: two linear
        layers (``feature_dim`` -> ``feature_dim`` -> ``width``) with the model's activation between."""
        d, bias = self.feature_dim, self.params.bias
        self.projector = nn.Sequential(normaliser.linear(d, d, bias), self.act, normaliser.linear(d, width, bias))
        self.classifier = normaliser.linear(width, self.num_classes, bias)

    def build(self, normaliser: Normaliser) -> None:
        """Make the layers, taking every normalisation site and layer from ``normaliser``."""
        raise NotImplementedError

    def build_dense(self, normaliser: Normaliser, dims: list[int]) -> None:
        """Hidden linear layers ``dims[0] -> ... -> dims[-1]`` (each: act, "linear" norm), the "feature" norm
        and the classifier: the fully connected end of the CNN and the MLP."""
        bias = self.params.bias
        self.fcs = nn.ModuleList(normaliser.linear(i, o, bias) for i, o in itertools.pairwise(dims))
        self.fc_norms = nn.ModuleList(normaliser.make("linear", o) for o in dims[1:])
        self.feature_dim = dims[-1]
        self.feature_norm = normaliser.make("feature", self.feature_dim)
        self.classifier = normaliser.linear(self.feature_dim, self.num_classes, bias)

    def forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        """The layers of :meth:`build_dense` up to the feature norm, on flattened ``x``."""
        for fc, fc_norm in zip(self.fcs, self.fc_norms, strict=True):
            x = self.act_norm(fc(x), fc_norm)
        return self.feature_norm(x)

    def act_norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """Activation and the site's norm, in the order ``params.norm_position`` asks for."""
        return act_norm(x, self.act, norm, self.params.norm_position)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The N x ``feature_dim`` feature entering the classifier, after the feature-site norm."""
        raise NotImplementedError

    def project(self, z: torch.Tensor) -> torch.Tensor:
        """The classifier's input from features: the projection head's output, or the features without one."""
        return z if self.projector is None else self.projector(z)

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        """Logits from features."""
        return self.classifier(self.project(z))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


MODELS: Registry[FedsimModel] = Registry("models", FedsimModel)


def get_model(name: str) -> type[FedsimModel]:
    """The model class for a registered name, entry point or ``package.module:Name`` path."""
    return MODELS.get(name)


def create_model(
    name: str,
    num_classes: int,
    in_shape: tuple[int, int, int],
    normaliser: Normaliser,
    options: Mapping[str, Any] | None = None,
) -> FedsimModel:
    """Model ``name`` for ``num_classes`` classes and C x H x W inputs, with YAML options ``options``."""
    return MODELS.resolve(name, options, "model").create(num_classes, in_shape, normaliser)


def list_models() -> list[str]:
    """Every registered model name (built-ins and installed plugins)."""
    return MODELS.names()
