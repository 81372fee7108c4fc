"""SCAFFOLD, option II (Karimireddy et al., ICML 2020), as docs/algorithms.md fixes it.

Client: w ← w − η_l(∇f(w) − c_i + c) for K steps from x, then c_i⁺ = c_i − c + (x − y_i)/(K·η_l);
it sends y_i (like every fedsim client) and Δc_i = c_i⁺ − c_i, and keeps c_i⁺ in its own
``Context.state``. c_i starts at zero (Flower's niid_bench baseline starts it at the weights).
Server: x ← x + η_g·avg(y_i − x) on parameters with ``weighting`` samples (FedAvg's weights) or
uniform; buffers are FedAvg's sample-weighted average, never corrected; c ← c + (|S|/N)·mean(Δc_i).

Control variates cover the trainable parameters only (``model.named_parameters()``; the server
takes the names from its :class:`~fedsim.strategies.server_half.ServerSetup`). The c_i⁺ formula assumes plain SGD: with
``train.momentum`` or ``train.weight_decay`` set, K·η_l no longer measures the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from pydantic import Field
from torch import nn

from fedsim import wire
from fedsim.arrays import array_view, tensor_to_array, to_array_record
from fedsim.errors import TrainingError
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup, state_record, state_slots

SCAFFOLD_C = "scaffold.c"  # server -> client: the server control variate c
SCAFFOLD_DELTA_C = "scaffold.delta-c"  # client -> server: Δc_i = c_i⁺ − c_i
SCAFFOLD_C_I = "scaffold.c-i"  # Context.state: the client control variate c_i


@dataclass
class ControlVariate:
    """A SCAFFOLD control variate (the server's c or a client's c_i): a tensor per parameter name."""

    tensors: dict[str, torch.Tensor]

    @classmethod
    def zeros_like(cls, model: nn.Module) -> ControlVariate:
        return cls({name: torch.zeros_like(p) for name, p in model.named_parameters()})

    @classmethod
    def from_record(cls, record: ArrayRecord, device: torch.device | None = None) -> ControlVariate:
        return cls({k: torch.tensor(array_view(a), device=device) for k, a in record.items()})

    def to_record(self) -> ArrayRecord:
        return to_array_record(self.tensors)


class ScaffoldServer(FastAveraging):
    """SCAFFOLD's server half: sends c, applies η_g to the parameters' update, updates c."""

    def __init__(
        self, eta_g: float, weighting: Literal["samples", "uniform"], setup: ServerSetup, **flower_args: int
    ) -> None:
        super().__init__(**flower_args)
        if not setup.parameter_keys:
            raise TrainingError("SCAFFOLD needs the model's parameter names (ServerSetup.parameter_keys)")
        self.eta_g, self.weighting, self.setup = eta_g, weighting, setup
        self.c: ControlVariate | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.c is None:
            zeros = {k: torch.from_numpy(np.zeros_like(array_view(arrays[k]))) for k in self.setup.parameter_keys}
            self.c = ControlVariate(zeros)
        messages = list(super().configure_train(server_round, arrays, config, grid))  # keeps x
        c = self.c.to_record()
        for message in messages:
            message.content[SCAFFOLD_C] = c
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        # Flower's FedAvg takes exactly one ArrayRecord per reply: this strategy's own record goes first
        delta_c = [ControlVariate.from_record(m.content.pop(SCAFFOLD_DELTA_C)) for m in replies]
        y_avg, metrics = super().aggregate_train(server_round, replies)  # buffers: FedAvg's average
        if y_avg is None or self.x is None or self.c is None:
            return y_avg, metrics
        updated = {}
        for k in self.setup.parameter_keys:
            x = array_view(self.x[k])
            if self.weighting == "uniform":
                y = sum(array_view(m.content[wire.ARRAYS][k]) for m in replies) / len(replies)
            else:
                y = array_view(y_avg[k])
            x_new = np.asarray(x + self.eta_g * (y - x), dtype=x.dtype)
            updated[k] = tensor_to_array(torch.from_numpy(x_new))
        arrays = ArrayRecord({k: updated.get(k, a) for k, a in y_avg.items()})
        share = len(replies) / self.setup.num_clients  # |S| / N
        for k, c in self.c.tensors.items():
            c += share * torch.stack([d.tensors[k] for d in delta_c]).mean(0)
        return arrays, metrics

    def server_state(self) -> ArrayRecord:
        return state_record({"c": {k: v.numpy() for k, v in self.c.tensors.items()} if self.c else None})

    def load_server_state(self, state: ArrayRecord) -> None:
        slots = state_slots(state)
        if "c" in slots:
            self.c = ControlVariate({k: torch.from_numpy(v) for k, v in slots["c"].items()})


class ScaffoldClient(ClientHooks["ScaffoldSpec.Params"]):
    """Corrects each gradient by c − c_i; after K steps updates c_i in ``Context.state``."""

    c: ControlVariate
    c_i: ControlVariate
    x: dict[str, torch.Tensor]
    correction: list[tuple[torch.Tensor, torch.Tensor]]

    def begin_round(
        self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo
    ) -> None:
        if SCAFFOLD_C not in content:
            raise TrainingError(f"the server sent no {SCAFFOLD_C!r} record: is it running SCAFFOLD?")
        device = next(model.parameters()).device
        self.c = ControlVariate.from_record(content[SCAFFOLD_C], device)
        if SCAFFOLD_C_I in state:
            self.c_i = ControlVariate.from_record(state[SCAFFOLD_C_I], device)
        else:
            self.c_i = ControlVariate.zeros_like(model)
        named = list(model.named_parameters())
        self.x = {n: p.detach().clone() for n, p in named}
        self.correction = [(p, self.c.tensors[n] - self.c_i.tensors[n]) for n, p in named]

    def correct_gradients(self, model: FedsimModel) -> None:
        for p, correction in self.correction:
            if p.grad is None:
                p.grad = correction.clone()
            else:
                p.grad.add_(correction)

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        c, c_i = self.c.tensors, self.c_i.tensors
        c_plus = dict(c_i)  # no step taken, nothing learned about the drift
        if steps > 0:
            c_plus = {
                n: c_i[n] - c[n] + (self.x[n] - y.detach()) / (steps * info.lr)
                for n, y in model.named_parameters()
            }
        state[SCAFFOLD_C_I] = ControlVariate(c_plus).to_record()
        delta = ControlVariate({n: c_plus[n] - c_i[n] for n in c_plus})
        return RecordDict({SCAFFOLD_DELTA_C: delta.to_record()})


@STRATEGIES.register("scaffold")
class ScaffoldSpec(StrategySpec):
    """SCAFFOLD option II: control variates on parameters, c_i from zero (Karimireddy et al. 2020)."""

    Client = ScaffoldClient
    protocol = (
        wire.Key(wire.TRAIN, "server → client", SCAFFOLD_C, "*", "ArrayRecord", "the server control variate c"),
        wire.Key(wire.TRAIN, "client → server", SCAFFOLD_DELTA_C, "*", "ArrayRecord", "Δc_i = c_i⁺ − c_i"),
        wire.Key(wire.CLIENT_STATE, "client", SCAFFOLD_C_I, "*", "ArrayRecord", "the client control variate c_i"),
    )

    class Params(StrategySpec.Params):
        eta_g: float = Field(1.0, gt=0, description="server learning rate η_g")
        weighting: Literal["samples", "uniform"] = Field(
            "samples", description="weights of avg(Δy): client sample counts (FedAvg's) or 1/|S|"
        )

    def server(self, setup: ServerSetup) -> Strategy:
        return ScaffoldServer(self.params.eta_g, self.params.weighting, setup, **EVERY_NODE)

