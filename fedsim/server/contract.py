"""A server strategy as the round loop calls it: every hook's result checked where it crosses into fedsim.

A strategy may be a user's plugin, so fedsim trusts none of what it returns: an aggregate that
leaves out tensors would be saved as a model of one key, one that is ``None`` would leave every
round's model as it was, and both would exit 0. So each hook's result is checked (messages are
Messages; the aggregate is a whole model: every tensor of the global model, by the same names, of
the same shapes, numbers of the same kind), and a hook that raises or breaks its contract stops the run with one
line naming the plugin, the hook and what is wrong. ``FEDSIM_DEBUG`` set lets a hook's exception
through with its traceback. A hook that calls ``sys.exit`` or ``os._exit`` stops the run the same way
(:mod:`fedsim.plugin_guard`), and one that does not return within ``train.round_timeout_s`` too: each call
runs in a thread of its own that the round loop waits for only that long (:mod:`fedsim.deadline`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedsim.deadline import call_within
from fedsim.errors import DEBUG_ENV, ConfigError, FedsimError, TrainingError
from fedsim.plugin_guard import plugin_code
from fedsim.strategies.server_half import Checkpointable, FeatureCalibrated, ScoredModel

T = TypeVar("T")
Shapes = dict[str, tuple[tuple[int, ...], np.dtype]]  # tensor name -> (shape, dtype)
# The dtype kinds a tensor of the model's kind may come back as: Flower's FedAdam, FedAdagrad and FedYogi
# step float32 weights in float64 (fedsim's numbers are what they compute), and Flower's FedAvg averages an
# integer counter (BatchNorm's num_batches_tracked) into a float; an integer weight is always wrong
KINDS = {"f": "f", "b": "biuf", "i": "biuf", "u": "biuf"}


def shapes_of(arrays: ArrayRecord) -> Shapes:
    return {key: (tuple(a.shape), np.dtype(a.dtype)) for key, a in arrays.items()}


def _names(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def _dtype(name: object) -> np.dtype | None:
    try:
        return np.dtype(name)  # type: ignore[call-overload]
    except TypeError:
        return None


def model_mismatch(model: Shapes, arrays: object) -> str:
    """Why ``arrays`` is not a whole model of the tensors in ``model``; empty when it is.

    A tensor must come back under its name, with its shape, as a number of its kind (:data:`KINDS`)."""
    if not isinstance(arrays, ArrayRecord):
        return f"returned {'None' if arrays is None else f'a {type(arrays).__name__}'} as the model"
    if missing := [key for key in model if key not in arrays]:
        return f"returned {len(model) - len(missing)} of the model's {len(model)} tensors (missing {_names(missing)})"
    if extra := [key for key in arrays if key not in model]:
        return f"returned tensors the model does not have ({_names(extra)})"
    for key, (shape, dtype) in model.items():
        got_shape, got = tuple(arrays[key].shape), _dtype(arrays[key].dtype)
        if got_shape != shape:
            return f"returned {key} of shape {got_shape}; the model's is {shape}"
        if got is None or got.kind not in KINDS.get(dtype.kind, dtype.kind):
            return f"returned {key} as {arrays[key].dtype}; the model's is {dtype}"
    return ""


class CheckedStrategy:
    """``strategy`` (the plugin named ``plugin`` in the config) with every hook the loop calls checked;
    ``model``: the global model whose tensors every aggregate must have; ``timeout_s``: how long a hook may
    take (``train.round_timeout_s``)."""

    def __init__(self, strategy: Strategy, plugin: str, model: ArrayRecord, timeout_s: float) -> None:
        self.strategy, self.plugin = strategy, plugin
        self.model = shapes_of(model)
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return type(self.strategy).__name__

    def configure(
        self, hook: str, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """``configure_train`` or ``configure_evaluate``: the messages, read whole (a generator raises late)."""
        messages = self._call(hook, lambda: list(getattr(self.strategy, hook)(server_round, arrays, config, grid)))
        if strays := sorted({type(m).__name__ for m in messages if not isinstance(m, Message)}):
            raise self._broke(hook, f"returned {', '.join(strays)} where it must return Messages")
        return messages

    def aggregate_train(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord | None]:
        """The new global model, checked to be a whole model, and the training metrics."""
        result: Any = self._call("aggregate_train", lambda: self.strategy.aggregate_train(server_round, replies))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise self._broke("aggregate_train", f"returned a {type(result).__name__}, not (arrays, metrics)")
        arrays, metrics = result
        if problem := model_mismatch(self.model, arrays):
            raise self._broke("aggregate_train", f"{problem}; it must return every tensor of the model")
        if metrics is not None and not isinstance(metrics, MetricRecord):
            raise self._broke("aggregate_train", f"returned a {type(metrics).__name__} as metrics, not a MetricRecord")
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> None:
        self._call("aggregate_evaluate", lambda: self.strategy.aggregate_evaluate(server_round, replies))

    def scored_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model evaluation scores: a :class:`ScoredModel`'s, checked to be a whole model; else ``arrays``."""
        if not isinstance(self.strategy, ScoredModel):
            return arrays
        strategy = self.strategy
        scored = self._call("scored_arrays", lambda: strategy.scored_arrays(arrays))
        if problem := model_mismatch(self.model, scored):
            raise self._broke("scored_arrays", f"{problem}; it must return every tensor of the model")
        return scored

    @property
    def calibrates(self) -> bool:
        """Whether the strategy scores its model calibrated on the clients' feature statistics."""
        return isinstance(self.strategy, FeatureCalibrated)

    def calibrated_arrays(self, server_round: int, arrays: ArrayRecord, stats: list[ArrayRecord]) -> ArrayRecord:
        """A :class:`FeatureCalibrated` strategy's model to score, checked to be a whole model."""
        strategy = self.strategy
        assert isinstance(strategy, FeatureCalibrated)
        scored = self._call("calibrated_arrays", lambda: strategy.calibrated_arrays(server_round, arrays, stats))
        if problem := model_mismatch(self.model, scored):
            raise self._broke("calibrated_arrays", f"{problem}; it must return every tensor of the model")
        return scored

    def server_state(self) -> ArrayRecord:
        """The strategy's state for a checkpoint (empty for a strategy without any)."""
        if not isinstance(self.strategy, Checkpointable):
            return ArrayRecord()
        state = self._call("server_state", self.strategy.server_state)
        if not isinstance(state, ArrayRecord):
            raise self._broke("server_state", f"returned a {type(state).__name__}, not an ArrayRecord")
        return state

    def load_server_state(self, state: ArrayRecord) -> None:
        if isinstance(self.strategy, Checkpointable):
            strategy = self.strategy
            self._call("load_server_state", lambda: strategy.load_server_state(state))

    def _call(self, hook: str, call: Callable[[], T]) -> T:
        who = f"strategy {self.plugin!r}: {self.name}.{hook}"

        def guarded() -> T:
            with plugin_code(who):
                return call()

        def overran() -> TrainingError:
            return TrainingError(
                f"{who} did not return within train.round_timeout_s = {self.timeout_s:g} s (raise it if the hook "
                "needs longer)"
            )

        try:
            return call_within(guarded, self.timeout_s, overran)
        except FedsimError:
            raise
        except Exception as err:
            if os.environ.get(DEBUG_ENV):
                raise
            first = (str(err).strip().splitlines() or [""])[0]
            raise self._broke(hook, f"raised {type(err).__name__}: {first} ({DEBUG_ENV}=1 shows where)") from err

    def _broke(self, hook: str, what: str) -> ConfigError:
        return ConfigError(f"strategy {self.plugin!r}: {self.name}.{hook} {what}")
