"""Every built-in strategy whose Messages are not FedAvg's (tests/strategy_rows.py) gives the inline engine's numbers
bit for bit when each Message and the client's Context travel as ``fedsim deploy`` carries them: packed
(:mod:`fedsim.deploy.packing`) and in Flower's protobuf forms, as its ServerApp packs a Message, a SuperLink stores
and forwards it, and a SuperNode hands a ClientApp process the Message and the node's Context and takes back the
reply and the Context's state; and each Message served by fedsim's deployed ClientApp in what a fork of a SuperNode's
fork server starts with (:mod:`fedsim.deploy.forkserver`): a runtime that has served no Message, the same torch
random state every time. A record Flower's wire format or fedsim's packing cannot hold, client state kept outside
``Context.state`` on the Context or in the runtime (its model, optimiser or a strategy's hooks: a hooks attribute in
place of the state record fails SCAFFOLD's row), or a client that counts on the random state an earlier Message
left, changes a number here as it would under ``fedsim deploy``. Not a module's global: this process keeps it, as a
fork would not; the deployed processes themselves are tests/test_strategy_engines.py's (marker engines) and
tests/test_deploy.py's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.serde import context_from_proto, context_to_proto, message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage

from fedsim import wire
from fedsim.client import runtime
from fedsim.deploy.clientapp import app as deployed_app
from fedsim.deploy.packing import is_packed, pack, unpack
from fedsim.engines import local
from fedsim.engines.runner import run
from fedsim.engines.states import NodeStates
from tests.test_resume import metrics
from tests.test_strategy_engines import OWN_MESSAGES, inline_metrics, row_config

HANDLE, DELIVER = local.handle, local.deliver
CARRIED: list[str] = []  # the types of the Messages over_the_wire carried
DELIVERED: list[str] = []  # and of every Message the server sent


def sent(message: Message) -> Message:
    """``message`` as the other end of a gRPC stream receives it: serialised, parsed."""
    return message_from_proto(ProtoMessage.FromString(message_to_proto(message).SerializeToString()))


def received_context(context: Context) -> Context:
    """The node's Context as a ClientApp process receives it from its SuperNode."""
    return context_from_proto(ProtoContext.FromString(context_to_proto(context).SerializeToString()))


def over_the_wire(app: ClientApp, message: Message, context: Context) -> Message:
    """:func:`fedsim.engines.local.handle` as in a deployed run: the Message packed and sent, served by the
    deployed ClientApp in a fresh fork's runtime on the Context as received, the node keeping the state the
    ClientApp sends back, the reply sent and unpacked."""
    CARRIED.append(message.metadata.message_type)
    outgoing = sent(message)  # a copy: the ServerApp packs the Message it sends
    outgoing.content = pack(outgoing.content)
    own = received_context(context)
    runtime.prepare.cache_clear()  # a fresh fork: nothing of the Messages an earlier process served
    torch.manual_seed(0)  # and the random state every fork starts with
    reply = sent(HANDLE(deployed_app, sent(outgoing), own))
    context.state = received_context(own).state
    if reply.has_content() and is_packed(reply.content):
        reply.content = unpack(reply.content)
    return reply


def deliver_counted(app: ClientApp, messages: Sequence[Message], nodes: NodeStates) -> list[Message]:
    DELIVERED.extend(m.metadata.message_type for m in messages)
    return DELIVER(app, messages, nodes)


@pytest.mark.parametrize("name", OWN_MESSAGES)
def test_every_strategys_messages_and_client_state_survive_flowers_wire_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    inline = inline_metrics(tmp_path, name)
    monkeypatch.setattr(local, "handle", over_the_wire)
    monkeypatch.setattr(local, "deliver", deliver_counted)
    CARRIED.clear()
    DELIVERED.clear()
    with torch.random.fork_rng():  # over_the_wire seeds torch's global generator: restored for the next test
        assert metrics(Path(run(row_config(tmp_path, name, "wire"))["run_dir"])) == inline
    assert CARRIED == DELIVERED and {wire.TRAIN, wire.EVALUATE} <= set(CARRIED)  # every Message went over it
