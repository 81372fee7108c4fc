"""Scoring a model on labelled images: what clients report and what the server measures globally."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.models.base import FedsimModel

# Images per forward pass. Each image's logits are its own, so this changes no number (on this machine
# the paper CNN's logits are bit-identical in chunks of 32, 50 or 100 and in whole batches of 500), but
# a batch of 500 CIFAR images has activations of tens of MB, which fall out of cache: scoring 5,000
# images on one thread took 2.46 s in batches of 500 and 1.22 s in chunks of 50. The loss is still
# summed over ``eval.batch_size`` images at a time, as before.
FORWARD_CHUNK = 50


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    num_classes: int,
    to_inputs: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Loss sum, per-class correct counts and per-class totals of ``model`` on (x, y).

    ``x`` is uint8 images; ``to_inputs`` turns a batch of them into the model's float inputs
    (:class:`fedsim.experiment.federation.InputTransform`), so every scorer sees what training saw.
    """
    model.eval()
    device = next(model.parameters()).device
    # summed where the model is, read back once: no host copy, no data-dependent shape per batch
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros(num_classes, dtype=torch.int64, device=device)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = torch.cat([model(to_inputs(xb[k : k + FORWARD_CHUNK])) for k in range(0, len(yb), FORWARD_CHUNK)])
        loss += F.cross_entropy(logits, yb, reduction="sum").double()
        correct.index_add_(0, yb, (logits.argmax(1) == yb).long())
    totals = torch.zeros(num_classes, dtype=torch.int64, device=device).index_add_(0, y, torch.ones_like(y))
    return float(loss), correct.cpu(), totals.cpu()


@torch.no_grad()
def class_feature_stats(
    model: FedsimModel,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    to_inputs: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per class of (x, y): the sample count, the mean and the unbiased covariance of ``model``'s features (its
    classifier's input, the model in eval mode), in float64 on the CPU. A class without samples has mean 0; one
    with fewer than two, covariance 0."""
    model.eval()
    sums: torch.Tensor | None = None
    outer: torch.Tensor | None = None
    for start in range(0, len(y), FORWARD_CHUNK):
        z = model.project(model.forward_features(to_inputs(x[start : start + FORWARD_CHUNK]))).double().cpu()
        yb = y[start : start + FORWARD_CHUNK].cpu()
        if sums is None or outer is None:
            sums = z.new_zeros(num_classes, z.shape[1])
            outer = z.new_zeros(num_classes, z.shape[1], z.shape[1])
        for c in yb.unique().tolist():
            zc = z[yb == c]
            sums[c] += zc.sum(0)
            outer[c] += zc.T @ zc
    counts = torch.bincount(y.cpu(), minlength=num_classes)
    if sums is None or outer is None:  # a client without training samples: no feature width to give
        return counts, torch.zeros(num_classes, 0).double(), torch.zeros(num_classes, 0, 0).double()
    n = counts.double()
    means = sums / n.clamp(min=1)[:, None]
    # Σ (z − μ)(z − μ)ᵀ = Σ zzᵀ − n·μμᵀ, over n − 1
    scatter = outer - n[:, None, None] * means[:, :, None] * means[:, None, :]
    covariances = torch.where((n > 1)[:, None, None], scatter / (n - 1).clamp(min=1)[:, None, None], 0.0)
    return counts, means, covariances
