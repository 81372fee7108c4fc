"""Personalised evaluation (``eval.personal``, docs/algorithms.md): each client's model after its method's
personalisation, scored on its test split beside the global model.

A worker keeps one copy of the model for it, so the model the global score used is never changed. The
generic personalisation (:meth:`fedsim.strategies.hooks.ClientHooks.personalize`'s default) fine-tunes the
copy through the one training loop with plain hooks (cross-entropy, nothing of the strategy's), on batches
drawn from a seed of its own (:func:`personal_seed`): the training batches, and so every number of the run's
training, are those of a run without it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, Forward, train_local
from fedsim.config import RunConfig
from fedsim.data.batches import BatchStream
from fedsim.models import FedsimModel
from fedsim.norms import seed_norm_noise
from fedsim.registry import PluginParams
from fedsim.strategies.hooks import ClientHooks, RoundInfo

# The fourth entry of the fine-tuning batches' seed sequence: the training batches' (round_seed) has three, so
# the two streams never coincide
PERSONAL_STREAM = 1


def personal_seed(seed: int, server_round: int, partition_id: int) -> int:
    """The seed of one client's fine-tuning batches (and its normalisers' noise) at one evaluation round."""
    return int(np.random.SeedSequence([seed, server_round, partition_id, PERSONAL_STREAM]).generate_state(1)[0])


def classifier_forward(model: FedsimModel) -> Forward:
    """The forward of a classifier-only fine-tuning: the rest of the model as received (eval mode, so its norms'
    running statistics are neither used from the batch nor updated; no gradient), the classifier training."""

    def forward(xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model.eval()
        model.classifier.train()
        with torch.no_grad():
            z = model.project(model.forward_features(xs[0]))
        return [z], [model.classifier(z)]

    return forward


class Personaliser:
    """A worker's model copy for personalised evaluation, and its generic fine-tuning: SGD on what
    ``eval.personal.params`` names, with ``train``'s momentum and weight decay, at ``eval.personal.lr`` or
    ``train.lr``."""

    def __init__(self, model: FedsimModel, cfg: RunConfig) -> None:
        self.model = copy.deepcopy(model)
        personal, t = cfg.eval.personal, cfg.train
        self.steps, self.classifier_only = personal.steps or 0, personal.params == "classifier"
        self.lr, self.momentum, self.weight_decay = personal.lr or t.lr, t.momentum, t.weight_decay
        self.hooks: ClientHooks = ClientHooks(PluginParams())  # plain cross-entropy, nothing of the strategy's

    def fine_tune(self, stream: BatchStream, training: RoundInfo, seed: int) -> Personalisation:
        """What a strategy's ``personalize`` is given for one client: ``training`` its round as the run trains it,
        ``stream`` its personalisation batches; ``seed`` seeds its normalisers' noise."""
        return Personalisation(self, stream, training, seed)


class Personalisation:
    """One client's personalisation (the :class:`~fedsim.strategies.hooks.FineTune` a strategy's ``personalize``
    gets): the generic fine-tuning, or a fine-tuning of the strategy's own, on the client's personalisation batches
    through the one training loop."""

    def __init__(self, tuner: Personaliser, stream: BatchStream, training: RoundInfo, seed: int) -> None:
        self.tuner, self.stream, self.training = tuner, stream, training
        self.weight_decay = tuner.weight_decay
        seed_norm_noise(tuner.model, seed)

    def __call__(self, model: FedsimModel) -> None:
        """The generic fine-tuning: ``eval.personal.steps`` steps of plain cross-entropy on what
        ``eval.personal.params`` names. Zero steps leave the model as it is."""
        tuner = self.tuner
        if not tuner.steps:
            return
        tuned = [p for p in (model.classifier if tuner.classifier_only else model).parameters() if p.requires_grad]
        forward = classifier_forward(model) if tuner.classifier_only else None
        info = replace(self.training, local_steps=tuner.steps, local_epochs=None, lr=tuner.lr)
        optimizer = LocalSgd(tuned, tuner.lr, tuner.momentum, tuner.weight_decay)
        self._run(model, tuned, tuner.hooks, info, optimizer, forward)

    def train(
        self,
        model: FedsimModel,
        params: Sequence[nn.Parameter],
        hooks: ClientHooks,
        lr: float,
        *,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        steps: int | None = None,
        epochs: int | None = None,
    ) -> None:
        """``steps`` steps (or ``epochs`` passes) of ``hooks``' loss on ``model``, SGD on ``params`` alone: the
        rest of the model takes no gradient meanwhile (a frozen parameter among ``params`` trains)."""
        if (steps is None) == (epochs is None):
            raise ValueError("train: give steps or epochs, one of them")
        info = replace(self.training, local_steps=steps, local_epochs=epochs, lr=lr, momentum=momentum)
        self._run(model, params, hooks, info, LocalSgd(params, lr, momentum, weight_decay))

    def _run(
        self,
        model: FedsimModel,
        params: Sequence[nn.Parameter],
        hooks: ClientHooks,
        info: RoundInfo,
        optimizer: LocalSgd,
        forward: Forward | None = None,
    ) -> None:
        info = replace(info, max_grad_norm=None)  # fine-tuning has step sizes of its own; the clipping is the rounds'
        trained = {id(p) for p in params}
        flags = [(p, p.requires_grad) for p in model.parameters()]
        for p, _ in flags:
            p.requires_grad_(id(p) in trained)
        try:
            train_local([ClientRound(model, hooks, self.stream, info)], optimizer, forward)
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)
