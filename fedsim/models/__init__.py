"""Model registry and the :class:`FedsimModel` base: feature extractor + ``classifier``.

Models decide *where* the normalisation sites are and take *what* they are from a
:class:`~fedsim.norms.Normaliser` resolved once, at the boundary (:func:`create_model`, or
:meth:`fedsim.experiment.resolve.Experiment.build_model`). Each model's layers: docs/algorithms.md. Every
model ends ``... -> [norm "feature"] -> classifier``, so strategies and diagnostics can reach the
feature g_θ(x) (:meth:`FedsimModel.forward_features`) and the class embeddings w_c (the rows of
``classifier.weight``) uniformly.
"""

from __future__ import annotations

from fedsim.models import cnn, mlp, resnet  # noqa: F401 (the built-ins register themselves on import)
from fedsim.models.base import (
    ACTIVATIONS,
    MODELS,
    FedsimModel,
    act_norm,
    create_model,
    get_model,
    list_models,
)

__all__ = [
    "ACTIVATIONS",
    "MODELS",
    "FedsimModel",
    "act_norm",
    "create_model",
    "get_model",
    "list_models",
]
