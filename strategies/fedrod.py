"""FedRoD (Chen and Chao, *On Bridging Generic and Personalized Federated Learning for Image Classification*, ICLR
2022), the linear variant: a generic model trained with the balanced softmax, a personal head kept on each client.

Client, per batch, with z the classifier's input, g = h_G(z) the generic logits and p = h_P(z) = W_P·z (+ b_P) the
client's personal head φ_m:
- the body and generic head (θ, ψ) take the balanced-softmax loss CE(g + γ·log n, y), n the client's training
  samples per class (a class it lacks leaves the softmax);
- φ_m takes CE(g + p, y) with z and g held fixed (no gradient of it reaches θ or ψ), in the same SGD step.
φ_m lives in the client's ``Context.state``, starting at zero (the personalised model starts as the generic one).
Server: FedAvg over (θ, ψ). Scored: the generic model globally, g + p as the client's personalised model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from pydantic import Field
from torch import nn

from fedsim import wire
from fedsim.arrays import dump_arrays, load_arrays
from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, FineTune, RoundInfo

FEDROD_HEAD = "fedrod.head"  # Context.state: the client's personal head φ_m after its last participation


def balanced_prior(class_counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """log n_c^γ = γ·log n_c per class: −∞ where n_c = 0 (for γ > 0), 0 everywhere at γ = 0 (plain cross-entropy)."""
    n = class_counts.double()
    return torch.where(n > 0, gamma * n.clamp(min=1).log(), -torch.inf if gamma > 0 else 0.0)


class PersonalModel(nn.Module):
    """A client's personalised predictor: the generic logits plus its personal head's, on the same features."""

    def __init__(self, generic: FedsimModel, head: nn.Linear) -> None:
        super().__init__()
        self.generic, self.head = generic, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.generic.project(self.generic.forward_features(x))
        return self.generic.classifier(z) + self.head(z)


class FedRoDClient(ClientHooks["FedRoDSpec.Params"]):
    """Balanced softmax on the generic logits; the personal head trained on top of them, kept in state."""

    head: nn.Linear | None = None
    prior: torch.Tensor

    def own_parameters(self, model: FedsimModel) -> list[nn.Parameter]:
        return list(self.personal_head(model).parameters())

    def personal_head(self, model: FedsimModel) -> nn.Linear:
        """The hooks' one personal head, shaped as the model's classifier: a linear map from its input to logits."""
        if self.head is None:
            width = model.params.projection or model.feature_dim  # the classifier's input
            weight = next(model.parameters())
            self.head = nn.Linear(width, model.num_classes, bias=model.params.bias)
            self.head.to(device=weight.device, dtype=weight.dtype)
        return self.head

    @torch.no_grad()
    def load_head(self, model: FedsimModel, state: RecordDict) -> nn.Linear:
        """The personal head set to the client's own φ_m: from ``state``, or zero before its first participation."""
        head = self.personal_head(model)
        if FEDROD_HEAD in state:
            load_arrays(head, state[FEDROD_HEAD])
        else:
            for p in head.parameters():
                p.zero_()
        return head

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        self.load_head(model, state)
        device = next(model.parameters()).device
        self.prior = balanced_prior(info.class_counts, self.params.gamma).float().to(device)

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits + self.prior.to(logits.dtype)

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        z = features.detach()
        with torch.no_grad():
            generic = model.classifier(z)  # the plain generic logits (``logits`` carry the prior)
        return F.cross_entropy(generic + self.personal_head(model)(z), y)

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        state[FEDROD_HEAD] = dump_arrays(self.personal_head(model))
        return RecordDict()

    def personalize(self, model: FedsimModel, state: RecordDict, fine_tune: FineTune) -> nn.Module:
        return PersonalModel(model, self.load_head(model, state))


@STRATEGIES.register("fedrod")
class FedRoDSpec(StrategySpec):
    """FedRoD: balanced-softmax generic model (FedAvg) + a personal linear head per client on top (Chen & Chao 2022)."""

    Client = FedRoDClient
    protocol = (
        wire.Key(
            wire.CLIENT_STATE, "client", FEDROD_HEAD, "*", "ArrayRecord",
            "the client's personal head φ_m (weight, and bias with model.bias), never sent",
        ),
    )  # fmt: skip

    class Params(StrategySpec.Params):
        gamma: float = Field(
            1.0, ge=0, description="exponent γ on the class counts in the balanced softmax (1: Ren et al.'s BSM)"
        )

    def fine_tunes(self) -> bool:
        return False  # personalised: its personal head, as trained, no fine-tuning
