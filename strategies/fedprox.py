"""FedProx (Li et al., MLSys 2020): FedAvg plus a proximal term on the client.

Server: Flower's ``FedProx`` (FedAvg that sends μ as ``proximal-mu``). Client: loss +
(μ/2)·Σ‖w − x‖² over the model's parameters, not its buffers (docs/algorithms.md), with x the
global parameters the round started from; its gradient adds μ(w − x).
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict
from flwr.serverapp.strategy import FedProx, Strategy
from pydantic import Field

from fedsim import wire
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

PROXIMAL_MU = "proximal-mu"  # ConfigRecord entry; Flower's FedProx sends it under this name


class FedProxServer(FedProx, FastAveraging):
    """Flower's FedProx, averaging with fedsim's aggregation."""


class FedProxClient(ClientHooks["FedProxSpec.Params"]):
    """Adds (μ/2)·Σ‖w − x‖² over parameters; μ comes from the server's config (Flower's key)."""

    mu: float
    x: list[torch.Tensor]

    def begin_round(
        self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo
    ) -> None:
        self.mu = float(content[wire.CONFIG][PROXIMAL_MU])
        self.x = [p.detach().clone() for p in model.parameters()]

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        squared = sum((w - x).pow(2).sum() for w, x in zip(model.parameters(), self.x, strict=True))
        return 0.5 * self.mu * squared


@STRATEGIES.register("fedprox")
class FedProxSpec(StrategySpec):
    """FedProx: FedAvg + client loss (mu/2)·||w - x||² over parameters (Li et al. 2020)."""

    Client = FedProxClient
    protocol = (wire.Key(wire.TRAIN, "server → client", wire.CONFIG, PROXIMAL_MU, "float", "μ"),)

    class Params(StrategySpec.Params):
        mu: float = Field(0.01, ge=0, description="proximal weight μ (LN-FL swept 0.001..1)")

    def server(self, setup: ServerSetup) -> Strategy:
        return FedProxServer(proximal_mu=self.params.mu, **EVERY_NODE)

