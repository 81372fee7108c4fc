"""FedAvg (McMahan et al., AISTATS 2017): sample-weighted average of parameters and buffers."""

from __future__ import annotations

from fedsim.server_strategy import FedsimFedAvg
from fedsim.strategies import STRATEGIES, StrategySpec

__all__ = ["FedAvgSpec", "FedsimFedAvg"]


@STRATEGIES.register("fedavg")
class FedAvgSpec(StrategySpec):
    """FedAvg: sample-count-weighted average of all tensors (McMahan et al. 2017)."""
