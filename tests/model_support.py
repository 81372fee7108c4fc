"""What the models' tests share (tests/test_models.py, test_cnn.py, test_mlp.py, test_resnet.py,
test_models_base.py, test_model_size.py): the input shapes, the built-in names, a model built by name with a
normaliser, its parameter count."""

from __future__ import annotations

from torch import nn

from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm

CIFAR, MNIST = (3, 32, 32), (1, 28, 28)
BUILTIN_NORMS = ["none", "ln", "fn", "gn", "bn"]
BUILTIN_MODELS = ["cnn", "mlp", "resnet18"]


def build(model: str, norm: str, in_shape=CIFAR, norm_options=None, **args) -> FedsimModel:
    return create_model(model, 10, in_shape, create_norm(norm, norm_options), args)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
