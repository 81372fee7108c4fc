"""Flower's server optimisers as they are: FedAdam, FedAdagrad (Reddi et al., ICLR 2021) and
FedAvgM (Hsu et al., 2019).

Flower's semantics and defaults, unchanged: they update every tensor, buffers included, and the
FedOpt family starts v at 0 (FedYogi, in ``fedyogi.py``, follows LN-FL instead). Flower's
``eta_l`` is not exposed: Flower's server never uses it; the client learning rate is ``train.lr``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM, Strategy
from pydantic import Field

from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup, state_record, state_slots


class AdaptiveParams(StrategySpec.Params):
    """The adaptive server optimisers' options (Reddi et al. 2021), at Flower's defaults."""

    eta: float = Field(0.1, gt=0, description="server learning rate η")
    beta_1: float = Field(0.9, ge=0, lt=1)
    beta_2: float = Field(0.99, ge=0, lt=1)
    tau: float = Field(1e-3, gt=0, description="adaptivity τ")


class FedOptState:
    """``server_state`` for Flower's FedOpt family: its first and second moments m_t, v_t."""

    m_t: dict[str, np.ndarray] | None
    v_t: dict[str, np.ndarray] | None

    def server_state(self) -> ArrayRecord:
        return state_record({"m_t": self.m_t, "v_t": self.v_t})

    def load_server_state(self, state: ArrayRecord) -> None:
        slots = state_slots(state)
        self.m_t, self.v_t = slots.get("m_t"), slots.get("v_t")


class FedAdamServer(FedOptState, FedAdam, FastAveraging):
    """Flower's FedAdam, averaging with fedsim's aggregation."""


class FedAdagradServer(FedOptState, FedAdagrad, FastAveraging):
    """Flower's FedAdagrad, averaging with fedsim's aggregation."""


class FedAvgMServer(FedAvgM, FastAveraging):
    """Flower's FedAvgM, averaging with fedsim's aggregation."""

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

    Params = AdaptiveParams

    def server(self, setup: ServerSetup) -> Strategy:
        return FedAdamServer(**self.params.model_dump(), **EVERY_NODE)


@STRATEGIES.register("fedadagrad")
class FedAdagradSpec(StrategySpec):
    """FedAdagrad: Adagrad on the server over all tensors, Flower's defaults (Reddi et al. 2021)."""

    class Params(StrategySpec.Params):
        eta: float = Field(0.1, gt=0, description="server learning rate η")
        tau: float = Field(1e-3, gt=0, description="adaptivity τ")

    def server(self, setup: ServerSetup) -> Strategy:
        return FedAdagradServer(**self.params.model_dump(), **EVERY_NODE)


@STRATEGIES.register("fedavgm")
class FedAvgMSpec(StrategySpec):
    """FedAvgM: server SGD with momentum on the averaged update, Flower's defaults (Hsu et al. 2019)."""

    class Params(StrategySpec.Params):
        server_learning_rate: float = Field(1.0, gt=0)
        server_momentum: float = Field(0.0, ge=0, lt=1)

    def server(self, setup: ServerSetup) -> Strategy:
        return FedAvgMServer(**self.params.model_dump(), **EVERY_NODE)
