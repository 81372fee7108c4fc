"""The checks on a round's replies before a strategy sees them (fedsim/server/replies.py): who is missing and why,
and whether training diverged. The run-level behaviour (skip / fail, the one line) is in tests/test_client_failures.py
and tests/test_meaningful_values.py."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.arrays import ndarray_to_array
from fedsim.engines.local import identify_as_server
from fedsim.server.replies import (
    describe_failures,
    divergence,
    evaluation_divergence,
    good_replies,
    missing_replies,
    non_finite,
)

NODE_OF = {10 + p: p for p in range(4)}  # node id -> partition


def record(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: ndarray_to_array(a) for k, a in arrays.items()})


def sent(node: int) -> Message:
    identify_as_server(1)  # Flower's Message() reads the sending task's identity
    return Message(RecordDict(), dst_node_id=node, message_type="train")


def answer(pid: int, loss: float = 0.5, **arrays: np.ndarray) -> Message:
    metrics = MetricRecord({wire.PARTITION_ID: pid, wire.TRAIN_LOSS: loss, wire.NUM_EXAMPLES: 4})
    content = {wire.METRICS: metrics, wire.ARRAYS: record(**(arrays or {"w": np.zeros(2, np.float32)}))}
    return Message(RecordDict(content), reply_to=sent(10 + pid))


def failed(node: int, reason: str) -> Message:
    return Message(Error(code=0, reason=reason), reply_to=sent(node))


def test_clients_that_failed_alike_are_named_together() -> None:
    # the clients of one lost Ray worker, or of one SuperLink's answer for nodes it lost, fail with one reason
    reasons = {3: "their Ray worker died", 0: "RuntimeError: x", 1: "their Ray worker died"}
    assert describe_failures(reasons) == "client 0: RuntimeError: x; clients 1, 3: their Ray worker died"


def test_a_missing_reply_is_its_own_error_else_the_unattributed_ones_else_the_timeout() -> None:
    replies = [answer(0), failed(11, "ValueError: bad batch")]
    assert missing_replies(replies, range(4), NODE_OF, 30) == {
        1: "ValueError: bad batch",
        2: "no reply within train.round_timeout_s = 30 s",
        3: "no reply within train.round_timeout_s = 30 s",
    }
    # an error from a node that is no client's (the SuperLink answering for nodes it lost) explains the silent ones
    lost = [answer(0), failed(11, "ValueError: bad batch"), failed(1, "NODE_UNAVAILABLE")]
    assert missing_replies(lost, range(4), NODE_OF, 30) == {1: "ValueError: bad batch", 2: "NODE_UNAVAILABLE",
                                                            3: "NODE_UNAVAILABLE"}  # fmt: skip
    assert missing_replies([answer(p) for p in range(4)], range(4), NODE_OF, 30) == {}


def test_good_replies_drop_the_errors_and_sort_by_partition() -> None:
    replies = [answer(2), failed(11, "x"), answer(0), answer(3)]
    assert [wire.partition_of(m) for m in good_replies(replies)] == [0, 2, 3]


def test_divergence_names_the_clients_with_a_non_finite_or_too_large_loss() -> None:
    ok = record(w=np.ones(2, np.float32))
    replies = [answer(0, float("nan")), answer(1, 2e6), answer(2, float("inf")), answer(3, 0.1)]
    assert divergence(replies, ok, max_loss=1e6) == [
        "client 0: training loss is nan",
        "client 1: training loss 2e+06 is above train.max_loss = 1e+06",
        "client 2: training loss is inf",
    ]
    assert divergence(replies[1:2], ok, max_loss=None) == []  # no bound: only NaN / inf count
    assert divergence([answer(3, 0.1)], ok, max_loss=1e6) == []


def test_a_non_finite_aggregate_names_the_clients_whose_weights_are_not_finite() -> None:
    bad = np.array([1.0, np.inf], np.float32)
    aggregate = record(w=bad, b=np.zeros(1, np.float32))
    replies = [answer(0, w=np.zeros(2, np.float32)), answer(1, w=bad)]
    assert non_finite(aggregate) == ["w"]
    assert divergence(replies, aggregate, max_loss=None) == ["client 1: non-finite weights in w"]
    # finite replies, a non-finite aggregate (their sum overflowed in float32): the aggregate is named
    big = np.full(2, 3e38, np.float32)
    assert divergence([answer(0, w=big)], aggregate, max_loss=None) == [
        "the aggregated model has non-finite weights in w"
    ]


def test_evaluation_divergence_names_where_the_loss_is_not_finite_and_the_largest_weight() -> None:
    arrays = record(w=np.array([-4e3, 2.0], np.float32))
    assert evaluation_divergence({0: 1.0, 1: 2.0}, 0.5, arrays) == ""
    assert evaluation_divergence({0: 1.0, 1: float("nan")}, float("inf"), arrays) == (
        "the global model's evaluation loss is not finite on clients 1 and on the whole test set (its largest "
        "weight is 4e+03); lower train.lr or train.weight_decay"
    )
    many = {p: float("inf") for p in range(7)}
    assert "on clients 0, 1, 2, 3, 4 (and 2 more) (" in evaluation_divergence(many, None, ArrayRecord())
