"""CCVR (Luo, Chen, Hu, Zhang, Liang, Feng, *No Fear of Heterogeneity: Classifier Calibration for Federated Learning
with Non-IID Data*, NeurIPS 2021): FedAvg, scored with its classifier calibrated on virtual representations.

At each evaluation every client sends, for each class c, its sample count N_{c,k} and the mean μ_{c,k} and unbiased
covariance Σ_{c,k} of its training features (the classifier's input) under the model to score
(``query.feature_stats``; the features never leave the client). The server pools them into each class's mean and
covariance over every client's samples (:func:`pool_class_stats`), draws ``virtual_per_class`` features of each class
present from N(μ_c, Σ_c) (:func:`draw_virtual_features`) and retrains the linear classifier, from its trained value,
with cross-entropy on them (:func:`calibrate_classifier`). The calibrated model is the one scored (and saved as
``model.pt``); training goes on from the uncalibrated global model, so the calibration at the last round is the
paper's post-hoc one.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from pydantic import Field
from torch import nn

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.errors import ConfigError
from fedsim.models import FedsimModel
from fedsim.models.size import machine_memory
from fedsim.reading import GIB
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

WEIGHT, BIAS = "classifier.weight", "classifier.bias"  # the linear classifier g_φ in the model's state dict
STATS = (wire.CLASS_COUNTS, wire.CLASS_MEANS, wire.CLASS_COVARIANCES)
# The third entry of the virtual features' seed sequence (the run's seed, the round, this)
VIRTUAL_STREAM = 7


def pool_class_stats(stats: list[ArrayRecord]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each class's count N_c = Σ_k N_{c,k}, mean μ_c = Σ_k (N_{c,k}/N_c)·μ_{c,k} and covariance
    Σ_c = Σ_k (N_{c,k}−1)/(N_c−1)·Σ_{c,k} + Σ_k N_{c,k}/(N_c−1)·μ_{c,k}μ_{c,k}ᵀ − N_c/(N_c−1)·μ_cμ_cᵀ, from the
    clients' ``feature-stats`` records (clients without samples left out): the mean and unbiased covariance of the
    class's features over every client's samples. Float64; a class with fewer than two samples has covariance 0."""
    present = [record for record in stats if array_view(record[wire.CLASS_COUNTS]).sum() > 0]  # clients with samples
    if not present:
        raise ValueError("no client has training samples: no feature statistics to calibrate on")
    classes, width = array_view(present[0][wire.CLASS_MEANS]).shape
    n = torch.zeros(classes, dtype=torch.float64)
    sums = torch.zeros(classes, width, dtype=torch.float64)
    spread = torch.zeros(classes, width, width, dtype=torch.float64)
    for record in present:  # one client at a time: one (K, d, d) sum held, not every client's terms at once
        count, mu, sigma = (torch.from_numpy(np.array(array_view(record[k]))) for k in STATS)
        count = count.double()
        n += count
        sums += count[:, None] * mu
        spread += (count - 1).clamp(min=0)[:, None, None] * sigma
        spread += count[:, None, None] * mu[:, :, None] * mu[:, None, :]
    mean = sums / n.clamp(min=1)[:, None]
    spread -= n[:, None, None] * mean[:, :, None] * mean[:, None, :]
    covariance = torch.where((n > 1)[:, None, None], spread / (n - 1).clamp(min=1)[:, None, None], 0.0)
    return n.long(), mean, covariance


