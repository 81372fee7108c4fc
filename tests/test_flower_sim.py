"""fedsim.engines.flower_sim's parts around Flower's simulation runtime: a lost worker's error is one line in
fedsim's words, a stopped simulation ends the server's wait, a client's exception is fedsim's error reply, and
Flower's logs that fedsim says better are dropped. Runs under the engine are tests/test_engines.py's and
tests/test_strategy_engines.py's; lost workers under it, tests/test_lost_workers.py's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from uuid import uuid4

import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedsim.engines import flower_sim
from fedsim.errors import FedsimError

# Ray 2.55's words, in Flower's reason, for a message whose worker was lost or was being replaced: the same
UNAVAILABLE = (
    "<class 'ray.exceptions.ActorUnavailableError'>:<'The actor bdf6f69b3c7afdc87d8d468001000000 is unavailable: "
    "The actor is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14. The task may or may "
    "not have been executed on the actor.'>"
)
DIED = (
    "<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: ClientAppActor\n\tactor_id: 9f3e2b1c0d4a5e6f7a8b9c0d01000000\n"
    "The actor 9f3e2b1c0d4a5e6f7a8b9c0d01000000 is dead because its worker process has died. "
    "Some common causes include: (1) the process was killed by the OOM killer.'>"
)


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("_run_id", "_node_id", "_task_id"):  # as a Grid sets them in the sender's process
        monkeypatch.setattr(TaskIdentity, name, 1)


def message(node: int) -> Message:
    return Message(RecordDict({"c": ConfigRecord({"node": node})}), dst_node_id=node, message_type="train")


class LosingNodes(Grid):
    """Answers each pushed message at once: with Ray's error for a lost worker for the nodes in ``lost``, else a
    reply whose content is the node's own number."""

    def __init__(self, lost: set[int]) -> None:
        self.lost, self.answers = lost, {}

    def set_run(self, run: object) -> None: ...

    @property
    def run(self) -> Any: ...

    def create_message(self, *args: object, **kwargs: object) -> Any: ...

    def get_node_ids(self) -> Iterable[int]:
        return [1, 2]

    def send_and_receive(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("fedsim's grid polls; it never calls Flower's send_and_receive")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid4())  # as Flower's grid stamps a pushed message
            node = m.metadata.dst_node_id
            content = Error(0, UNAVAILABLE) if node in self.lost else RecordDict({"c": ConfigRecord({"node": node})})
            self.answers[m.metadata.message_id] = Message(content, reply_to=m)
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.answers.pop(i) for i in list(message_ids) if i in self.answers]


def test_the_round_loop_gets_every_reply_and_a_lost_workers_in_one_line() -> None:
    grid = flower_sim.RuntimeGrid(LosingNodes(lost={2}), threading.Event())
    replies = {r.metadata.src_node_id: r for r in grid.send_and_receive([message(1), message(2)], timeout=60)}
    assert replies.keys() == {1, 2}
    assert not replies[1].has_error() and replies[1].content["c"]["node"] == 1
    reason = replies[2].error.reason
    assert reason.startswith("their Ray worker died during the round (ActorUnavailableError: ")
    assert "\n" not in reason and "<class" not in reason and "bdf6f69b" not in reason


def test_a_stopped_simulation_ends_the_servers_wait() -> None:
    stopped = threading.Event()
    grid = flower_sim.RuntimeGrid(LosingNodes(lost=set()), stopped)
    stopped.set()  # Ctrl-C or SIGTERM
    with pytest.raises(FedsimError, match="Ctrl-C or SIGTERM"):
        grid.send_and_receive([message(1)], timeout=60)


def test_a_lost_workers_error_is_one_line_of_rays_cause_without_its_ids() -> None:
    reply = flower_sim.in_one_line(Message(Error(0, DIED), reply_to=message(1)))
    reason = reply.error.reason
    assert reason.startswith("their Ray worker died during the round (ActorDiedError: ")
    assert "its worker process has died" in reason
    assert "\n" not in reason and "9f3e2b1c" not in reason and "common causes" not in reason
    raised = flower_sim.in_one_line(Message(Error(0, "<class 'builtins.ValueError'>:<'no data'>"), reply_to=message(1)))
    assert raised.error.reason == "ValueError: no data"  # not a lost worker: Ray's kind and text
    own = flower_sim.in_one_line(Message(Error(0, "ValueError: no data (at x.py:1 in f)"), reply_to=message(1)))
    assert own.error.reason == "ValueError: no data (at x.py:1 in f)"  # fedsim's own reply, as it is


@pytest.fixture
def flower_log_level() -> Iterator[None]:
    logger = logging.getLogger("flwr")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.mark.usefixtures("flower_log_level")
def test_a_clients_exception_is_fedsims_error_reply() -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        raise ValueError("client 3 has no data")

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    reply = flower_sim.ErrorReplies(app)(message(1), ctx)
    assert reply.has_error() and reply.error.reason.startswith("ValueError: client 3 has no data (at ")


def record(module: str, func: str, msg: str = "x", args: tuple[object, ...] = ()) -> logging.LogRecord:
    rec = logging.LogRecord("flwr", logging.WARNING, f"{module}.py", 1, msg, args, None, func)
    rec.module = module
    return rec


def test_flowers_logs_that_fedsim_says_better_are_dropped_and_no_other() -> None:
    noise = flower_sim._FlowerNoise()
    assert not noise.filter(record("vce_api", "worker"))  # a failed message: the error reply says it
    assert not noise.filter(record("raybackend", "process_message"))
    assert not noise.filter(record("deprecation", "warn_deprecated_feature", "%s", ("run_simulation",)))
    assert noise.filter(record("deprecation", "warn_deprecated_feature", "%s", ("start_client",)))
    assert noise.filter(record("vce_api", "start_vce"))
    assert noise.filter(record("server_app", "worker"))
