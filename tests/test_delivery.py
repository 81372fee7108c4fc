"""What the server kept of each client's training replies, stamped on every message to it
(fedsim/server/delivery.py). How a node uses it to keep or drop its held-back state: tests/test_client_pending.py."""

from __future__ import annotations

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.engines.local import identify_as_server
from fedsim.server.delivery import Deliveries

NODE_OF = {100 + p: p for p in range(3)}  # node id -> partition


def to_every_node(content: RecordDict) -> list[Message]:
    """One message per node sharing one content, as Flower's strategies send them."""
    identify_as_server(1)
    return [Message(content, dst_node_id=node, message_type="train") for node in NODE_OF]


def reply(pid: int) -> Message:
    (sent,) = [m for m in to_every_node(RecordDict()) if NODE_OF[m.metadata.dst_node_id] == pid]
    return Message(RecordDict({wire.METRICS: MetricRecord({wire.PARTITION_ID: pid})}), reply_to=sent)


def accepted_rounds(messages: list[Message]) -> dict[int, int]:
    return {
        NODE_OF[m.metadata.dst_node_id]: int(m.content.config_records[wire.DELIVERY][wire.ACCEPTED_ROUND])
        for m in messages
    }


def test_each_message_carries_the_last_round_its_node_had_a_reply_aggregated() -> None:
    deliveries = Deliveries(NODE_OF)
    assert accepted_rounds(deliveries.stamp(to_every_node(RecordDict()))) == {0: 0, 1: 0, 2: 0}  # none yet
    deliveries.accept(1, [reply(0), reply(2)])
    deliveries.accept(2, [reply(2)])
    assert accepted_rounds(deliveries.stamp(to_every_node(RecordDict()))) == {0: 1, 1: 0, 2: 2}


def test_a_shared_content_is_stamped_per_node_and_left_as_it_was() -> None:
    shared = RecordDict({"config": ConfigRecord({"lr": 0.1})})
    deliveries = Deliveries(NODE_OF)
    deliveries.accept(3, [reply(1)])
    stamped = deliveries.stamp(to_every_node(shared))
    assert accepted_rounds(stamped) == {0: 0, 1: 3, 2: 0}  # not the last node's stamp on all of them
    assert all(m.content.config_records["config"]["lr"] == 0.1 for m in stamped)
    assert wire.DELIVERY not in shared


def test_touched_lists_the_partitions_sent_anything() -> None:
    deliveries = Deliveries(NODE_OF)
    assert deliveries.touched == set()
    deliveries.stamp([m for m in to_every_node(RecordDict()) if m.metadata.dst_node_id != 101])
    assert deliveries.touched == {0, 2}
