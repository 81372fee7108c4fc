"""``simulation.vmap_clients``: several clients' local steps at once, everything about it in one place.

The paper's rounds are 10 clients x 10 steps of a small CNN at batch 32: on a GPU each step is a
few dozen small kernels, launched one client after another. With ``simulation.vmap_clients: N`` a
worker trains up to N of a round's clients together (:func:`train_groups`, :func:`train_together`):
every step stacks each client's own parameters (so gradients flow back to each client's own model)
and runs one ``torch.func.vmap`` forward over the stacked batches (:class:`StackedForward`).
Everything else stays per client and unchanged: the batches (each client's own seeded stream), the
strategy's hooks on each client's own model, the SGD update, through the one training loop.

A model qualifies when its forward is a pure function of parameters and input: no running
statistics to update (BN, ln_goldschmidt) and no per-client noise stream (ln_randomized). The
forward runs through the first client's module, so forward hooks a strategy registers on its
clients' models do not run per client: a strategy that needs them keeps ``vmap_clients: 1``.
:func:`refusal` says, before anything runs, why a run cannot use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from flwr.app import Context, Message, MessageType
from torch import nn

from fedsim import wire
from fedsim.client.runtime import ClientRuntime, config_of, runtime_for
from fedsim.client.training import ClientRound, train_local
from fedsim.config import RunConfig
from fedsim.models import FedsimModel
from fedsim.norms import draws_own_noise


class _FeaturesAndLogits(nn.Module):
    """``model``'s features and logits from one call, for ``functional_call``."""

    def __init__(self, model: FedsimModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.model.project(self.model.forward_features(x))  # the classifier's input, which the hooks get
        return z, self.model.classifier(z)


class StackedForward:
    """The :data:`fedsim.client.training.Forward` of clients whose models share one architecture."""

    def __init__(self, models: Sequence[FedsimModel]) -> None:
        self.template = _FeaturesAndLogits(models[0])
        names = [name for name, _ in models[0].named_parameters()]
        self.parameters = {f"model.{n}": [dict(m.named_parameters())[n] for m in models] for n in names}
        self._vmapped = torch.func.vmap(self._one, in_dims=(0, 0))

    def _one(self, parameters: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.func.functional_call(self.template, parameters, (x,))

    def __call__(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        # stacked anew each step: torch.stack is differentiable, so each client's gradient lands in its
        # own model's parameters, where the hooks (SCAFFOLD, FedProx) and the optimizer expect it
        stacked = {name: torch.stack(per_client) for name, per_client in self.parameters.items()}
        return self._vmapped(stacked, torch.stack(xs))


def why_not_vectorized(model: nn.Module) -> str | None:
    """Why ``model`` cannot train several clients in one vmapped forward, or None when it can."""
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        shown = ", ".join(buffers[:3]) + (", ..." if len(buffers) > 3 else "")
        return f"it keeps running statistics ({shown}), which one vmapped forward cannot update per client"
    if any(draws_own_noise(m) for m in model.modules()):
        return "it draws noise from a per-client stream (reseed()), which a vmapped forward would share"
    return None


def refusal(
    cfg: RunConfig, launcher: Literal["run", "deploy"], build_model: Callable[[], nn.Module] | None = None
) -> str | None:
    """Why ``cfg`` cannot train clients together under ``launcher`` (one line naming the field), or None;
    ``build_model`` makes the run's model, checked when given and the config alone allows vmap."""
    n = cfg.simulation.vmap_clients
    if n == 1:
        return None
    field = f"simulation.vmap_clients = {n}"
    if launcher == "deploy":
        return f"{field}: under fedsim deploy each SuperNode trains its one client; set simulation.vmap_clients: 1"
    if cfg.engine != "local":
        return (
            f"{field} needs engine: local (engine {cfg.engine!r} hands a ClientApp one client at a time); "
            "or set simulation.vmap_clients: 1"
        )
    if cfg.train.local_epochs is not None:
        return (
            f"{field} needs train.local_steps: clients training together take equal step counts, and "
            "train.local_epochs gives each client its own; unset train.local_epochs or set simulation.vmap_clients: 1"
        )
    why = why_not_vectorized(build_model()) if build_model is not None else None
    if why is not None:
        return (
            f"{field}: model {cfg.model.name!r} with model.norm {cfg.model.norm.name!r} cannot train clients "
            f"together: {why}; use a norm without running statistics or noise (ln, gn, fn, rms, none, ...) "
            "or simulation.vmap_clients: 1"
        )
    return None


def train_groups(jobs: Sequence[tuple[Message, Context]]) -> list[list[int]]:
    """Which of ``jobs`` train together: up to ``simulation.vmap_clients`` train messages of one run at a
    time, in order, as lists of two or more indices. Every other job goes alone through the ClientApp,
    a client without training data too (it takes no step, and clients training together take equal
    step counts)."""
    runs: dict[int, tuple[int, list[int]]] = {}
    for i, (msg, context) in enumerate(jobs):
        try:
            if msg.metadata.message_type != MessageType.TRAIN:
                continue
            if config_of(wire.run_config_json(msg)).simulation.vmap_clients == 1:  # read without a runtime
                continue
            runtime = runtime_for(msg)
            has_data = len(runtime.data(wire.node_partition(context)).y_train) > 0
        except Exception:  # a message this cannot read, or a runtime that cannot start: the ClientApp reports it
            continue
        if has_data:
            runs.setdefault(id(runtime), (runtime.cfg.simulation.vmap_clients, []))[1].append(i)
    groups = [ids[k : k + width] for width, ids in runs.values() for k in range(0, len(ids), width)]
    return [g for g in groups if len(g) > 1]


def train_together(jobs: Sequence[tuple[Message, Context]]) -> list[Message]:
    """Train one group of :func:`train_groups` at once, one vmapped forward per step.

    A client whose own set-up or reply raises gets an error reply and the others go on; an error in the
    shared steps is every client's.
    """
    runtime: ClientRuntime = runtime_for(jobs[0][0])
    replies: dict[int, Message] = {}
    clients: dict[int, ClientRound] = {}
    for i, (msg, context) in enumerate(jobs):
        try:
            clients[i] = runtime.begin(len(clients), msg, context)
        except Exception as err:  # the server's failure policy decides, per client
            replies[i] = wire.error_reply(msg, err)
    if clients:
        models = [work.model for work in clients.values()]
        forward = StackedForward(models) if len(models) > 1 else None
        results = train_local(list(clients.values()), runtime.optimizer(len(clients)), forward)
        for (i, work), result in zip(clients.items(), results, strict=True):
            msg, context = jobs[i]
            try:
                replies[i] = runtime.reply(work, msg, context, result)
            except Exception as err:
                replies[i] = wire.error_reply(msg, err)
    return [replies[i] for i in range(len(jobs))]
