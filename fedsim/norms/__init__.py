"""Normaliser registry: a normaliser decides *what* each normalisation site is; models decide *where*.

A normaliser is a :class:`Normaliser` subclass registered in :data:`NORMS` under a name, with its
hyper-parameters in a nested ``Params`` (YAML ``model.norm: {name: gn, groups: 2}``; they are
config, never learnable) and built as ``Normaliser(params)``. A model calls, at build time:

- ``normaliser.make(site, num_features)`` at every normalisation site, where ``site`` is one of
  ``"conv"`` (after a conv activation, NCHW), ``"linear"`` (after a hidden linear activation,
  N x D) and ``"feature"`` (the feature that enters the classifier, N x D; one per model; before the projection head
  of a model with ``projection``);
- ``normaliser.linear(in_features, out_features, bias)`` and ``normaliser.conv(in_ch, out_ch,
  kernel_size, stride, padding, bias)`` to build its layers, so layer-replacing normalisers
  (PatchNorm, affine_like) plug in through the same registry.

Each normaliser's formula and source: docs/normalizers.md.

Noise: a module that draws random noise in training (``ln_randomized``) implements :class:`NoiseSource`
(``reseed(seed)``); the client calls :func:`seed_norm_noise` (model, seed) at the start of every local round
with its per-client, per-round seed, which gives each such module a stream of its own, so the noise is the
same whichever process trains the client. The client knows no particular normaliser.

Marking: every module a normaliser returns from ``make()`` gets the attribute
:data:`NORM_SITE_ATTR` (``fedsim_norm_site``) set to its site, so code that must treat
normalisation specially (FedBN keeps it local) asks :func:`is_norm_module` /
:func:`norm_modules` instead of testing for concrete classes such as ``BatchNorm2d``. The base
class applies the mark around any subclass's ``make()`` (plugins included), except on
``nn.Identity`` placeholders, which hold no state. Layers from ``linear()`` / ``conv()`` are not
marked: their weights are ordinary model weights.
"""

from __future__ import annotations

from fedsim.norms import affine_divergence, basic, ln_variants, weierstrass  # noqa: F401 (the built-ins register themselves on import)
from fedsim.norms.base import (
    NORM_SITE_ATTR,
    NORMS,
    SITES,
    NoiseSource,
    Normaliser,
    Site,
    create_norm,
    draws_own_noise,
    get_norm,
    is_norm_module,
    list_norms,
    norm_modules,
    seed_norm_noise,
)

__all__ = [
    "NORM_SITE_ATTR",
    "NORMS",
    "SITES",
    "NoiseSource",
    "Normaliser",
    "Site",
    "create_norm",
    "draws_own_noise",
    "get_norm",
    "is_norm_module",
    "list_norms",
    "norm_modules",
    "seed_norm_noise",
]
