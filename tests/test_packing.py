"""A Message's ArrayRecords packed for the way between processes (fedsim.deploy.packing): what arrives is what was
sent, byte for byte, in a fraction of the objects; fedsim's ServerApp packs only under a SuperLink, and its
ClientApp answers a packed Message with a packed reply and any other as it is."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.task_identity import TaskIdentity

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.deploy.packing import PackedGrid, is_packed, pack, packed_transport, unpack
from fedsim.errors import ProtocolError
from fedsim.server.polling import PromptGrid
from fedsim.strategies.scaffold import SCAFFOLD_C

STATE = {  # every dtype and shape a model or a strategy's state sends, an empty and a 0-d tensor included
    "conv.weight": torch.randn(8, 3, 5, 5),
    "norm.weight": torch.ones(8, dtype=torch.float64),
    "steps": torch.tensor(7, dtype=torch.int64),
    "mask": torch.tensor([True, False]),
    "half": torch.randn(4).half(),
    "empty": torch.zeros(0, 3),
    "fc.weight": torch.randn(10, 16),
}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("_run_id", "_node_id", "_task_id"):  # as a Grid sets them in the sender's process
        monkeypatch.setattr(TaskIdentity, name, 1)


def content() -> RecordDict:
    return RecordDict({
        wire.ARRAYS: to_array_record(STATE),
        SCAFFOLD_C: to_array_record({k: v * 2 for k, v in STATE.items()}),
        "one": to_array_record({"only": torch.ones(3)}),
        wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 3, wire.RUN_CONFIG: "{}"}),
        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 32}),
    })  # fmt: skip


def assert_same(got: RecordDict, sent: RecordDict) -> None:
    assert list(got.keys()) == list(sent.keys())
    for name, record in sent.items():
        if isinstance(record, ArrayRecord):
            assert list(got[name].keys()) == list(record.keys())
            for key, a in record.items():
                b = got[name][key]
                assert (b.dtype, tuple(b.shape), b.stype, b.data) == (a.dtype, tuple(a.shape), a.stype, a.data), key
        else:
            assert dict(got[name]) == dict(record)


def test_packing_keeps_every_byte_and_moves_few_objects() -> None:
    sent = content()
    packed = pack(sent)
    assert is_packed(packed) and not is_packed(sent)
    assert len(packed[wire.ARRAYS]) == len(packed[SCAFFOLD_C]) == 1
    assert packed["one"] is sent["one"] and packed[wire.CONFIG] is sent[wire.CONFIG]  # nothing to gain there
    # an object per record and two per tensor (its Array and its chunk; equal ones are one): 38 at most before;
    # after, the RecordDict, three ArrayRecords of one Array and chunk each, two records and the layout
    assert len(get_all_nested_objects(sent)) > 30
    assert len(get_all_nested_objects(packed)) == 1 + 3 * (1 + 2) + 2 + 1
    unpacked = unpack(packed)
    assert_same(unpacked, sent)
    assert torch.equal(unpacked[wire.ARRAYS].to_torch_state_dict()["conv.weight"], STATE["conv.weight"])


def test_a_packed_record_that_does_not_match_its_layout_is_a_protocol_error() -> None:
    packed = pack(content())
    other = pack(RecordDict({wire.ARRAYS: to_array_record({"a": torch.ones(2), "b": torch.ones(3)})}))
    packed[wire.ARRAYS] = other[wire.ARRAYS]  # another record's bytes under this layout
    with pytest.raises(ProtocolError, match=f"{wire.ARRAYS!r} does not match its layout"):
        unpack(packed)


class Recorder(Grid):
    """A grid that records what is pushed and answers each Message at the first pull as fedsim's ClientApp
    does, packed if it came packed (the Messages are never stored, so their ids, like their replies'
    ``reply_to``, are all ``""``)."""

    def __init__(self) -> None:
        self.pushed: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.pushed += messages
        return [m.metadata.message_id for m in self.pushed]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [Message(pack(content()) if is_packed(m.content) else content(), reply_to=m) for m in self.pushed]

    set_run = run = create_message = get_node_ids = send_and_receive = None  # type: ignore[assignment]


@pytest.mark.parametrize("packed", [True, False])
def test_the_serverapp_packs_what_it_sends_and_unpacks_what_it_gets_only_under_a_superlink(packed: bool) -> None:
    grid = Recorder()
    messages = [Message(content(), dst_node_id=n, message_type=wire.TRAIN) for n in (1, 2)]
    replies = list((PackedGrid(grid) if packed else PromptGrid(grid)).send_and_receive(messages, timeout=5))
    assert [is_packed(m.content) for m in grid.pushed] == [packed, packed]
    assert len(replies) == 2
    for reply in replies:
        assert_same(reply.content, content())  # the round loop and the strategy see records as they were


def test_the_clientapp_answers_a_packed_message_packed_and_any_other_as_it_is() -> None:
    seen: list[RecordDict] = []

    def handler(msg: Message, context: Context) -> Message:
        seen.append(msg.content)
        return Message(content(), reply_to=msg)

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    reply = packed_transport(Message(pack(content()), dst_node_id=1, message_type=wire.TRAIN), ctx, handler)
    assert not is_packed(seen[-1]) and is_packed(reply.content)
    assert_same(seen[-1], content())
    assert_same(unpack(reply.content), content())
    reply = packed_transport(Message(content(), dst_node_id=1, message_type=wire.TRAIN), ctx, handler)
    assert not is_packed(seen[-1]) and not is_packed(reply.content)  # fedsim run: nothing packed either way
