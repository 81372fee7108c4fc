"""A node's state changes held until the server has aggregated their round's reply (fedsim.client.pending),
through the real runtime and Flower messages: MOON's client keeps its model after each participation, so the
state it holds is the reply it sent, and what the server says of that reply decides which one it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedsim import wire
from fedsim.client.runtime import ClientRuntime
from fedsim.client.state import decode, state_query
from fedsim.config_file import parse_config
from fedsim.engines.local import identify_as_server, node_context, node_id_of
from fedsim.experiment.resolve import resolve
from fedsim.strategies.moon import MOON_PREVIOUS
from tests.conftest import small_config
from tests.test_client_runtime import global_model, message


@pytest.fixture(autouse=True)
def _server_identity() -> None:
    identify_as_server(1)


def build(tmp_path: Path, policy: str) -> ClientRuntime:
    cfg = small_config(tmp_path, strategy={"name": "moon"}, train={"on_client_failure": policy})
    return ClientRuntime(resolve(parse_config(cfg)))


def told(msg: Message, accepted: int) -> Message:
    """``msg`` as the server sends it: with the last round whose reply from the node it aggregated."""
    msg.content = RecordDict(
        {**dict(msg.content.items()), wire.DELIVERY: ConfigRecord({wire.ACCEPTED_ROUND: accepted})}
    )
    return msg


def trained(rt: ClientRuntime, context: Context, server_round: int, accepted: int) -> ArrayRecord:
    """Train partition 0 in ``server_round``; the model it replied."""
    reply = rt.train(told(message(rt, global_model(rt, server_round), server_round, 0), accepted), context)
    return reply.content.array_records[wire.ARRAYS]


def evaluated(rt: ClientRuntime, context: Context, accepted: int) -> None:
    rt.evaluate(told(message(rt, global_model(rt, 0), 9, 0, kind=wire.EVALUATE), accepted), context)


def previous(context: Context) -> ArrayRecord | None:
    return context.state.array_records.get(MOON_PREVIOUS)


def test_under_skip_a_rounds_state_applies_only_once_the_server_kept_its_reply(tmp_path: Path) -> None:
    rt = build(tmp_path, "skip")
    context = node_context(1, 0, 4)
    sent_1 = trained(rt, context, 1, accepted=0)
    assert previous(context) is None  # held, not applied: the server has not said
    evaluated(rt, context, accepted=0)  # the server never aggregated round 1's reply (it came too late)
    assert previous(context) is None and list(context.state) == []

    sent_2 = trained(rt, context, 2, accepted=0)
    evaluated(rt, context, accepted=2)  # round 2's reply was aggregated
    assert previous(context) == sent_2 and sent_2 != sent_1 and list(context.state) == [MOON_PREVIOUS]

    trained(rt, context, 3, accepted=2)  # applied on the next message; round 3's held
    save = Message(
        RecordDict({wire.CONFIG: ConfigRecord({
            wire.STATE_ROUND: 3, wire.STATE_KEEP: 0, wire.STATE_DIR: str(tmp_path / "states"), wire.RUN_KEY: "r",
        })}),
        dst_node_id=node_id_of(0), message_type=wire.SAVE_STATE,
    )  # fmt: skip
    answer = state_query(told(save, accepted=2), context)  # a checkpoint after round 3, whose reply was lost
    saved = decode((tmp_path / "states" / "partition-0" / "round-3.bin").read_bytes())
    assert answer[wire.STATE_SHA256] and list(saved) == [MOON_PREVIOUS]
    assert saved.array_records[MOON_PREVIOUS] == sent_2


def test_under_fail_a_rounds_state_applies_with_its_reply(tmp_path: Path) -> None:
    # a reply the server lacks stops the run (and a resume restores the checkpoint's states): nothing is held
    rt = build(tmp_path, "fail")
    context = node_context(1, 0, 4)
    sent = trained(rt, context, 1, accepted=0)
    assert list(context.state) == [MOON_PREVIOUS] and previous(context) == sent
