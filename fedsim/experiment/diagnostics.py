"""Diagnostics of the global model on a fixed probe batch (docs/normalizers.md, "Diagnostics").

Pure functions first, then :class:`ProbeDiagnostics`, which the ServerApp's ``RoundReporter``
calls: once with the initial arrays (round 0) and at every evaluation round, adding keys to
that round's ``metrics.jsonl`` line. Which diagnostics run is the ``diagnostics:`` config
section; by default none does and a run pays nothing.

- **Feature collapse** (LN-FL Fig. 3; FedDecorr, Shi et al. 2023): the singular values of the
  *uncentred* penultimate-feature matrix [g_θ(x_1), …, g_θ(x_n)] (as in LN-FL §4) and its
  effective rank (Roy & Vetterli 2007, below).
- **Norms** (LN-FL Fig. 3, Thm. 1): ‖g_θ(x)‖ per probe sample; ‖w_c‖ per class (rows of
  ``classifier.weight``).
- **Isometry** (ISO = Joudaki, Daneshmand & Bach, def. 1): I(G) = det(G)^{1/n} / (tr G / n) of the
  Gram of each layer's features, from eigenvalues in float64, in the log domain.
- **Initial gradient norms** (PLN = Ni et al. 2025, Table 2): ‖∂L/∂θ‖ per parameter tensor of
  the initial model, cross-entropy on the probe batch.

Per-layer features: a forward *pre*-hook on every ``nn.Linear`` / ``nn.Conv2d`` (the layer
replacements of ``l2``, ``affine_like`` and ``patchnorm`` subclass these) records the layer's
input, flattened per sample. Layer ℓ's features are therefore exactly what the weight layer
ℓ + 1 multiplies, x^ℓ in ISO eq. 1 (after activation, norm and pooling, whatever the model's
order), independent of whether a site's norm is an ``nn.Identity``; the first layer's entry is
the input images (ℓ = 0) and ``classifier``'s is the penultimate feature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from fedsim.arrays import load_arrays
from fedsim.config import PROBE_SIZE, DiagnosticsConfig
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import Experiment
from fedsim.models import FedsimModel

# ---------------------------------------------------------------- pure functions


def singular_values(features: torch.Tensor) -> torch.Tensor:
    """Singular values (descending, float64) of the n x D matrix of per-sample flattened features."""
    return torch.linalg.svdvals(features.detach().flatten(1).double())


def effective_rank(sv: torch.Tensor) -> float:
    """exp(H(p)) with p_k = σ_k / Σσ: the effective rank of Roy & Vetterli (2007).

    O. Roy, M. Vetterli, "The effective rank: a measure of effective dimensionality", EUSIPCO
    2007, def. 1 (singular values normalised to sum 1, Shannon entropy in nats, 0 log 0 = 0).
    It lies in [1, rank]: a rank-r matrix with r equal singular values has exactly r.
    """
    sv = sv.double()
    total = sv.sum()
    if not total > 0:
        return 0.0
    p = sv[sv > 0] / total
    return math.exp(float(-(p * p.log()).sum()))


def gram(features: torch.Tensor) -> torch.Tensor:
    """G = X Xᵀ (n x n, float64) of the n per-sample flattened features (ISO eq. 2)."""
    x = features.detach().flatten(1).double()
    return x @ x.T


def log_isometry(g: torch.Tensor) -> float:
    """log I(G) = mean(log λ) − log(mean λ) ≤ 0; −inf when G is singular (ISO def. 1, Lemma A.1).

    Eigenvalues from ``eigvalsh`` in float64 after dividing G by tr(G)/n (I is scale-invariant),
    never ``det``, which underflows for degenerate batches. An eigenvalue at or below round-off
    (n · eps · λ_max) counts as zero: duplicate samples, n > D and batch-centred features give
    I = 0, not a round-off-sized positive number.
    """
    g = g.double()
    n = g.shape[0]
    scale = torch.diagonal(g).sum() / n
    if not (torch.isfinite(g).all() and scale > 0):
        return -math.inf
    lam = torch.linalg.eigvalsh(g / scale)
    if lam[0] <= n * torch.finfo(torch.float64).eps * lam[-1]:
        return -math.inf
    return float(lam.log().mean() - lam.mean().log())


def isometry(g: torch.Tensor) -> float:
    """I(G) = det(G)^{1/n} / (tr G / n) in [0, 1], computed as exp(:func:`log_isometry`)."""
    return math.exp(log_isometry(g))


def isometry_gap(g: torch.Tensor) -> float:
    """−log I(G) in [0, ∞] (the quantity ISO's depth plots show)."""
    return -log_isometry(g)


def weight_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` for every linear / conv layer, the modules whose inputs are layer features."""
    return ((name, m) for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d)))


@torch.no_grad()
def layer_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The input of every linear / conv layer on ``x``, flattened per sample, in call (depth) order."""
    seen: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def record(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            seen.setdefault(name, args[0].detach().flatten(1))

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in weight_layers(model)]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def check_isometry_size(model: nn.Module, x: torch.Tensor, size: int) -> None:
    """Refuse an isometry Gram of ``size`` samples for a layer whose input (on ``x``) has fewer features: its
    ``size`` x ``size`` Gram has rank at most the width, a determinant of 0, and I = 0 for any model."""
    model.eval()
    if narrow := [(name, f.shape[1]) for name, f in layer_inputs(model, x).items() if f.shape[1] < size]:
        name, width = min(narrow, key=lambda layer: layer[1])
        raise ConfigError(
            f"diagnostics.isometry_size = {size} is more than the {width} features layer {name!r} takes (a Gram of "
            f"{size} samples of {width} features is singular: isometry 0 for any model); give at most {width}"
        )


def grad_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """‖∂L/∂θ‖₂ per parameter tensor for the mean cross-entropy L on (x, y); ``.grad`` untouched."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: float(g.norm()) for (n, _), g in zip(named, grads, strict=True) if g is not None}


# ---------------------------------------------------------------- the reporter's side


def _short(values: torch.Tensor) -> list[float]:
    """A tensor as a list of floats with 6 significant digits (metrics lines stay readable)."""
    return [float(f"{v:.6g}") for v in values.tolist()]


_FEATURE_KEYS = ("feature_sv", "feature_erank", "feature_norm_mean", "feature_norm_std")


def probe_images(d: DiagnosticsConfig, test_images: int) -> int:
    """How many test images the probe batch takes: ``probe_size``, or 256 (the whole test set when smaller)
    when it is not given. A size the test set cannot give is refused, whether or not a diagnostic is on:
    it was asked for, and cutting it down silently would measure something else."""
    if d.probe_size is None:
        return min(PROBE_SIZE, test_images)
    if d.probe_size > test_images:
        raise ConfigError(
            f"diagnostics.probe_size = {d.probe_size} is larger than the test set ({test_images} images); give "
            "at most that, or leave it out for 256 (or the whole test set when smaller)"
        )
    return d.probe_size


class ProbeDiagnostics:
    """The diagnostics ``diagnostics:`` asks for, on the first ``probe_size`` test images.

    Keys added to an evaluation round's metrics line (``features``): ``feature_sv`` (list,
    descending), ``feature_erank``, ``feature_norm_mean``, ``feature_norm_std``, ``class_norms``
    (list, one per class); (``isometry``) ``isometry`` (layer → I, layer named by the linear /
    conv module its features enter, on the first ``isometry_size`` probe images); and, in the
    first metrics line only (``grad_norms``), ``init_grad_norms`` (parameter → norm, measured on
    the round-0 arrays) and ``init_grad_norm_mean``.
    """

    def __init__(self, cfg: DiagnosticsConfig, model: FedsimModel, x: torch.Tensor, y: torch.Tensor) -> None:
        self.cfg, self.model, self.x, self.y = cfg, model, x, y
        self._pending: dict[str, Any] = {}

    @classmethod
    def from_experiment(cls, experiment: Experiment) -> ProbeDiagnostics | None:
        """The run's diagnostics, or ``None`` when its config asks for none."""
        cfg = experiment.config
        d = cfg.diagnostics
        if not (d.features or d.isometry or d.grad_norms):
            return None
        fed = experiment.federation()
        ds = fed.dataset
        assert ds is not None  # a dataset generated per client takes no diagnostics (fedsim.experiment.resolve)
        with torch.random.fork_rng(devices=[]):  # building must not move the server's RNG
            model = experiment.build_model()
        n = probe_images(d, len(ds.y_test))
        x = fed.input_transform(cfg.data.normalize)(ds.x_test[:n])  # what the clients see
        if d.isometry:
            check_isometry_size(model, x[:1], d.isometry_size)
        return cls(d, model, x, ds.y_test[:n])

    def at_init(self, arrays: ArrayRecord, seed: int = 0) -> None:
        """Round 0: the initial gradient norms, held for the first metrics line."""
        if not self.cfg.grad_norms:
            return
        load_arrays(self.model, arrays)
        self.model.train()  # gradients as local training sees them (BN batch statistics)
        with torch.random.fork_rng(devices=[]):  # stochastic norms draw from a private stream
            torch.manual_seed(seed)
            norms = grad_norms(self.model, self.x, self.y)
        self._pending = {
            "init_grad_norms": {k: float(f"{v:.6g}") for k, v in norms.items()},
            "init_grad_norm_mean": sum(norms.values()) / max(len(norms), 1),
        }

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        """The metrics of the global model ``arrays`` on the probe batch."""
        load_arrays(self.model, arrays)
        return self.measure()

    @torch.no_grad()
    def measure(self) -> dict[str, Any]:
        """The metrics of the model as it is now (in eval mode) on the probe batch."""
        self.model.eval()
        out: dict[str, Any] = {}
        if self.cfg.features:
            out.update(self._features())
        if self.cfg.isometry:
            feats = layer_inputs(self.model, self.x[: self.cfg.isometry_size])
            out["isometry"] = {name: float(f"{isometry(gram(f)):.6g}") for name, f in feats.items()}
        out.update(self._pending)
        self._pending = {}
        return out

    def _features(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(_FEATURE_KEYS)  # None for a diverged model: JSON has no NaN
        z = self.model.project(self.model.forward_features(self.x)).flatten(1).double()  # the classifier's input
        if torch.isfinite(z).all():
            sv = singular_values(z)
            norms = z.norm(dim=1)
            out["feature_sv"] = _short(sv)
            out["feature_erank"] = effective_rank(sv)
            out["feature_norm_mean"] = float(norms.mean())
            out["feature_norm_std"] = float(norms.std()) if len(norms) > 1 else 0.0
        w = getattr(self.model.classifier, "weight", None)
        if isinstance(w, torch.Tensor) and torch.isfinite(w).all():
            out["class_norms"] = _short(w.detach().double().flatten(1).norm(dim=1))
        return out
