"""A user-defined strategy in the user's own module: referenced from YAML as
``tests.plugins.my_strategy:FrozenHead`` or installed under the ``fedsim.strategies`` entry point."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg, Strategy
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.server_strategy import FedsimServer
from fedsim.strategies import StrategyParams, StrategySpec
from fedsim.training import ClientHooks


class FrozenHeadServer(FedsimServer, FedAvg):
    """Flower's FedAvg with fedsim's sampling (test plugin)."""


class FrozenHeadClient(ClientHooks):
    """Scales the classifier's gradient by ``head_lr_scale`` (0 freezes it)."""

    def correct_gradients(self, model: FedsimModel) -> None:
        for p in model.classifier.parameters():
            if p.grad is not None:
                p.grad.mul_(self.params.head_lr_scale)


class FrozenHead(StrategySpec):
    """FedAvg whose clients scale the classifier's learning rate (test plugin)."""

    class Params(StrategyParams):
        head_lr_scale: float = Field(0.0, ge=0)

    @classmethod
    def server(cls, params: Params) -> Strategy:
        return FrozenHeadServer()

    @classmethod
    def client(cls, params: Params) -> ClientHooks:
        return FrozenHeadClient(params)
