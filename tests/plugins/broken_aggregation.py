"""A strategy whose server half breaks fedsim's contract in a chosen way (test plugin for the checks at the
boundary): ``tests.plugins.broken_aggregation:BrokenAggregation`` with ``breaks: <how>``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.serverapp.strategy import FedAvg, Strategy

from fedsim.strategies import ServerSetup, StrategySpec

How = Literal["one_tensor", "none", "raises", "int64", "configure_raises"]


class BrokenFedAvg(FedAvg):
    """Flower's FedAvg whose ``aggregate_train`` (or ``configure_train``) goes wrong as ``breaks`` says."""

    def __init__(self, breaks: How) -> None:
        super().__init__(min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)
        self.breaks = breaks

    def configure_train(self, *args: Any) -> Iterable[Message]:
        if self.breaks == "configure_raises":
            raise KeyError("learning_rate")
        return super().configure_train(*args)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        arrays, metrics = super().aggregate_train(server_round, replies)
        assert arrays is not None
        first = next(iter(arrays))
        if self.breaks == "one_tensor":  # 1 of the model's tensors
            return ArrayRecord({first: arrays[first]}), metrics
        if self.breaks == "none":
            return None, None
        if self.breaks == "raises":
            raise ValueError("the replies disagree\nsecond line")
        if self.breaks == "int64":
            arrays[first] = Array(arrays[first].numpy().astype(np.int64))
        return arrays, metrics


class BrokenAggregation(StrategySpec):
    """FedAvg whose server half breaks the strategy contract (test plugin)."""

    class Params(StrategySpec.Params):
        breaks: How

    def server(self, setup: ServerSetup) -> Strategy:
        return BrokenFedAvg(self.params.breaks)
