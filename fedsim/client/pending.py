"""A client's state changes held back until the server has aggregated the reply they belong to.

A strategy's client half changes the node's ``Context.state`` (SCAFFOLD's c_i, FedDyn's g_k, MOON's previous
model) in ``end_round``, for the reply it sends. When the server does not aggregate that reply, the two sides
must not drift apart (SCAFFOLD's server c is the mean of the clients' c_i only while every Δc_i a client
applied reached the server):

- the hooks change a copy of the state (:func:`stage`), which replaces the node's state only once the whole
  reply is built: a hook that raises after ``end_round`` leaves the state as it was;
- under ``train.on_client_failure: skip`` a built reply may still be dropped (one that arrives after
  ``train.round_timeout_s``), so the copy is held beside the state (:func:`hold`) and every later message to
  the node says which round's reply the server last aggregated (``wire.DELIVERY``, stamped by
  :mod:`fedsim.server.delivery`); the node applies or drops what it holds (:func:`settle`) before anything
  reads its state. Under ``fail`` a reply the server lacks stops the run and a resume restores the
  checkpoint's states, so the copy replaces the state at once and no state is ever held twice.
"""

from __future__ import annotations

import copy

from flwr.app import ConfigRecord, Message, RecordDict

from fedsim import wire


def stage(state: RecordDict) -> RecordDict:
    """A copy of ``state`` for the hooks to change (its arrays' bytes are shared: they are immutable)."""
    return copy.deepcopy(state)


def replace_state(state: RecordDict, new: RecordDict) -> None:
    """``new`` becomes the node's whole state."""
    state.clear()
    state.update(new)


def hold(state: RecordDict, staged: RecordDict, server_round: int) -> None:
    """Keep ``staged`` beside ``state`` as round ``server_round``'s changes, until :func:`settle` decides."""
    drop_held(state)
    for name, record in staged.items():
        state[wire.PENDING_RECORD + name] = record
    state[wire.PENDING] = ConfigRecord({wire.SERVER_ROUND: server_round})


def settle(state: RecordDict, msg: Message) -> None:
    """Apply the held changes if the server aggregated their round's reply (as ``msg`` says), else drop them."""
    if wire.PENDING not in state:
        return
    delivery = msg.content.config_records.get(wire.DELIVERY)
    accepted = int(delivery[wire.ACCEPTED_ROUND]) if delivery is not None else 0
    held = int(state.config_records[wire.PENDING][wire.SERVER_ROUND])
    staged = RecordDict(
        {name.removeprefix(wire.PENDING_RECORD): r for name, r in state.items() if name.startswith(wire.PENDING_RECORD)}
    )
    drop_held(state)
    if accepted == held:
        replace_state(state, staged)


def drop_held(state: RecordDict) -> None:
    for name in [n for n in state if n == wire.PENDING or n.startswith(wire.PENDING_RECORD)]:
        del state[name]
