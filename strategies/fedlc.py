"""FedLC (Zhang et al., ICML 2022): logit calibration with the client's own class counts.

Training logits become logits_c − τ·n_c^(−1/4); a class absent on the client (n_c = 0) gets an
infinite margin, so its logit is −∞ and it drops out of the softmax. With one class on a client
only one finite logit is left: the loss is exactly 0 and nothing is learned (LN-FL reports
chance accuracy; that is the algorithm, not a bug). Evaluation uses the plain logits.
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo


def calibration_margin(class_counts: torch.Tensor, tau: float) -> torch.Tensor:
    """τ·n_c^(−1/4) per class, +∞ where n_c = 0."""
    n = class_counts.double()
    return torch.where(n > 0, tau * n.clamp(min=1).pow(-0.25), torch.inf)


class FedLCClient(ClientHooks["FedLCSpec.Params"]):
    """Subtracts the calibration margin from the training logits."""

    margin: torch.Tensor

    def begin_round(
        self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo
    ) -> None:
        device = next(model.parameters()).device
        self.margin = calibration_margin(info.class_counts, self.params.tau).float().to(device)

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits - self.margin.to(logits.dtype)


@STRATEGIES.register("fedlc")
class FedLCSpec(StrategySpec):
    """FedLC: cross-entropy on logits - tau·n_c^(-1/4), absent classes at -inf (Zhang et al. 2022)."""

    Client = FedLCClient

    class Params(StrategySpec.Params):
        tau: float = Field(1.0, ge=0, description="calibration strength τ")
