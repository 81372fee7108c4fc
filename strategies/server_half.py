"""What fedsim's round loop gives a server strategy, and what it asks of one.

A server strategy is any Flower ``Strategy`` (Message API). fedsim's loop decides which clients
train in a round and when to evaluate; the strategy decides what each node is sent and how replies
become the next global model. So the loop asks a strategy to configure every node it is offered
(Flower's ``fraction_train`` / ``fraction_evaluate`` of 1.0, its default) and keeps the messages of
the clients it sampled. fedsim builds its own strategies with minimums of one node
(:data:`EVERY_NODE`), so a federation of one client runs too.

Strategies whose state crosses rounds (SCAFFOLD's c, Yogi's m and v, FedAvgM's momentum) implement
:class:`Checkpointable`, so a checkpoint restores them; a strategy without it is checkpointed as
stateless.
A strategy whose iterates are not the model to score (an average of its last iterates, say) implements
:class:`ScoredModel`; one that scores its model calibrated on the clients' feature statistics,
:class:`FeatureCalibrated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import Strategy

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.errors import ConfigError

# Flower's FedAvg family waits for at least two nodes by default; fedsim samples clients itself.
EVERY_NODE = {"min_train_nodes": 1, "min_evaluate_nodes": 1, "min_available_nodes": 1}


@dataclass(frozen=True)
class ServerSetup:
    """What a strategy's server half may need to know about the run, given when it is built."""

    num_clients: int  # N: every client of the federation (SCAFFOLD's |S|/N)
    # Names of the model's trainable parameters (``named_parameters()``); the rest of the state
    # dict are buffers, which SCAFFOLD and FedYogi average plainly.
    parameter_keys: frozenset[str]
    seed: int = 0  # the run's seed (CCVR draws its virtual features from it)


@runtime_checkable
class Checkpointable(Protocol):
    """A strategy whose state crosses rounds: ``server_state()`` goes into every checkpoint."""

    def server_state(self) -> ArrayRecord:
        """The strategy's own state after the last aggregation."""

    def load_server_state(self, state: ArrayRecord) -> None:
        """Restore what :meth:`server_state` returned."""


@runtime_checkable
class ScoredModel(Protocol):
    """A strategy whose evaluated model is not the one it trains on. fedsim's round loop scores
    ``scored_arrays(x)`` (the clients' evaluation, the global evaluation, the diagnostics, ``model.pt``), where x
    is the global model after the round's aggregation; the next round and every checkpoint go on from x."""

    def scored_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model to score, given the global model ``arrays`` that the last ``aggregate_train`` returned."""


@runtime_checkable
class FeatureCalibrated(Protocol):
    """A strategy that scores its model calibrated on the clients' feature statistics (CCVR). At each evaluation
    fedsim's round loop asks every client for the per-class statistics of its training features under the model
    to score (``query.feature_stats``, :mod:`fedsim.wire`) and scores ``calibrated_arrays(round, x, stats)``; the
    next round and every checkpoint go on from the global model x."""

    def calibrated_arrays(self, server_round: int, arrays: ArrayRecord, stats: list[ArrayRecord]) -> ArrayRecord:
        """The model to score: ``arrays`` calibrated on ``stats``, the clients' ``feature-stats`` records."""


def state_record(slots: dict[str, dict[str, np.ndarray] | None]) -> ArrayRecord:
    """Named groups of arrays as one ArrayRecord with ``"<slot>/<name>"`` keys."""
    tensors = {  # np.ascontiguousarray makes a 0-d array 1-d (a scalar buffer's moment): its shape is kept
        f"{slot}{wire.STATE_SEP}{name}": torch.from_numpy(np.ascontiguousarray(v).reshape(np.shape(v)))
        for slot, arrays in slots.items()
        for name, v in (arrays or {}).items()
    }
    return to_array_record(tensors)


def state_slots(record: ArrayRecord) -> dict[str, dict[str, np.ndarray]]:
    """The inverse of :func:`state_record` (writable copies)."""
    slots: dict[str, dict[str, np.ndarray]] = {}
    for key, array in record.items():
        slot, _, name = key.partition(wire.STATE_SEP)
        slots.setdefault(slot, {})[name] = array_view(array).copy()
    return slots


def check_strategy(strategy: Strategy, num_clients: int) -> None:
    """Refuse, before round 1, a Flower strategy that would not configure every node it is offered."""
    name = type(strategy).__name__
    for attr in ("fraction_train", "fraction_evaluate"):
        fraction = getattr(strategy, attr, 1.0)
        if fraction != 1.0:
            raise ConfigError(
                f"strategy: {name} has {attr}={fraction:g}; fedsim samples the clients itself "
                f"(train.clients_per_round), so a Flower strategy must configure every node: set {attr}: 1.0"
            )
    for attr in ("min_available_nodes", "min_train_nodes", "min_evaluate_nodes"):
        least = getattr(strategy, attr, 0)
        if least > num_clients:
            raise ConfigError(
                f"strategy: {name} waits for {attr}={least} nodes but the federation has "
                f"train.num_clients = {num_clients}: set strategy.{attr}: {num_clients} (or fewer)"
            )
