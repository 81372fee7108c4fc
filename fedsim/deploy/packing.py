"""A Message's ArrayRecords packed into one Array each, for Flower's transport between processes.

Flower moves a Message as a tree of objects, one HTTP request per object at every hop (ServerApp to
SuperLink, SuperLink to SuperNode, SuperNode to its ClientApp process, and the reply back the same
way), two requests at a time. An ArrayRecord of n tensors is 2n + 1 objects (each tensor an Array and
its chunk): the quickstart CNN's 13 tensors made a training Message 29 objects, about 15 requests in
turn at every hop. :func:`pack` makes each ArrayRecord one Array holding its tensors' serialised bytes
back to back, their keys, dtypes, shapes and lengths in a ConfigRecord (:data:`wire.PACKED`), so the
Message is 6 objects; :func:`unpack` restores Arrays with the same bytes, so nothing computed changes.

fedsim's ServerApp for Flower's runtimes (:mod:`fedsim.deploy.serverapp`) packs what it sends and unpacks
what it receives only under a SuperLink (:class:`PackedGrid`), and its ClientApp
(:mod:`fedsim.deploy.clientapp`, through the mod :func:`packed_transport`) unpacks a Message that came
packed and packs its reply. ``fedsim run`` never loads this module: its Messages stay in one process,
or travel between Ray's processes as Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedsim import wire
from fedsim.errors import ProtocolError
from fedsim.server.polling import PromptGrid

STYPE = "fedsim.packed"  # the packed Array's serialisation type: its data is the tensors' bytes back to back


def pack(content: RecordDict) -> RecordDict:
    """``content`` with each ArrayRecord of more than one tensor as one Array, and the layout to undo it."""
    packed = RecordDict()
    layout: dict[str, str] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord) and len(record) > 1:
            arrays = list(record.items())
            layout[name] = json.dumps([[key, a.dtype, list(a.shape), a.stype, len(a.data)] for key, a in arrays])
            data = b"".join(a.data for _, a in arrays)
            packed[name] = ArrayRecord({name: Array(dtype="uint8", shape=(len(data),), stype=STYPE, data=data)})
        else:
            packed[name] = record
    if layout:
        packed[wire.PACKED] = ConfigRecord(layout)
    return packed


def is_packed(content: RecordDict) -> bool:
    return wire.PACKED in content.config_records


def unpack(content: RecordDict) -> RecordDict:
    """The RecordDict :func:`pack` was given."""
    layout = content.config_records[wire.PACKED]
    unpacked = RecordDict()
    for name, record in content.items():
        if name == wire.PACKED:
            continue
        if name not in layout:
            unpacked[name] = record
            continue
        data = record[name].data if isinstance(record, ArrayRecord) and name in record else None
        entries = json.loads(str(layout[name]))
        if data is None or sum(entry[4] for entry in entries) != len(data):
            raise ProtocolError(f"the packed ArrayRecord {name!r} does not match its layout in {wire.PACKED!r}")
        arrays: dict[str, Array] = {}
        start = 0
        for key, dtype, shape, stype, size in entries:
            arrays[key] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data[start : start + size])
            start += size
        unpacked[name] = ArrayRecord(arrays)
    return unpacked


def packed_transport(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """A ClientApp mod: a Message that came packed is handled unpacked, and its reply goes back packed."""
    if not (msg.has_content() and is_packed(msg.content)):
        return call_next(msg, context)
    msg.content = unpack(msg.content)
    reply = call_next(msg, context)
    if reply.has_content():
        reply.content = pack(reply.content)
    return reply


class PackedGrid(PromptGrid):
    """A SuperLink's Grid as the round loop uses it: prompt pulls (:class:`PromptGrid`), each Message packed
    for the way and each packed reply unpacked, so the round loop and the strategies see records as they were."""

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        for msg in messages:
            msg.content = pack(msg.content)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for reply in replies:  # a ClientApp packs its reply to a packed Message; an error reply has no content
            if reply.has_content() and is_packed(reply.content):
                reply.content = unpack(reply.content)
        return replies
