"""What the server kept of each client's training replies, told to the client on every message to it.

A node holds back the state changes of a training round until it knows whether the server aggregated that
round's reply (:mod:`fedsim.client.pending`): each message to it carries the last round whose reply from it the
server aggregated (``wire.DELIVERY``). The record starts empty on a resume: the checkpoint's client states were
settled when it was written, so no node holds a change of an earlier round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from flwr.app import ConfigRecord, Message, RecordDict

from fedsim import wire


class Deliveries:
    """Partition -> the last round whose training reply from it the server aggregated; and the partitions sent
    anything by this process (``touched``: the only ones whose state can have changed since it began)."""

    def __init__(self, partition_of_node: Mapping[int, int]) -> None:
        self.partition_of_node = partition_of_node
        self.accepted: dict[int, int] = {}
        self.touched: set[int] = set()

    def accept(self, server_round: int, replies: Iterable[Message]) -> None:
        """``replies`` of round ``server_round`` were aggregated."""
        for m in replies:
            self.accepted[wire.partition_of(m)] = server_round

    def stamp(self, messages: Iterable[Message]) -> list[Message]:
        """``messages``, each with its node's accepted round (a content of its own: Flower's strategies send
        one RecordDict to every node)."""
        stamped = []
        for m in messages:
            pid = self.partition_of_node[m.metadata.dst_node_id]
            self.touched.add(pid)
            record = ConfigRecord({wire.ACCEPTED_ROUND: self.accepted.get(pid, 0)})
            m.content = RecordDict({**dict(m.content.items()), wire.DELIVERY: record})
            stamped.append(m)
        return stamped
