"""Every built-in strategy whose Messages are not FedAvg's (tests/strategy_rows.py) gives the inline engine's numbers
bit for bit when each Message and the client's Context travel as a deployed run carries them: Flower's protobuf
forms, as a SuperLink stores and forwards a Message and a SuperNode hands its ClientApp process the Message and
the node's Context, and takes back the reply and the Context's state. A record Flower's wire format cannot hold, or
client state kept anywhere but ``Context.state`` (an attribute, a module's global), is lost here as it would be
under ``fedsim deploy``. The deployed processes themselves are tests/test_strategy_engines.py's (marker engines)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.serde import context_from_proto, context_to_proto, message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage

from fedsim import wire
from fedsim.engines import local
from fedsim.engines.runner import run
from tests.test_resume import metrics
from tests.test_strategy_engines import OWN_MESSAGES, inline_metrics, row_config


def sent(message: Message) -> Message:
    """``message`` as the other end of a gRPC stream receives it: serialised, parsed."""
    return message_from_proto(ProtoMessage.FromString(message_to_proto(message).SerializeToString()))


def received_context(context: Context) -> Context:
    """The node's Context as a ClientApp process receives it from its SuperNode."""
    return context_from_proto(ProtoContext.FromString(context_to_proto(context).SerializeToString()))


def over_the_wire(app: ClientApp, message: Message, context: Context) -> Message:
    """:func:`fedsim.engines.local.handle` as in a deployed run: the ClientApp runs on the Message and Context as
    received, and the node keeps the state the ClientApp sends back."""
    own = received_context(context)
    CARRIED.append(message.metadata.message_type)
    reply = HANDLE(app, sent(message), own)
    context.state = received_context(own).state
    return sent(reply)


HANDLE = local.handle
CARRIED: list[str] = []  # the message types over_the_wire carried


@pytest.mark.parametrize("name", OWN_MESSAGES)
def test_every_strategys_messages_and_client_state_survive_flowers_wire_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    inline = inline_metrics(tmp_path, name)
    monkeypatch.setattr(local, "handle", over_the_wire)
    CARRIED.clear()
    assert metrics(Path(run(row_config(tmp_path, name, "wire"))["run_dir"])) == inline
    assert {wire.TRAIN, wire.EVALUATE} <= set(CARRIED)  # every client's work went over it
