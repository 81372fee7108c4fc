"""Flower's weighted average of ArrayRecords, reading the replies' arrays in place.

Flower's ``FedAvg`` (and every strategy built on it: FedProx, FedAvgM, FedAdam, FedAdagrad)
averages the replies with ``aggregate_arrayrecords``, which decodes every Array with ``np.load``
(the ``.npy`` header parsed by ``ast``, the data copied twice) and allocates a temporary per reply
and array: about 2 ms per reply of the 3.2 MB paper CNN here, most of a zero-step round
(benchmarks/round_overhead.py). :func:`aggregate_arrayrecords` is the same function: the same float
operations in the same order, on zero-copy views of the ``.npy`` bytes, summed block by block, so
its result is byte-identical to Flower's (tests/test_aggregation.py) and no strategy's numbers change.

:class:`FastAveraging` is Flower's ``FedAvg`` averaging with it. fedsim's strategies derive from it,
or put it after a Flower strategy in their bases (``class X(flwr FedAvgM, FastAveraging)``), so the
Flower strategy's ``super().aggregate_train`` reaches it: Python's method order, no patching.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import validate_message_reply_consistency

from fedsim.arrays import array_view, ndarray_to_array

BLOCK = 1 << 16  # elements summed over every reply at a time: the running sum stays in cache


def aggregate_arrayrecords(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """The ``weighting_metric_name``-weighted mean of every array in ``records`` (Flower's semantics)."""
    # Flower's arithmetic exactly: weights as sent (an int sum stays an int), factor w / total, then
    # per key the first weighted array and ``+=`` of each next one, in record order; element-wise,
    # so summing block by block changes no bit
    weights = [next(iter(r.metric_records.values()))[weighting_metric_name] for r in records]
    total = sum(weights)
    terms: dict[str, list[tuple[np.ndarray, float]]] = {}
    for record, weight in zip(records, weights, strict=True):
        factor = weight / total
        for arrays in record.array_records.values():
            for key, array in arrays.items():
                terms.setdefault(key, []).append((array_view(array), factor))
    sums = {key: np.asarray(weighted_sum(key_terms)) for key, key_terms in terms.items()}
    return ArrayRecord({key: ndarray_to_array(value) for key, value in sums.items()})


def weighted_sum(terms: list[tuple[np.ndarray, float]]) -> np.ndarray | np.generic:
    """``a0 * f0``, then ``+= ai * fi`` in order, as Flower computes it."""
    (first_view, first_factor), rest = terms[0], terms[1:]
    first = first_view * first_factor
    blockwise = first.ndim > 0 and first.flags.c_contiguous and all(
        v.shape == first_view.shape and v.dtype == first_view.dtype and v.flags.c_contiguous for v, _ in rest
    )
    if not blockwise:  # a 0-d array, Fortran order, or replies that differ: Flower's loop as it is
        for view, factor in rest:
            first += view * factor
        return first
    out = first.reshape(-1)  # a view: first is C-contiguous
    flat = [(view.reshape(-1), factor) for view, factor in rest]
    scratch = np.empty(min(BLOCK, out.size), dtype=out.dtype)
    for start in range(0, out.size, BLOCK):
        block = out[start : start + BLOCK]
        part = scratch[: block.size]
        for view, factor in flat:
            np.multiply(view[start : start + BLOCK], factor, out=part)
            block += part
    return first


class FastAveraging(FedAvg):
    """Flower's ``FedAvg`` whose ``aggregate_train`` averages with :func:`aggregate_arrayrecords`; it keeps
    the round's global model as ``x`` (the papers' symbol) for the server steps built on the average."""

    x: ArrayRecord | None = None  # the global model the round's clients start from

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.x = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        # Flower's FedAvg.aggregate_train, step for step, with fedsim's average
        contents = [m.content for m in replies if not m.has_error()]
        if not contents:
            return None, None
        validate_message_reply_consistency(contents, self.weighted_by_key, check_arrayrecord=True)
        arrays = aggregate_arrayrecords(contents, self.weighted_by_key)
        return arrays, self.train_metrics_aggr_fn(contents, self.weighted_by_key)


class PartialAveraging(FastAveraging):
    """FedAvg over the tensors the clients send; the global model keeps its own value of every tensor they do
    not send (FedBN's normalisation tensors, FedBABU's head), bit for bit."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or self.x is None:
            return arrays, metrics
        return ArrayRecord({k: arrays[k] if k in arrays else a for k, a in self.x.items()}), metrics
