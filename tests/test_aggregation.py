"""fedsim's weighted average of the replies' arrays (fedsim/strategies/aggregation.py): byte for byte Flower's, on
every reply a plugin could send, and the average every built-in server half uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, fedavg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords as flower_aggregate
from flwr.supercore.task_identity import TaskIdentity

from fedsim.arrays import array_view, ndarray_to_array
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.strategies import STRATEGIES, aggregation
from fedsim.strategies.aggregation import BLOCK, FastAveraging, aggregate_arrayrecords
from fedsim.strategies.server_half import ServerSetup
from tests.conftest import small_config
from tests.test_arrays import ARRAYS


def replies(weights: list[int | float], seed: int) -> list[RecordDict]:
    rng = np.random.default_rng(seed)
    out = []
    for w in weights:
        arrays = {
            k: (rng.standard_normal(a.shape) * 3).astype(a.dtype) if a.dtype.kind == "f" else a + rng.integers(9)
            for k, a in ARRAYS.items()
        }
        out.append(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: ndarray_to_array(a) for k, a in arrays.items()}),
                    "metrics": MetricRecord({"num-examples": w}),
                }
            )
        )
    return out


@pytest.mark.parametrize("weights", [[320, 320, 320], [5000, 17, 9999, 1, 250], [0.3, 1.7], [7]])
def test_aggregation_is_byte_identical_to_flowers(weights: list[int | float]) -> None:
    assert ARRAYS["large"].size > 3 * BLOCK > ARRAYS["fc"].size  # summed in blocks, and in one
    records = replies(weights, seed=len(weights))
    ours, theirs = aggregate_arrayrecords(records, "num-examples"), flower_aggregate(records, "num-examples")
    assert list(ours) == list(theirs)
    for key in theirs:
        assert ours[key].data == theirs[key].data, key
        assert (ours[key].dtype, ours[key].shape) == (theirs[key].dtype, theirs[key].shape)
    # and it is a weighted mean, not merely Flower's bytes (the float32 arrays, to float32 precision)
    total = sum(weights)
    fc = [array_view(r["arrays"]["fc"]).astype(np.float64) for r in records]
    expected = sum(a * (w / total) for a, w in zip(fc, weights, strict=True))
    np.testing.assert_allclose(array_view(ours["fc"]), expected, rtol=1e-5, atol=1e-6)


def reply_messages(records: list[RecordDict]) -> list[Message]:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as a Grid sets them
    messages = []
    for i, content in enumerate(records):
        request = Message(RecordDict(), dst_node_id=i + 1, message_type="train")
        messages.append(Message(content, reply_to=request))
    return messages


def test_fast_averaging_is_flowers_fedavg_with_fedsims_aggregation(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = reply_messages(replies([100, 300], seed=7))
    flower_arrays, flower_metrics = FedAvg().aggregate_train(1, messages)
    calls = []
    fast = aggregation.aggregate_arrayrecords
    monkeypatch.setattr(aggregation, "aggregate_arrayrecords", lambda *a: calls.append(1) or fast(*a))
    ours, metrics = FastAveraging().aggregate_train(1, messages)
    assert calls == [1]
    assert {k: a.data for k, a in ours.items()} == {k: a.data for k, a in flower_arrays.items()}
    assert dict(metrics) == dict(flower_metrics)


@pytest.mark.parametrize("name", sorted(e.name for e in STRATEGIES))
def test_every_builtin_server_half_averages_with_fedsims_aggregation(name: str) -> None:
    # FastAveraging derives from Flower's FedAvg, so in any class that has it, it comes before FedAvg:
    # a Flower strategy's super().aggregate_train (FedAvgM, FedAdam, ...) reaches it, not Flower's
    strategy = STRATEGIES.get(name)(STRATEGIES.get(name).Params()).server(ServerSetup(4, frozenset({"fc"})))
    assert isinstance(strategy, FastAveraging)


def test_a_fedsim_run_leaves_flowers_modules_as_they_are(tmp_path: Path) -> None:
    run(parse_config(small_config(tmp_path, train={"rounds": 1})))
    assert fedavg.aggregate_arrayrecords is flower_aggregate


def with_arrays(record: RecordDict, arrays: dict[str, Array], name: str = "arrays") -> RecordDict:
    out = RecordDict({k: v for k, v in record.items() if k != "arrays"})
    out[name] = ArrayRecord(arrays)
    return out


def assert_same_bytes(records: list[RecordDict]) -> None:
    ours, theirs = aggregate_arrayrecords(records, "num-examples"), flower_aggregate(records, "num-examples")
    assert list(ours) == list(theirs)
    assert {k: a.data for k, a in ours.items()} == {k: a.data for k, a in theirs.items()}


def test_aggregation_matches_flower_on_replies_that_differ() -> None:
    """Replies a user's plugin could send: Flower's loop decides, and fedsim's must agree byte for byte."""
    base = replies([100, 300, 50], seed=11)
    fc = [array_view(r["arrays"]["fc"]) for r in base]
    # Fortran-ordered arrays (Flower's own Array of a transposed weight), first or later
    fortran = [with_arrays(r, {"fc": Array(np.asfortranarray(a))}) for r, a in zip(base, fc, strict=True)]
    assert_same_bytes(fortran)
    later = [with_arrays(r, {"fc": ndarray_to_array(a)}) for r, a in zip(base[1:], fc[1:], strict=True)]
    assert_same_bytes([fortran[0], *later])
    # a later reply in float64: Flower adds it into the float32 sum
    mixed = [base[0], with_arrays(base[1], {"fc": ndarray_to_array(fc[1].astype(np.float64))}), base[2]]
    assert_same_bytes(mixed)
    # a key the first reply lacks: its sum starts at the second reply, with the second reply's weight
    extra = ndarray_to_array(ARRAYS["large"] * 2)
    assert_same_bytes([base[0], with_arrays(base[1], {"fc": ndarray_to_array(fc[1]), "only-here": extra}), base[2]])
    # two ArrayRecords in one reply
    two = with_arrays(base[1], {"fc": ndarray_to_array(fc[1])})
    two["more"] = ArrayRecord({"large": ndarray_to_array(ARRAYS["large"])})
    assert_same_bytes([base[0], two, base[2]])
