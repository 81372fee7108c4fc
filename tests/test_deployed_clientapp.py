"""fedsim.deploy.clientapp: the core ClientApp as a SuperNode runs it, announcing to its fork server a run's
runtime that a Message made its process build."""

from __future__ import annotations

from functools import lru_cache

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from fedsim import wire
from fedsim.client import runtime
from fedsim.deploy.clientapp import DeployedClientApp


def test_a_forked_clientapp_announces_a_runtime_it_built_and_none_it_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    """fedsim's deployed ClientApp tells its fork server the run config of a runtime a Message made its process
    build (the server had none for it, so builds it for the next children), and stays quiet about one it had."""
    for name in ("_run_id", "_node_id", "_task_id"):  # as a Grid sets them in the sender's process
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(runtime, "prepare", lru_cache(maxsize=2)(lambda config_json: object()))
    core = ClientApp()

    @core.train()
    def train(msg: Message, context: Context) -> Message:
        runtime.prepare(wire.run_config_json(msg))  # as the core ClientApp's handlers build the runtime
        return Message(RecordDict(), reply_to=msg)

    deployed, heard = DeployedClientApp(core), []
    deployed.announce = heard.append
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    runtime.prepare("inherited")  # the fork server built it before it forked this process

    def message(config_json: str) -> Message:
        content = RecordDict({wire.CONFIG: ConfigRecord({wire.RUN_CONFIG: config_json})})
        return Message(content, dst_node_id=1, message_type=wire.TRAIN)

    for config_json in ("inherited", "new", "new"):
        deployed(message(config_json), ctx)
    assert heard == ["new"]
