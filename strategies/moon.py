"""MOON (Li, He, Song, *Model-Contrastive Federated Learning*, CVPR 2021): FedAvg plus a model-contrastive term.

Client: ℓ = CE + μ·ℓ_con with ℓ_con = −log(e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ})),
sim the cosine similarity, z the representation of the batch's inputs by the model being trained, z_glob by the
round's global model and z_prev by the client's own model after its last participation (kept in its
``Context.state``), both frozen. A client with no previous model (its first participation) trains on CE alone, as
the authors' code does (its contrastive logits then hold the positive pair only, and CE of one logit is 0).
The representation is the model's classifier input: the projection head's output with ``model.projection`` (the
paper's MOON), else the features (``forward_features``; docs/algorithms.md). Server: FedAvg.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from pydantic import Field

from fedsim import wire
from fedsim.arrays import dump_arrays, load_arrays
from fedsim.models import FedsimModel
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo, frozen_copy

MOON_PREVIOUS = "moon.previous"  # Context.state: the client's local model after its last participation


class MoonClient(ClientHooks["MoonSpec.Params"]):
    """Adds μ·ℓ_con on the representation, against the frozen global and previous local models."""

    def __init__(self, params: MoonSpec.Params) -> None:
        super().__init__(params)
        self.frozen: tuple[FedsimModel, FedsimModel] | None = None  # (global, previous): made once, reloaded
        self.previous: FedsimModel | None = None  # None: no previous local model this round

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        self.previous = None
        if self.params.mu == 0:  # FedAvg: no term, so no frozen models and no state
            return
        if self.frozen is None:
            self.frozen = (frozen_copy(model), frozen_copy(model))
        global_model, previous = self.frozen
        global_model.load_state_dict(model.state_dict())  # the round's received model
        if MOON_PREVIOUS in state:
            load_arrays(previous, state[MOON_PREVIOUS])
            self.previous = previous

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        if self.previous is None or self.frozen is None:
            return None
        with torch.no_grad():
            z_glob = self.frozen[0].project(self.frozen[0].forward_features(x))
            z_prev = self.previous.project(self.previous.forward_features(x))
        z, tau = features, self.params.temperature  # the classifier's input: through the head, if any
        similarities = torch.stack(
            [F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], dim=1
        )
        positive = torch.zeros(len(z), dtype=torch.long, device=z.device)  # z_glob is column 0
        return self.params.mu * F.cross_entropy(similarities / tau, positive)  # the batch mean of ℓ_con

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        if self.params.mu > 0:
            state[MOON_PREVIOUS] = dump_arrays(model)
        return RecordDict()


@STRATEGIES.register("moon")
class MoonSpec(StrategySpec):
    """MOON: FedAvg + client loss mu·l_con, contrasting the global and the previous local model (Li et al. 2021)."""

    Client = MoonClient
    protocol = (
        wire.Key(
            wire.CLIENT_STATE, "client", MOON_PREVIOUS, "*", "ArrayRecord",
            "the client's model after its last participation (z_prev's model)",
        ),
    )  # fmt: skip

    class Params(StrategySpec.Params):
        mu: float = Field(5.0, ge=0, description="weight μ of the contrastive term (the paper's CIFAR-10 value)")
        temperature: float = Field(0.5, gt=0, description="temperature τ of the contrastive term")
