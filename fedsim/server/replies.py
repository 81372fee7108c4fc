"""Checks on a round's replies, as pure functions: who is missing and why, and whether training diverged.

The round loop applies them before a strategy sees the replies: the strategy gets only good
replies, sorted by partition id, so float sums run in the same order under every engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Message

from fedsim import wire
from fedsim.arrays import array_view


def missing_replies(
    replies: list[Message], expected: Iterable[int], partition_of_node: Mapping[int, int], timeout_s: float
) -> dict[int, str]:
    """Each expected partition without a good reply, with why: its error, else the errors not from a
    client node (Flower's SuperLink answers itself for a node it lost, NODE_UNAVAILABLE, from its own
    id), else the timeout."""
    answered: set[int] = set()
    errors: dict[int, str] = {}
    unattributed: list[str] = []
    for m in replies:
        if not m.has_error():
            answered.add(wire.partition_of(m))
        elif (pid := partition_of_node.get(m.metadata.src_node_id)) is None:
            unattributed.append(m.error.reason)
        else:
            errors[pid] = m.error.reason
    silent = "; ".join(unattributed) or f"no reply within train.round_timeout_s = {timeout_s:g} s"
    return {p: errors.get(p, silent) for p in expected if p not in answered}


def describe_failures(reasons: dict[int, str]) -> str:
    """Partition -> why it failed, as one line: clients with the same reason (one worker's, one SuperLink's)
    named together."""
    clients: dict[str, list[int]] = {}
    for pid, reason in sorted(reasons.items()):
        clients.setdefault(reason, []).append(pid)
    return "; ".join(
        f"client {pids[0]}: {reason}" if len(pids) == 1 else f"clients {', '.join(map(str, pids))}: {reason}"
        for reason, pids in clients.items()
    )


def good_replies(replies: list[Message]) -> list[Message]:
    """The replies without an error, sorted by partition id."""
    return sorted((m for m in replies if not m.has_error()), key=wire.partition_of)


def non_finite(record: ArrayRecord) -> list[str]:
    """Names of the arrays holding a NaN or an inf."""
    return [k for k, a in record.items() if not np.isfinite(array_view(a)).all()]


def divergence(replies: list[Message], aggregate: ArrayRecord | None, max_loss: float | None) -> list[str]:
    """Why a round diverged: clients with a NaN / inf training loss (or one above ``max_loss``), else with
    non-finite weights when the aggregate is not finite; empty when it did not. Only the aggregate's weights
    are scanned every round (one pass over the model); the replies' only when it is not finite."""
    problems = []
    for m in replies:
        loss = float(wire.reply_metric(m, wire.TRAIN_LOSS))
        if not np.isfinite(loss):
            problems.append(f"client {wire.partition_of(m)}: training loss is {loss}")
        elif max_loss is not None and loss > max_loss:
            pid = wire.partition_of(m)
            problems.append(f"client {pid}: training loss {loss:.4g} is above train.max_loss = {max_loss:g}")
    if not problems and aggregate is not None and (bad := non_finite(aggregate)):
        for m in replies:
            if names := non_finite(m.content.array_records.get(wire.ARRAYS, ArrayRecord())):
                problems.append(f"client {wire.partition_of(m)}: non-finite weights in {', '.join(names[:3])}")
        problems = problems or [f"the aggregated model has non-finite weights in {', '.join(bad[:3])}"]
    return problems


def evaluation_divergence(client_losses: dict[int, float], global_loss: float | None, arrays: ArrayRecord) -> str:
    """Why the global model's evaluation shows it diverged (its loss on some client's test split, or on the
    whole test set, is NaN / inf: finite weights too large for a forward pass); empty when it did not."""
    bad = [str(pid) for pid, loss in sorted(client_losses.items()) if not np.isfinite(loss)]
    where = [f"clients {', '.join(bad[:5])}" + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")] if bad else []
    if global_loss is not None and not np.isfinite(global_loss):
        where.append("the whole test set")
    if not where:
        return ""
    shown = " and on ".join(where)
    largest = max((float(np.abs(array_view(a)).max(initial=0.0)) for a in arrays.values()), default=0.0)
    return (
        f"the global model's evaluation loss is not finite on {shown} (its largest weight is {largest:.3g}); "
        "lower train.lr or train.weight_decay"
    )