def draw_virtual_features(
    counts: torch.Tensor, means: torch.Tensor, covariances: torch.Tensor, per_class: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` features of each class with samples, drawn from N(μ_c, Σ_c) as μ_c + ε·Lᵀ with ε standard normal
    (float64, from ``generator``, class by class) and L = V·diag(√max(λ, 0)) from Σ_c = V·diag(λ)·Vᵀ (Σ_c is only
    positive semi-definite where a class has fewer samples than the features' width); with their labels."""
    features, labels = [], []
    for c in torch.nonzero(counts > 0).flatten().tolist():
        eigenvalues, vectors = torch.linalg.eigh(covariances[c])
        root = vectors * eigenvalues.clamp(min=0).sqrt()
        noise = torch.randn(per_class, means.shape[1], generator=generator, dtype=torch.float64)
        features.append(means[c] + noise @ root.T)
        labels.append(torch.full((per_class,), c, dtype=torch.long))
    return torch.cat(features), torch.cat(labels)


def calibrate_classifier(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linear classifier (``weight``, ``bias``) retrained from its value on (``features``, ``labels``): ``epochs``
    passes of plain SGD at ``lr`` on the mean cross-entropy of shuffled batches of ``batch_size`` (the last one
    smaller), in the classifier's dtype."""
    w = weight.detach().clone().requires_grad_(True)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    params = [w] if b is None else [w, b]
    z = features.to(weight.dtype)
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(labels), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(F.linear(z[idx], w, b), labels[idx])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p -= lr * g
    return w.detach(), None if b is None else b.detach()


# The server holds the virtual features about this many times over in float64 at once: the classes' draws, their
# concatenation, and the float32 copy the retraining reads (half of one) with a class's noise being drawn.
VIRTUAL_COPIES = 3


def check_virtual_memory(per_class: int, classifier: nn.Linear) -> None:
    """Refuse ``virtual_per_class`` where the virtual features of every class (K·M_c vectors of d float64s, held
    :data:`VIRTUAL_COPIES` times) need more than half this machine's memory: they are drawn at the first
    evaluation, after rounds of training, where running out of memory would lose the run."""
    classes, width = classifier.out_features, classifier.in_features
    nbytes = VIRTUAL_COPIES * 8 * classes * per_class * width
    limit = machine_memory() // 2
    if nbytes > limit:
        most = limit // (VIRTUAL_COPIES * 8 * classes * width)
        raise ConfigError(
            f"strategy.virtual_per_class = {per_class:,}: {classes} classes x {per_class:,} virtual features of "
            f"{width} float64s, held about {VIRTUAL_COPIES} times, need {nbytes / GIB:,.1f} GiB, more than half this "
            f"machine's {machine_memory() / GIB:,.1f} GiB: give at most {most:,}"
        )


class CCVRServer(FastAveraging):
    """FedAvg; the model scored is calibrated on virtual features drawn from the clients' feature statistics."""

    def __init__(self, params: CCVRSpec.Params, seed: int, **flower_args: int) -> None:
        super().__init__(**flower_args)
        self.params, self.seed = params, seed

    def calibrated_arrays(self, server_round: int, arrays: ArrayRecord, stats: list[ArrayRecord]) -> ArrayRecord:
        p = self.params
        generator = torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.seed, server_round, VIRTUAL_STREAM]).generate_state(1)[0])
        )
        features, labels = draw_virtual_features(*pool_class_stats(stats), p.virtual_per_class, generator)
        weight = torch.from_numpy(np.array(array_view(arrays[WEIGHT])))
        bias = torch.from_numpy(np.array(array_view(arrays[BIAS]))) if BIAS in arrays else None
        weight, bias = calibrate_classifier(
            weight, bias, features, labels, epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, generator=generator
        )
        calibrated = {WEIGHT: weight} if bias is None else {WEIGHT: weight, BIAS: bias}
        return ArrayRecord({k: a for k, a in arrays.items()} | dict(to_array_record(calibrated).items()))


@STRATEGIES.register("ccvr")
class CCVRSpec(StrategySpec):
    """CCVR: FedAvg, its classifier calibrated on virtual features from the clients' feature statistics (Luo et al.
    2021)."""

    class Params(StrategySpec.Params):
        virtual_per_class: int = Field(
            100, ge=1, le=10**6, description="virtual features drawn per class, M_c (the paper: 100 on CIFAR-10)"
        )
        epochs: int = Field(1, ge=1, le=10**4, description="passes of the classifier's retraining over them")
        batch_size: int = Field(32, ge=1, le=10**6, description="virtual features per SGD step of the retraining")
        lr: float = Field(0.01, gt=0, description="the retraining's learning rate (plain SGD)")

    def server(self, setup: ServerSetup) -> CCVRServer:
        return CCVRServer(self.params, setup.seed, **EVERY_NODE)

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        # exactly nn.Linear: a subclass (model.norm l2's L2Linear, affine_like's AffineLinear) computes another
        # function of the features than the W·z + b the calibration fits
        if type(model.classifier) is not nn.Linear:
            raise ConfigError(
                f"strategy: ccvr retrains a linear classifier, W·z + b; this model's classifier is a "
                f"{type(model.classifier).__name__}: give a model.norm that leaves it linear (none, ln, bn, gn, ...), "
                "or another strategy"
            )
        check_virtual_memory(self.params.virtual_per_class, model.classifier)
        return model
