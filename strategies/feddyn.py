"""FedDyn (Acar et al., ICLR 2021, Algorithm 1), as docs/algorithms.md fixes it.

Client k, given θ^{t−1}: K SGD steps on L_k(θ) − ⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖², the regulariser's gradient
−g_k + α(θ − θ^{t−1}) added to each step's gradient (so the reported training loss stays the cross-entropy);
then g_k ← g_k − α(θ_k^t − θ^{t−1}), kept in its own ``Context.state`` (g_k = ∇L_k(θ_k^{t−1}) starts at zero).
Server: h ← h − α·(1/N)·Σ_{k∈P}(θ_k − θ^{t−1}) with N all clients, θ^t = (1/|P|)·Σ_{k∈P} θ_k − h/α, h from zero
and checkpointed. Both cover the trainable parameters (``ServerSetup.parameter_keys``); buffers get FedAvg's
sample-weighted average. The authors' code (alpemreacar/FedDyn) scales α per client by its data size; fedsim
follows Algorithm 1 (docs/algorithms.md lists the differences).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy
from pydantic import Field

from fedsim import wire
from fedsim.arrays import array_view, tensor_to_array
from fedsim.errors import TrainingError
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.scaffold import ControlVariate
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup, state_record, state_slots

FEDDYN_GRAD = "feddyn.grad"  # Context.state: the client's g_k = ∇L_k(θ_k^{t−1})


class FedDynServer(FastAveraging):
    """FedDyn's server half: θ^t = uniform mean of the replies − h/α on parameters, h over all N clients."""

    def __init__(self, alpha: float, setup: ServerSetup, **flower_args: int) -> None:
        super().__init__(**flower_args)
        if not setup.parameter_keys:
            raise TrainingError("FedDyn needs the model's parameter names (ServerSetup.parameter_keys)")
        self.alpha, self.setup = alpha, setup
        self.h: dict[str, np.ndarray] | None = None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = [m for m in replies if not m.has_error()]
        y_avg, metrics = super().aggregate_train(server_round, replies)  # buffers: FedAvg's average
        if y_avg is None or self.x is None:
            return y_avg, metrics
        if self.h is None:
            self.h = {k: np.zeros_like(array_view(self.x[k])) for k in self.setup.parameter_keys}
        alpha, m, updated = self.alpha, self.setup.num_clients, {}
        for k in self.setup.parameter_keys:
            x = array_view(self.x[k])
            theta_bar = sum(array_view(r.content[wire.ARRAYS][k]) for r in replies) / len(replies)
            # (1/m)·Σ_{k∈P}(θ_k − θ^{t−1}) = (|P|/m)·(θ̄ − θ^{t−1})
            self.h[k] = np.asarray(self.h[k] - alpha * (len(replies) / m) * (theta_bar - x), dtype=x.dtype)
            theta = np.asarray(theta_bar - self.h[k] / alpha, dtype=x.dtype)
            updated[k] = tensor_to_array(torch.from_numpy(theta))
        return ArrayRecord({k: updated.get(k, a) for k, a in y_avg.items()}), metrics

    def server_state(self) -> ArrayRecord:
        return state_record({"h": self.h})

    def load_server_state(self, state: ArrayRecord) -> None:
        slots = state_slots(state)
        if "h" in slots:
            self.h = slots["h"]


class FedDynClient(ClientHooks["FedDynSpec.Params"]):
    """Adds −g_k + α(θ − θ^{t−1}) to each gradient; after the round updates g_k in ``Context.state``."""

    theta_prev: dict[str, torch.Tensor]
    g: ControlVariate
    correction: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        device = next(model.parameters()).device
        self.g = (
            ControlVariate.from_record(state[FEDDYN_GRAD], device)
            if FEDDYN_GRAD in state
            else ControlVariate.zeros_like(model)
        )
        named = list(model.named_parameters())
        self.theta_prev = {n: p.detach().clone() for n, p in named}
        self.correction = [(p, self.theta_prev[n], self.g.tensors[n]) for n, p in named]

    def correct_gradients(self, model: FedsimModel) -> None:
        alpha = self.params.alpha
        for p, theta_prev, g in self.correction:
            # ∇[−⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖²] = α(θ − θ^{t−1}) − g_k
            term = alpha * (p.detach() - theta_prev) - g
            if p.grad is None:
                p.grad = term
            else:
                p.grad.add_(term)

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        alpha, g = self.params.alpha, self.g.tensors
        g_new = {n: g[n] - alpha * (p.detach() - self.theta_prev[n]) for n, p in model.named_parameters()}
        state[FEDDYN_GRAD] = ControlVariate(g_new).to_record()
        return RecordDict()


@STRATEGIES.register("feddyn")
class FedDynSpec(StrategySpec):
    """FedDyn: dynamic regularisation, client g_k and server h over parameters (Acar et al. 2021)."""

    Client = FedDynClient
    protocol = (
        wire.Key(wire.CLIENT_STATE, "client", FEDDYN_GRAD, "*", "ArrayRecord", "g_k, the client's ∇L_k(θ_k^{t−1})"),
    )

    class Params(StrategySpec.Params):
        alpha: float = Field(0.01, gt=0, description="regulariser weight α (the authors' CIFAR-10 value)")

    def server(self, setup: ServerSetup) -> Strategy:
        return FedDynServer(self.params.alpha, setup, **EVERY_NODE)
