"""A strategy whose server half raises as its first round starts (test plugin for a run that fails at
once, by a bug rather than by diverging): ``tests.plugins.raising_server:RaisingServer``."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from fedsim.strategies import StrategySpec
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup


class Raising(FastAveraging):
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        raise RuntimeError(f"injected failure in round {server_round}")


class RaisingServer(StrategySpec):
    """FedAvg whose server raises as round 1 starts (test plugin)."""

    def server(self, setup: ServerSetup) -> Raising:
        return Raising(**EVERY_NODE)
