"""Flower's weighted average of ArrayRecords, reading the replies' arrays in place.

Flower's ``FedAvg`` (and every strategy built on it: FedProx, FedAvgM, FedAdam, FedAdagrad,
FedYogi, fedsim's SCAFFOLD and FedBN) averages the replies with ``aggregate_arrayrecords``, which
decodes every Array with ``np.load``: the ``.npy`` header parsed by ``ast``, the data copied twice.
That was about 2.5 ms per reply of the 3.2 MB paper CNN here, most of a zero-step round
(benchmarks/round_overhead.py). This is the same function: the same float operations in the same
order, on zero-copy views of the ``.npy`` bytes, so its result is byte-identical to Flower's
(tests/test_aggregation.py) and no strategy's numbers change. :func:`install` puts it where
``FedAvg`` looks it up; fedsim's ServerApp installs it, under every engine.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp.strategy import fedavg

from fedsim.arrays import array_view, ndarray_to_array

BLOCK = 1 << 16  # elements summed over every reply at a time: the running sum stays in cache


def aggregate_arrayrecords(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """The ``weighting_metric_name``-weighted mean of every array in ``records`` (Flower's semantics)."""
    # Flower's arithmetic exactly: weights as sent (an int sum stays an int), factor w / total, the
    # first reply's weighted array, then ``+=`` of each next one's, in reply order; element-wise,
    # so summing block by block changes no bit
    weights = [next(iter(r.metric_records.values()))[weighting_metric_name] for r in records]
    total = sum(weights)
    factors = [w / total for w in weights]
    columns: dict[str, list[np.ndarray]] = {}
    for record in records:
        for arrays in record.array_records.values():
            for key, array in arrays.items():
                columns.setdefault(key, []).append(array_view(array))
    sums = {key: np.asarray(weighted_sum(views, factors)) for key, views in columns.items()}
    return ArrayRecord({key: ndarray_to_array(value) for key, value in sums.items()})


def weighted_sum(views: list[np.ndarray], factors: list[float]) -> np.ndarray | np.generic:
    """``views[0] * factors[0]``, then ``+= views[i] * factors[i]`` in order, as Flower computes it."""
    first = views[0] * factors[0]
    same = all(v.shape == views[0].shape and v.dtype == views[0].dtype for v in views)
    if len(views) != len(factors) or first.ndim == 0 or not same:
        for view, factor in zip(views[1:], factors[1:], strict=False):  # a 0-d array, or replies that differ
            first += view * factor
        return first
    flat = [v.reshape(-1) for v in views]
    out = first.reshape(-1)
    scratch = np.empty(min(BLOCK, out.size), dtype=out.dtype)
    for start in range(0, out.size, BLOCK):
        block = out[start : start + BLOCK]
        part = scratch[: block.size]
        for view, factor in zip(flat[1:], factors[1:], strict=True):
            np.multiply(view[start : start + BLOCK], factor, out=part)
            block += part
    return first


def install() -> None:
    """Make Flower's ``FedAvg``, and so every strategy built on it, aggregate with this function."""
    fedavg.aggregate_arrayrecords = aggregate_arrayrecords
