"""fedsim's Flower ClientApp: one handler per message type of fedsim's protocol (docs/protocol.md).

The work happens in the process's :class:`~fedsim.client.runtime.ClientRuntime`, built on the first
message of a run from the run config that message carries.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.client.runtime import runtime_for
from fedsim.client.state import state_query
from fedsim.packing import packed_transport

app = ClientApp(mods=[packed_transport])


@app.train()
def train(msg: Message, context: Context) -> Message:
    return runtime_for(msg).train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return runtime_for(msg).evaluate(msg, context)


@app.query("partition")
def query_partition(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (node ids are random; partition ids not) and the
    fingerprint of the data it read for the run (the server refuses a node whose data is not its own)."""
    reply = partition_reply(msg, context)
    reply.content[wire.CONFIG] = ConfigRecord({wire.DATA_SHA256: runtime_for(msg).fed.data_sha256})
    return reply


@app.query("save_state")
def save_state(msg: Message, context: Context) -> Message:
    """A checkpoint: write this node's Context.state to its state directory (fedsim.client.state) and say
    which file it wrote, for checkpoint.pt to record."""
    return state_reply(msg, context)


@app.query("load_state")
def load_state(msg: Message, context: Context) -> Message:
    """A resumed run: replace this node's Context.state with its state as of the checkpoint and say which file
    it read, for the server to check against checkpoint.pt's record."""
    return state_reply(msg, context)


def state_reply(msg: Message, context: Context) -> Message:
    reply = partition_reply(msg, context)
    reply.content[wire.CONFIG] = state_query(msg, context)
    return reply


def partition_reply(msg: Message, context: Context) -> Message:
    """A reply carrying only this node's partition id: how the server knows who answered."""
    pid = wire.node_partition(context)
    return Message(RecordDict({wire.METRICS: MetricRecord({wire.PARTITION_ID: pid})}), reply_to=msg)
