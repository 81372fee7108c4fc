"""The client half of a strategy: hooks through which an algorithm changes the one training loop.

An algorithm's client half is a :class:`ClientHooks` subclass overriding only what differs from
FedAvg; its options arrive typed, as the strategy's validated ``Params`` (``ClientHooks[P]``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from flwr.app import ArrayRecord, RecordDict
from pydantic import BaseModel
from torch import nn

from fedsim.arrays import dump_arrays, load_arrays
from fedsim.models import FedsimModel

P = TypeVar("P", bound=BaseModel)

@dataclass(frozen=True)
class RoundInfo:
    """What a client knows about the round it is training in."""

    server_round: int
    partition_id: int
    local_steps: int | None  # None: local_epochs counts the work
    local_epochs: int | None
    lr: float
    momentum: float  # the local SGD's (FedNova's normalisation counts it)
    class_counts: torch.Tensor  # this client's training samples per class (FedLC, FedRS)
    max_grad_norm: float | None = None  # each step's gradient clipped to this norm (train.max_grad_norm)


class FineTune(Protocol):
    """What :meth:`ClientHooks.personalize` is given for its client (:class:`fedsim.client.personal.Personalisation`):
    calling it runs the generic fine-tuning on a model; :meth:`train` runs a fine-tuning of the strategy's own
    through the one training loop, on the same client's personalisation batches, which continue from one call to
    the next."""

    training: RoundInfo  # the client's round as its training would run it: the run's local work, lr, momentum
    weight_decay: float  # the run's train.weight_decay

    def __call__(self, model: FedsimModel) -> None: ...

    def train(
        self, model: FedsimModel, params: Sequence[nn.Parameter], hooks: ClientHooks, lr: float, **work: Any
    ) -> None:
        """SGD of ``hooks``' loss on ``model`` changing ``params`` alone (any of ``model``'s, frozen ones included) at
        ``lr``; ``work``: ``steps`` or ``epochs`` (one of them), ``momentum`` and ``weight_decay`` (0 unless given)."""
        ...


def frozen_copy(model: FedsimModel) -> FedsimModel:
    """A copy of ``model`` (its device, dtype and memory format) in eval mode that takes no gradient: the other
    models a client term runs on the batch (MOON's global and previous models, FedNTD's global one)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


class ClientHooks(Generic[P]):
    """Client half of a strategy. The defaults are FedAvg; override only what differs.

    Call order per round: ``load_global`` -> ``begin_round`` -> K x (``adjust_logits``,
    ``extra_loss``, backward, ``correct_gradients``, SGD step of the model's and :meth:`own_parameters`)
    -> ``end_round`` -> ``reply_arrays``.
    Per evaluation: ``load_for_eval`` (the model scored as the global one), then, with ``eval.personal`` on,
    ``load_global`` into a copy and ``personalize`` (the model scored as the client's personalised one).
    ``state`` is the client's own persistent RecordDict (Flower's ``Context.state``): client state
    that crosses rounds lives there, never on the server.
    """

    def __init__(self, params: P) -> None:
        self.params = params

    def load_global(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        load_arrays(model, arrays)

    def load_for_eval(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        """The model a client is scored with: by default the one it would train from."""
        self.load_global(model, arrays, state)

    def own_parameters(self, model: FedsimModel) -> list[nn.Parameter]:
        """Parameters of the hooks' own (FedRoD's personal head) that the local SGD steps beside ``model``'s, at the
        same learning rate, momentum and weight decay, from the gradient the batch's loss gives them. Built on the
        first call from ``model``'s shapes; the same tensors on every later call (a worker builds its optimiser
        once), whose values the hooks reload per client in :meth:`begin_round`."""
        return []

    def personalize(self, model: FedsimModel, state: RecordDict, fine_tune: FineTune) -> nn.Module:
        """The model this client is scored with under personalised evaluation (``eval.personal``).

        ``model`` is a copy of the client's own, loaded as for training (:meth:`load_global`) and free to change;
        ``fine_tune(model)`` runs the generic personalisation on it: ``eval.personal.steps`` steps of the one
        training loop (plain cross-entropy, no hook of this strategy) on the client's training batches. A method
        that personalises otherwise overrides this (a personal head from ``state``, a fine-tuning of its own) and
        may return any module mapping the model's inputs to logits; the default is the generic fine-tuning."""
        fine_tune(model)
        return model

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        """Read what the server sent beside the model (e.g. SCAFFOLD's c)."""

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the batch's loss: ``x`` the batch's inputs, ``features`` the model's classifier input
        (its representation: the features through the projection head when the model has one), ``logits`` after
        :meth:`adjust_logits`, ``y`` the labels."""
        return None

    def correct_gradients(self, model: FedsimModel) -> None:
        """Change ``p.grad`` in place before the optimiser step (e.g. SCAFFOLD)."""

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        """Update client state after local work; return extra records for the reply."""
        return RecordDict()

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        return dump_arrays(model)
