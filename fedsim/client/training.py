"""The one local training loop.

Every strategy, normaliser and engine trains through :func:`train_local`: one client at a time, or
several at once (``simulation.vmap_clients``, :mod:`fedsim.client.vectorized`). Algorithms change
it only through their :class:`~fedsim.strategies.hooks.ClientHooks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedsim.client.sgd import LocalSgd
from fedsim.data.batches import BatchStream
from fedsim.models import FedsimModel
from fedsim.strategies.hooks import ClientHooks, RoundInfo


@dataclass(frozen=True)
class TrainResult:
    num_examples: int
    steps: int
    mean_loss: float


@dataclass(frozen=True)
class ClientRound:
    """One client's local work in a round: the model it trains, its strategy hooks, its batches."""

    model: FedsimModel
    hooks: ClientHooks
    stream: BatchStream
    info: RoundInfo

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = self.info
        return self.stream.epochs(info.local_epochs) if info.local_epochs else self.stream.batches(info.local_steps)


# The clients' inputs of one step -> each client's (features, logits), indexable by client
Forward = Callable[[list[torch.Tensor]], tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]]


def client_loss(
    work: ClientRound, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """A client's training loss on one batch: cross-entropy of the hooks' logits plus the hooks' extra term."""
    logits = work.hooks.adjust_logits(logits, work.info)
    loss = F.cross_entropy(logits, y)
    extra = work.hooks.extra_loss(work.model, x, features, logits, y)
    return loss if extra is None else loss + extra


def own_forward(model: FedsimModel) -> Forward:
    """One client through its model's own forward."""

    def forward(xs: list[torch.Tensor]) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
        z = model.project(model.forward_features(xs[0]))  # the classifier's input, which the hooks get
        return (z,), (model.classifier(z),)

    return forward


# Called after each step with the steps taken so far and each client's loss of that step
AfterStep = Callable[[int, torch.Tensor], None]


def train_local(
    clients: Sequence[ClientRound],
    optimizer: LocalSgd,
    forward: Forward | None = None,
    after_step: AfterStep | None = None,
) -> list[TrainResult]:
    """Run the round's local work of every client: K mini-batch steps (or whole epochs) of SGD with the hooks.

    One client trains on its model's own forward. Several train together when ``forward`` computes
    all of them at once (vmap over their stacked parameters): their losses are summed and share no
    parameter, so every client's gradient, hooks and SGD update are its own; ``optimizer`` holds
    every client's parameters. Clients training together take equal step counts. ``after_step``
    observes the models between steps (``fedsim local`` scores them there); it may switch them to
    eval mode, training resumes in train mode.
    """
    if forward is None:
        (only,) = clients
        forward = own_forward(only.model)
    for work in clients:
        work.model.train()
    optimizer.reset()  # momentum must not leak from the previous round or another client
    totals, steps = torch.zeros(len(clients), device=clients[0].stream.x.device), 0  # summed where the losses are
    for batch in zip(*(work.batches() for work in clients), strict=True):
        xs, ys = [x for x, _ in batch], [y for _, y in batch]
        features, logits = forward(xs)
        losses = torch.stack(
            [client_loss(work, xs[i], features[i], logits[i], ys[i]) for i, work in enumerate(clients)]
        )
        optimizer.zero_grad()
        losses.sum().backward()
        for work in clients:
            work.hooks.correct_gradients(work.model)
            if work.info.max_grad_norm is not None:  # the client's whole gradient, corrections included
                parameters = [*work.model.parameters(), *work.hooks.own_parameters(work.model)]
                torch.nn.utils.clip_grad_norm_(parameters, work.info.max_grad_norm)
        optimizer.step()
        totals += losses.detach()
        steps += 1
        if after_step is not None:
            after_step(steps, losses.detach())
            for work in clients:
                work.model.train()
    # a NaN / inf loss is reported, not raised: the server stops the run whatever its failure policy
    return [
        TrainResult(num_examples=steps * work.stream.batch_size, steps=steps, mean_loss=total / max(steps, 1))
        for work, total in zip(clients, totals.tolist(), strict=True)  # the one read back from the device
    ]
