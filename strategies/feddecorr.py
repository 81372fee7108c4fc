"""FedDecorr (Shi et al., ICLR 2023): penalise correlated dimensions of the features.

Loss = CE + β·L_dc(z) on the features z (B × d) that enter the classifier (after the feature
norm, when there is one): z is standardised per dimension over the batch (unbiased variance,
ε = 1e-8), M = zᵀz, L_dc = mean(offdiag(M)²)/B, and 0 for B = 1. This is the authors' code
exactly; its scale grows with B, so β (default 0.1, theirs; LN-FL's text says 0.5) only transfers
with the same batch size.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks

EPS = 1e-8  # the authors' constant


def decorrelation_loss(z: torch.Tensor) -> torch.Tensor:
    """L_dc of a B × d feature matrix (FedDecorr's ``FedDecorrLoss``)."""
    z = z.flatten(1)
    batch, dim = z.shape
    if batch == 1:
        return z.new_zeros(())
    z = z - z.mean(0, keepdim=True)
    z = z / torch.sqrt(EPS + z.var(0, keepdim=True))
    m = z.T @ z
    # the off-diagonal entries in row-major order, as a view: no mask, so no device sync on a GPU
    off_diagonal = m.flatten()[1:].view(dim - 1, dim + 1)[:, :-1]
    return off_diagonal.pow(2).mean() / batch


class FedDecorrClient(ClientHooks["FedDecorrSpec.Params"]):
    """Adds β·L_dc of the classifier's input features."""

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        return self.params.beta * decorrelation_loss(features)


@STRATEGIES.register("feddecorr")
class FedDecorrSpec(StrategySpec):
    """FedDecorr: CE + beta·feature decorrelation loss on the classifier input (Shi et al. 2023)."""

    Client = FedDecorrClient

    class Params(StrategySpec.Params):
        beta: float = Field(0.1, ge=0, description="weight β of L_dc (authors' code: 0.1; LN-FL: 0.5)")
