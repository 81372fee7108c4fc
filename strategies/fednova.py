"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalised averaging, as docs/algorithms.md fixes it.

Client i takes τ_i local steps of fedsim's SGD (momentum ρ = ``train.momentum``); its update is
Δ_i = y_i − x = −η·G_i·a_i, where a_i is the total weight momentum gives each of its τ_i gradients:
a_i = [1 − ρ^{τ_i}, …, 1 − ρ]/(1 − ρ), so ‖a_i‖₁ = [τ_i − ρ(1 − ρ^{τ_i})/(1 − ρ)]/(1 − ρ) (τ_i when ρ = 0).
The client sends ‖a_i‖₁ beside y_i. Server, on parameters, with p_i = n_i/Σ_{j∈S} n_j (FedAvg's weights):
d_i = Δ_i/‖a_i‖₁, τ_eff = Σ_{i∈S} p_i·‖a_i‖₁ (the paper's default) and x⁺ = x + τ_eff·Σ_{i∈S} p_i·d_i.
Buffers get FedAvg's sample-weighted average. Equal τ_i (``train.local_steps``) give equal ‖a_i‖₁, and then
x⁺ is FedAvg's average whatever ρ: the server returns that average as it is, bit for bit FedAvg's.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from fedsim import wire
from fedsim.arrays import array_view, tensor_to_array
from fedsim.errors import ProtocolError, TrainingError
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

FEDNOVA_A_NORM = "fednova.a-norm"  # client -> server: a MetricRecord holding ‖a_i‖₁
A_NORM = "a-norm"  # its entry


def a_norm(steps: int, momentum: float) -> float:
    """‖a_i‖₁ of ``steps`` steps of SGD with ``momentum`` ρ (PyTorch's form, no dampening: u ← ρu + g, w ← w − ηu).

    The authors' optimiser's sum (JYWa/FedNova ``distoptim/FedNova.py``): the counter c_k = ρ·c_{k−1} + 1 =
    (1 − ρ^k)/(1 − ρ) is a_i's entry for the gradient of the k-th step from the end (the last one's: 1);
    summed over the steps it is the paper's closed form, without the cancellation that form suffers as ρ → 1.
    Weight decay is part of the gradient (torch adds it before momentum, as the authors' code does) and leaves
    a_i as it is.
    """
    counter = total = 0.0
    for _ in range(steps):
        counter = momentum * counter + 1.0
        total += counter
    return total


class FedNovaServer(FastAveraging):
    """FedNova's server half: x + τ_eff·Σ p_i·Δ_i/‖a_i‖₁ on parameters, FedAvg's average on buffers."""

    def __init__(self, setup: ServerSetup, **flower_args: int) -> None:
        super().__init__(**flower_args)
        if not setup.parameter_keys:
            raise TrainingError("FedNova needs the model's parameter names (ServerSetup.parameter_keys)")
        self.setup = setup

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = [m for m in replies if not m.has_error()]
        # Flower's FedAvg takes exactly one MetricRecord per reply: this strategy's own record goes first
        norms = np.array([self._pop_a_norm(m) for m in replies], dtype=np.float64)
        average, metrics = super().aggregate_train(server_round, replies)  # buffers: FedAvg's average
        if average is None or self.x is None or np.all(norms == norms[0]):
            return average, metrics  # equal ‖a_i‖₁: τ_eff/‖a_i‖₁ = 1 and x⁺ is the average itself
        n = np.array([float(wire.reply_metric(m, wire.NUM_EXAMPLES)) for m in replies])
        p = n / n.sum()
        tau_eff = float(p @ norms)
        # a client that took no step (‖a_i‖₁ = 0) moved nothing: d_i = 0
        scale = np.divide(tau_eff * p, norms, out=np.zeros_like(p), where=norms > 0)
        updated = {}
        for k in self.setup.parameter_keys:  # in float64, rounded once to the parameter's dtype
            x = array_view(self.x[k])
            x64 = x.astype(np.float64)
            new = x64.copy()
            for s, m in zip(scale, replies, strict=True):
                if s != 0:
                    new += s * (array_view(m.content[wire.ARRAYS][k]) - x64)
            updated[k] = tensor_to_array(torch.from_numpy(new.astype(x.dtype)))
        return ArrayRecord({k: updated.get(k, a) for k, a in average.items()}), metrics

    @staticmethod
    def _pop_a_norm(reply: Message) -> float:
        record = reply.content.metric_records.get(FEDNOVA_A_NORM)
        if record is None or A_NORM not in record:
            raise ProtocolError(
                f"node {reply.metadata.src_node_id}: its reply has no {FEDNOVA_A_NORM!r} record with {A_NORM!r}: "
                "are its clients running FedNova's client half?"
            )
        reply.content.pop(FEDNOVA_A_NORM)
        return float(record[A_NORM])


class FedNovaClient(ClientHooks["FedNovaSpec.Params"]):
    """Trains as FedAvg; sends ‖a_i‖₁ of the steps it took."""

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        return RecordDict({FEDNOVA_A_NORM: MetricRecord({A_NORM: a_norm(steps, info.momentum)})})


@STRATEGIES.register("fednova")
class FedNovaSpec(StrategySpec):
    """FedNova: updates normalised by ‖a_i‖₁ (local steps, momentum), rescaled by τ_eff (Wang et al. 2020)."""

    Client = FedNovaClient
    protocol = (
        wire.Key(wire.TRAIN, "client → server", FEDNOVA_A_NORM, A_NORM, "float", "‖a_i‖₁ of the client's local steps"),
    )

    def server(self, setup: ServerSetup) -> Strategy:
        return FedNovaServer(setup, **EVERY_NODE)
