"""Flower's server optimisers as they are: FedAdam, FedAdagrad (Reddi et al., ICLR 2021) and
FedAvgM (Hsu et al., 2019).

Flower's semantics and defaults, unchanged: they update every tensor, buffers included, and the
FedOpt family starts v at 0 (FedYogi, in ``fedyogi.py``, follows LN-FL instead). Flower's
``eta_l`` is not exposed: Flower's server never uses it; the client learning rate is ``train.lr``.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM, Strategy
from pydantic import Field

from fedsim.server_strategy import FedsimServer, state_record, state_slots
from fedsim.strategies import STRATEGIES, StrategyParams, StrategySpec
from fedsim.strategies.fedyogi import FedOptState


class FedsimFedAdam(FedOptState, FedsimServer, FedAdam):
    """Flower's FedAdam with fedsim's sampling and reply order."""


class FedsimFedAdagrad(FedOptState, FedsimServer, FedAdagrad):
    """Flower's FedAdagrad with fedsim's sampling and reply order."""


class FedsimFedAvgM(FedsimServer, FedAvgM):
    """Flower's FedAvgM with fedsim's sampling and reply order."""

    def server_state(self) -> ArrayRecord:
        if self.momentum_vector is None or self.current_arrays is None:
            return ArrayRecord()
        return state_record({"momentum": dict(zip(self.current_arrays, self.momentum_vector, strict=True))})

    def load_server_state(self, state: ArrayRecord) -> None:
        momentum = state_slots(state).get("momentum")
        self.momentum_vector = list(momentum.values()) if momentum else None


@STRATEGIES.register("fedadam")
class FedAdamSpec(StrategySpec):
    """FedAdam: Adam on the server over all tensors, Flower's defaults (Reddi et al. 2021)."""

    class Params(StrategyParams):
        eta: float = Field(0.1, gt=0, description="server learning rate η")
        beta_1: float = Field(0.9, ge=0, lt=1)
        beta_2: float = Field(0.99, ge=0, lt=1)
        tau: float = Field(1e-3, gt=0, description="adaptivity τ")

    @classmethod
    def server(cls, params: Params) -> Strategy:
        return FedsimFedAdam(**params.model_dump())


@STRATEGIES.register("fedadagrad")
class FedAdagradSpec(StrategySpec):
    """FedAdagrad: Adagrad on the server over all tensors, Flower's defaults (Reddi et al. 2021)."""

    class Params(StrategyParams):
        eta: float = Field(0.1, gt=0, description="server learning rate η")
        tau: float = Field(1e-3, gt=0, description="adaptivity τ")

    @classmethod
    def server(cls, params: Params) -> Strategy:
        return FedsimFedAdagrad(**params.model_dump())


@STRATEGIES.register("fedavgm")
class FedAvgMSpec(StrategySpec):
    """FedAvgM: server SGD with momentum on the averaged update, Flower's defaults (Hsu et al. 2019)."""

    class Params(StrategyParams):
        server_learning_rate: float = Field(1.0, gt=0)
        server_momentum: float = Field(0.0, ge=0, lt=1)

    @classmethod
    def server(cls, params: Params) -> Strategy:
        return FedsimFedAvgM(**params.model_dump())
