"""FedExP (Jhunjhunwala, Wang & Joshi, ICLR 2023, Algorithm 1): FedAvg with an adaptive server step size.

Clients are FedAvg's. Server, over the M clients that replied, with Δ_i = x − y_i and Δ̄ = (1/M)·Σ_i Δ_i
(uniform weights, the paper's): η_g = max(1, Σ_i‖Δ_i‖² / (2M(‖Δ̄‖² + ε))) and x ← x − η_g·Δ̄
(:func:`fedexp_step`), on the trainable parameters (:class:`~fedsim.strategies.server_half.ServerSetup`'s
``parameter_keys``); the buffers (BN running statistics) take FedAvg's sample-weighted average. Where the bound
is at most 1 (one client: Σ‖Δ_i‖²/(2‖Δ̄‖²) = 1/2) η_g = 1 and the step is the uniform average of the y_i.

The iterates oscillate, so the paper scores the average of the last two global models, (x^{t+1} + x^t)/2:
``evaluate: average`` (default) has fedsim's round loop score that model
(:class:`~fedsim.strategies.server_half.ScoredModel`: the clients' and the global evaluation, ``model.pt``),
while training goes on from x^{t+1}; ``evaluate: last`` scores x^{t+1}. x^t is server state, so a checkpoint
holds it. docs/algorithms.md has the whole update and where the authors' code differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy
from pydantic import Field

from fedsim import wire
from fedsim.arrays import array_view, ndarray_to_array
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup, state_slots

PREVIOUS = "x"  # server_state slot: the global model x^t the last round started from


def fedexp_step(
    x: Mapping[str, np.ndarray], ys: Iterable[Mapping[str, np.ndarray]], epsilon: float
) -> tuple[dict[str, np.ndarray], float]:
    """Algorithm 1's server step: x − η_g·Δ̄ (float64, per tensor of ``x``) from the clients' models ``ys``, and
    η_g. The clients' Δ_i are summed as they are read, so no more than one of them is held at a time."""
    x = {k: np.asarray(v, dtype=np.float64) for k, v in x.items()}
    delta_sum = {k: np.zeros_like(v) for k, v in x.items()}
    sum_sq, m = 0.0, 0
    for y in ys:
        for k, x_k in x.items():
            delta_i = x_k - y[k]
            sum_sq += float(np.vdot(delta_i, delta_i))
            delta_sum[k] += delta_i
        m += 1
    delta_bar = {k: s / m for k, s in delta_sum.items()}
    bar_sq = sum(float(np.vdot(d, d)) for d in delta_bar.values())
    eta_g = max(1.0, sum_sq / (2 * m * (bar_sq + epsilon)))
    return {k: x[k] - eta_g * delta_bar[k] for k in x}, eta_g


def midpoint(a: Array, b: Array) -> Array:
    """(a + b)/2 in ``a``'s dtype (FedAvg's average makes an integer buffer, ``num_batches_tracked``, a float)."""
    new = array_view(a)
    return ndarray_to_array(np.asarray((new + array_view(b)) / 2, dtype=new.dtype))


class FedExPServer(FastAveraging):
    """FedAvg's average, then :func:`fedexp_step` on the parameters; scores the last two models' average."""

    def __init__(
        self, *, epsilon: float, evaluate: Literal["average", "last"], setup: ServerSetup, **flower_args: int
    ) -> None:
        super().__init__(**flower_args)
        self.epsilon, self.evaluate, self.parameter_keys = epsilon, evaluate, setup.parameter_keys

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = [m for m in replies if not m.has_error()]
        average, metrics = super().aggregate_train(server_round, replies)  # the buffers: FedAvg's average
        if average is None or self.x is None:
            return average, metrics
        keys = [k for k in self.x if k in self.parameter_keys]
        x = {k: array_view(self.x[k]) for k in keys}
        ys = ({k: array_view(m.content[wire.ARRAYS][k]) for k in keys} for m in replies)
        stepped, _ = fedexp_step(x, ys, self.epsilon)
        new = {k: ndarray_to_array(np.asarray(stepped[k], dtype=x[k].dtype)) if k in stepped else a
               for k, a in average.items()}  # fmt: skip
        return ArrayRecord(new), metrics

    def scored_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        if self.evaluate == "last" or self.x is None:  # before round 1 there is one model
            return arrays
        return ArrayRecord({k: midpoint(a, self.x[k]) for k, a in arrays.items()})

    def server_state(self) -> ArrayRecord:
        return ArrayRecord({f"{PREVIOUS}{wire.STATE_SEP}{k}": a for k, a in (self.x or {}).items()})

    def load_server_state(self, state: ArrayRecord) -> None:
        previous = state_slots(state).get(PREVIOUS)
        self.x = ArrayRecord({k: ndarray_to_array(a) for k, a in previous.items()}) if previous else None


@STRATEGIES.register("fedexp")
class FedExPSpec(StrategySpec):
    """FedExP: FedAvg with server step max(1, Σ‖Δ_i‖²/(2M(‖Δ̄‖²+ε))) (Jhunjhunwala et al. 2023)."""

    class Params(StrategySpec.Params):
        # ε > 0: with ε = 0, a round whose updates cancel or vanish (Δ̄ = 0: every client at zero loss, e.g. FedLC
        # under one class) divides by zero, and as Δ̄ → 0 η_g grows without bound
        epsilon: float = Field(1e-3, gt=0, description="ε in η_g's denominator (the paper's CIFAR-10 value)")
        evaluate: Literal["average", "last"] = Field(
            "average", description="score (x^{t+1} + x^t)/2, the paper's (average), or x^{t+1} (last)"
        )

    def server(self, setup: ServerSetup) -> Strategy:
        return FedExPServer(epsilon=self.params.epsilon, evaluate=self.params.evaluate, setup=setup, **EVERY_NODE)
