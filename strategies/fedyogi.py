"""FedYogi (Reddi et al., ICLR 2021) with LN-FL's choices: v₀ = τ², parameters only.

Server: Δ = weighted avg(y_i) − x; m ← β₁m + (1−β₁)Δ; v ← v − (1−β₂)Δ²·sign(v − Δ²);
x ← x + η·m/(√v + τ) (:func:`yogi_step`, Flower's float operations in Flower's order). v starts at
``v0`` (default τ², LN-FL; Flower's ``FedYogi`` starts at 0) and, with ``scope: parameters``
(default), the buffers (BN running statistics) take FedAvg's plain average instead of the Yogi step
(Flower's treats every tensor alike). ``v0: 0`` with ``scope: all`` is Flower's FedYogi exactly
(tested against it). docs/algorithms.md has the whole update.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy
from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, field_validator
from pydantic_core import PydanticCustomError

from fedsim.arrays import array_view, ndarray_to_array
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup
from fedsim.strategies.server_opt import AdaptiveParams, FedOptState


def yogi_step(
    x: np.ndarray, y: np.ndarray, m: np.ndarray, v: np.ndarray, eta: float, beta_1: float, beta_2: float, tau: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Yogi update of one tensor: the new x, m and v from the average ``y`` of the clients' models."""
    delta = y - x
    m = beta_1 * m + (1 - beta_1) * delta
    v = v - (1.0 - beta_2) * (delta**2) * np.sign(v - delta**2)
    return x + eta * m / (np.sqrt(v) + tau), m, v


class FedYogiServer(FedOptState, FastAveraging):
    """FedAvg's average, then :func:`yogi_step` on the tensors in scope (``tracked``; None: all)."""

    def __init__(
        self,
        *,
        eta: float,
        beta_1: float,
        beta_2: float,
        tau: float,
        v0: float,
        tracked: frozenset[str] | None,
        **flower_args: int,
    ) -> None:
        super().__init__(**flower_args)
        self.eta, self.beta_1, self.beta_2, self.tau, self.v0 = eta, beta_1, beta_2, tau, v0
        self.tracked = tracked
        self.m_t: dict[str, np.ndarray] | None = None
        self.v_t: dict[str, np.ndarray] | None = None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        average, metrics = super().aggregate_train(server_round, replies)
        if average is None or self.x is None:
            return average, metrics
        keys = [k for k in self.x if self.tracked is None or k in self.tracked]
        if self.m_t is None or self.v_t is None:
            first = {k: array_view(average[k]) for k in keys}
            self.m_t = {k: np.zeros_like(a) for k, a in first.items()}
            self.v_t = {k: np.full(a.shape, self.v0, np.result_type(a.dtype, np.float32)) for k, a in first.items()}
        new = dict(average.items())
        for k in keys:
            x, self.m_t[k], self.v_t[k] = yogi_step(
                array_view(self.x[k]), array_view(average[k]), self.m_t[k], self.v_t[k],
                self.eta, self.beta_1, self.beta_2, self.tau,
            )  # fmt: skip
            new[k] = ndarray_to_array(np.asarray(x))
        return ArrayRecord({k: new[k] for k in self.x}), metrics


@STRATEGIES.register("fedyogi")
class FedYogiSpec(StrategySpec):
    """FedYogi: adaptive server optimiser on parameters, v0 = tau² (Reddi et al. 2021; LN-FL)."""

    class Params(AdaptiveParams):
        eta: float = Field(0.01, gt=0, description="server learning rate η (LN-FL)")
        v0: float | Literal["tau^2"] = Field("tau^2", description="initial v, >= 0 (Flower: 0)")
        scope: Literal["parameters", "all"] = Field(
            "parameters", description="tensors Yogi updates; the rest are averaged (Flower: all)"
        )

        @field_validator("v0", mode="wrap")
        @classmethod
        def _v0_range(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> float | str:
            # v stays >= 0, so √v exists, only from v0 >= 0 (with 0 <= β₂ < 1 the Yogi step keeps it
            # there): a negative v0 is NaN in round 1. One error, not one per member of the union.
            try:
                v0 = handler(value)
            except ValidationError:
                v0 = None
            if v0 is None or (v0 != "tau^2" and v0 < 0):
                raise PydanticCustomError(
                    "v0_range", "Input should be 'tau^2' or a finite number greater than or equal to 0 (Yogi takes √v)"
                )
            return v0

    def server(self, setup: ServerSetup) -> Strategy:
        p = self.params
        v0 = p.tau**2 if p.v0 == "tau^2" else float(p.v0)
        tracked = setup.parameter_keys if p.scope == "parameters" else None
        return FedYogiServer(
            eta=p.eta, beta_1=p.beta_1, beta_2=p.beta_2, tau=p.tau, v0=v0, tracked=tracked, **EVERY_NODE
        )
