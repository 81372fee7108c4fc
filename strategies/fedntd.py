"""FedNTD (Lee et al., NeurIPS 2022): distil the global model's not-true-class predictions on the client.

Loss = CE(q, y) + β·L_NTD, with L_NTD = KL(q̃_τ^g ‖ q̃_τ) (the paper's Eq. 5, averaged over the batch),
where q̃_τ and q̃_τ^g are the softmax at temperature τ of the local and of the global model's logits with
each sample's true class removed. The global model is a frozen copy, in eval mode, of the model the client
received this round. No τ² factor: the paper's equation; the authors' final code multiplies the KL by τ²,
so their (β, τ) is fedsim's (β·τ², τ); at the default τ = 1 the two agree. Server: FedAvg.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo, frozen_copy


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The B × (C−1) logits of each sample's not-true classes, in class order."""
    others = torch.arange(logits.shape[1] - 1, device=logits.device).expand(len(y), -1)
    # column j holds class j below the label, j + 1 from it on: an index, not a mask, so no device sync
    return logits.gather(1, others + (others >= y.unsqueeze(1)))


def not_true_distillation(
    logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float
) -> torch.Tensor:
    """L_NTD: KL(q̃_τ^g ‖ q̃_τ) over the not-true classes, the mean over the batch of each sample's sum."""
    log_q = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    q_global = F.softmax(not_true_logits(global_logits, y) / tau, dim=1)
    return F.kl_div(log_q, q_global, reduction="batchmean")


class FedNTDClient(ClientHooks["FedNTDSpec.Params"]):
    """Adds β·L_NTD against a frozen copy of the round's global model (none at β = 0: FedAvg exactly)."""

    global_model: FedsimModel | None = None

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        # eval mode: BN's running statistics, no noise drawn; the authors' copy is taken after their client
        # evaluation, so it is in eval mode too (all but the run's first client)
        self.global_model = frozen_copy(model) if self.params.beta > 0 else None

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        if self.global_model is None:
            return None
        with torch.no_grad():
            global_logits = self.global_model(x)
        return self.params.beta * not_true_distillation(logits, global_logits, y, self.params.tau)

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        self.global_model = None  # the copy's memory is not held between rounds
        return RecordDict()


@STRATEGIES.register("fedntd")
class FedNTDSpec(StrategySpec):
    """FedNTD: CE + beta·KL of the global model's not-true-class softmax (Lee et al. 2022)."""

    Client = FedNTDClient

    class Params(StrategySpec.Params):
        beta: float = Field(1.0, ge=0, description="weight β of L_NTD (the authors' config: 1)")
        tau: float = Field(1.0, gt=0, description="softmax temperature τ (the authors' config: 1)")
