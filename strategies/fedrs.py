"""FedRS (Li & Zhan, KDD 2021): restricted softmax, scaling down the logits of missing classes.

``mode: binary`` (default, LN-FL): logits of classes absent on the client are multiplied by α,
present ones are unchanged. ``mode: soft`` (the FedRS authors' code): each logit is scaled by
α + (1−α)·n_c/n_max and the classifier's bias is dropped (their logits are s_c·⟨w_c, h⟩).
Training only; evaluation uses the plain logits.
"""

from __future__ import annotations

from typing import Literal

import torch
from flwr.app import RecordDict
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo


def restriction_scale(
    class_counts: torch.Tensor, alpha: float, mode: Literal["binary", "soft"]
) -> torch.Tensor:
    """The per-class factor of the logits: α for absent classes, 1 (binary) or α + (1−α)·n_c/n_max (soft)."""
    n = class_counts.double()
    if mode == "binary":
        return torch.where(n > 0, 1.0, alpha)
    return alpha + (1 - alpha) * n / n.max()


class FedRSClient(ClientHooks["FedRSSpec.Params"]):
    """Scales the training logits per class (soft mode: after removing the classifier's bias)."""

    scale: torch.Tensor
    bias: torch.Tensor | None

    def begin_round(
        self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo
    ) -> None:
        device = next(model.parameters()).device
        scale = restriction_scale(info.class_counts, self.params.alpha, self.params.mode)
        self.scale = scale.float().to(device)
        self.bias = getattr(model.classifier, "bias", None) if self.params.mode == "soft" else None

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        if self.bias is not None:
            logits = logits - self.bias
        return logits * self.scale.to(logits.dtype)


@STRATEGIES.register("fedrs")
class FedRSSpec(StrategySpec):
    """FedRS: restricted softmax, logits of missing classes times alpha (Li & Zhan 2021)."""

    Client = FedRSClient

    class Params(StrategySpec.Params):
        alpha: float = Field(0.5, ge=0, le=1, description="scale α of missing classes' logits")
        mode: Literal["binary", "soft"] = Field("binary", description="binary (LN-FL) or soft (FedRS code)")
