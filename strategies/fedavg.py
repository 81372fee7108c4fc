"""FedAvg (McMahan et al., AISTATS 2017): sample-weighted average of parameters and buffers."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg, Strategy

from fedsim.server_strategy import FedsimServer
from fedsim.strategies import STRATEGIES, StrategyParams, StrategySpec


class FedsimFedAvg(FedsimServer, FedAvg):
    """Flower's FedAvg with fedsim's client sampling, evaluation schedule and reply ordering."""


@STRATEGIES.register("fedavg")
class FedAvgSpec(StrategySpec):
    """FedAvg: sample-count-weighted average of all tensors (McMahan et al. 2017)."""

    @classmethod
    def server(cls, params: StrategyParams) -> Strategy:
        return FedsimFedAvg()
