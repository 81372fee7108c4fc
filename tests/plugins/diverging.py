"""A strategy whose chosen client diverges in a chosen round (test plugin for the NaN / inf stop):
``tests.plugins.diverging:Diverging``."""

from __future__ import annotations

from typing import Literal

import torch
from flwr.app import ArrayRecord, RecordDict

from fedsim.arrays import dump_arrays, to_array_record
from fedsim.models import FedsimModel
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec


class DivergingClient(ClientHooks["Diverging.Params"]):
    """FedAvg, except that client ``client`` in round ``round`` gets an inf loss or sends a NaN weight."""

    poisoned = False

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        self.poisoned = (info.server_round, info.partition_id) == (self.params.round, self.params.client)

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        return torch.tensor(float("inf")) if self.poisoned and self.params.where == "loss" else None

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        if not (self.poisoned and self.params.where == "weights"):
            return dump_arrays(model)
        tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        tensors["classifier.weight"].view(-1)[0] = float("nan")
        return to_array_record(tensors)


class Diverging(StrategySpec):
    """FedAvg with one client diverging on purpose (test plugin)."""

    Client = DivergingClient

    class Params(StrategySpec.Params):
        round: int
        client: int
        where: Literal["loss", "weights"] = "loss"
