"""fedsim's Flower ClientApp: one handler per message type of fedsim's protocol (docs/protocol.md).

The work happens in the process's :class:`~fedsim.client.runtime.ClientRuntime`, built on the first
message of a run from the run config that message carries. Every handler runs as plugin code
(:func:`plugin_guarded`): a plugin's ``sys.exit`` or ``os._exit`` there is an exception naming the
plugin, which every engine turns into an error reply, as it does any exception of a handler.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.client.runtime import runtime_for
from fedsim.client.state import state_query
from fedsim.plugin_guard import plugin_code


def plugin_guarded(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """A ClientApp mod: the handler runs as plugin code (:func:`fedsim.plugin_guard.plugin_code`)."""
    with plugin_code():
        return call_next(msg, context)


app = ClientApp(mods=[plugin_guarded])


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


@app.query("feature_stats")
def feature_stats(msg: Message, context: Context) -> Message:
    """The per-class statistics of this client's training features under the model sent (CCVR)."""
    return runtime_for(msg).feature_stats(msg, context)


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
