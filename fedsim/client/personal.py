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

import numpy as np
import torch

from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, Forward, train_local
from fedsim.config import RunConfig
from fedsim.data.batches import BatchStream
from fedsim.models import FedsimModel
from fedsim.norms import seed_norm_noise
from fedsim.registry import PluginParams
from fedsim.strategies.hooks import ClientHooks, FineTune, RoundInfo

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

    def fine_tune(self, stream: BatchStream, info: RoundInfo, seed: int) -> FineTune:
        """The generic fine-tuning of a model on ``stream`` (``info``: the client and round, with the steps);
        ``seed`` seeds its normalisers' noise. Zero steps leave the model as it is."""

        def run(model: FedsimModel) -> None:
            if not info.local_steps:
                return
            seed_norm_noise(model, seed)
            tuned = (model.classifier if self.classifier_only else model).parameters()
            optimizer = LocalSgd(tuned, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
            forward = classifier_forward(model) if self.classifier_only else None
            train_local([ClientRound(model, self.hooks, stream, info)], optimizer, forward)

        return run
