"""FedYogi (Reddi et al., ICLR 2021) with LN-FL's choices: v₀ = τ², parameters only.

Flower's ``FedYogi`` does the update: Δ = weighted avg(y_i) − x; m ← β₁m + (1−β₁)Δ;
v ← v − (1−β₂)Δ²·sign(v − Δ²); x ← x + η·m/(√v + τ). It starts at v₀ = 0 and treats every
tensor alike; this subclass starts v at ``v0`` (default τ², LN-FL) and, with ``scope:
parameters`` (default), gives the buffers (BN running statistics) FedAvg's plain average instead.
``v0: 0`` with ``scope: all`` is Flower's FedYogi exactly (tested against it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import NDArray
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedYogi, Strategy
from pydantic import Field

from fedsim.errors import TrainingError
from fedsim.server_strategy import FedsimServer, state_record, state_slots
from fedsim.strategies import STRATEGIES, StrategyParams, StrategySpec


class FedOptState:
    """``server_state`` for Flower's FedOpt family: its first and second moments m_t, v_t."""

    m_t: dict[str, NDArray] | None
    v_t: dict[str, NDArray] | None

    def server_state(self) -> ArrayRecord:
        return state_record({"m_t": self.m_t, "v_t": self.v_t})

    def load_server_state(self, state: ArrayRecord) -> None:
        slots = state_slots(state)
        self.m_t, self.v_t = slots.get("m_t"), slots.get("v_t")


class FedsimFedYogi(FedOptState, FedsimServer, FedYogi):
    """Flower's FedYogi with v₀ = ``v0`` and, for ``scope="parameters"``, buffers plainly averaged."""

    def __init__(self, *, v0: float, scope: Literal["parameters", "all"], **flower_args: float) -> None:
        super().__init__(**flower_args)
        self.v0, self.scope = v0, scope
        self.averaged: dict[str, Array] = {}  # this round's plain average of the out-of-scope tensors
        self.order: list[str] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = super().configure_train(server_round, arrays, config, grid)  # sets current_arrays
        self.order = list(arrays)
        if self.scope == "parameters" and self.current_arrays is not None:
            keys = self.schedule.parameter_keys
            if not keys:
                raise TrainingError("FedYogi's scope 'parameters' needs Schedule.parameter_keys")
            self.current_arrays = {k: v for k, v in self.current_arrays.items() if k in keys}
        return messages

    def _compute_deltat_and_mt(
        self, aggregated_arrayrecord: ArrayRecord
    ) -> tuple[dict[str, NDArray], dict[str, NDArray], dict[str, NDArray]]:
        tracked = self.current_arrays or {}
        self.averaged = {k: a for k, a in aggregated_arrayrecord.items() if k not in tracked}
        if self.v_t is None:  # Flower would start from zeros
            self.v_t = {
                k: np.full(x.shape, self.v0, np.result_type(x.dtype, np.float32)) for k, x in tracked.items()
            }
        in_scope = ArrayRecord({k: a for k, a in aggregated_arrayrecord.items() if k in tracked})
        return super()._compute_deltat_and_mt(in_scope)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or not self.averaged:
            return arrays, metrics
        merged = {**arrays, **self.averaged}
        return ArrayRecord({k: merged[k] for k in self.order}), metrics


@STRATEGIES.register("fedyogi")
class FedYogiSpec(StrategySpec):
    """FedYogi: adaptive server optimiser on parameters, v0 = tau² (Reddi et al. 2021; LN-FL)."""

    class Params(StrategyParams):
        eta: float = Field(0.01, gt=0, description="server learning rate η")
        beta_1: float = Field(0.9, ge=0, lt=1)
        beta_2: float = Field(0.99, ge=0, lt=1)
        tau: float = Field(1e-3, gt=0, description="adaptivity τ")
        v0: float | Literal["tau^2"] = Field("tau^2", description="initial v (Flower: 0)")
        scope: Literal["parameters", "all"] = Field(
            "parameters", description="tensors Yogi updates; the rest are averaged (Flower: all)"
        )

    @classmethod
    def server(cls, params: Params) -> Strategy:
        v0 = params.tau**2 if params.v0 == "tau^2" else float(params.v0)
        flower_args = params.model_dump(exclude={"v0", "scope"})
        return FedsimFedYogi(v0=v0, scope=params.scope, **flower_args)
