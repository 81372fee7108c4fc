"""Test plugin strategies whose client, in a Ray worker, ends that worker's process at a chosen round and
partition: FedAvg (``tests.plugins.dying_worker:DyingFedAvg``) or SCAFFOLD (``...:DyingScaffold``) otherwise,
number for number. The environment variable ``FEDSIM_TEST_WORKER_END`` says when and how:
``ROUND:PARTITION:exit`` ends the worker's process with SIGKILL as the client begins that round (as the
OOM killer would; ``os._exit`` in plugin code is a failure naming the plugin instead, fedsim.plugin_guard);
``ROUND:PARTITION:hang:DIR`` writes the process id to ``DIR/<partition>.pid`` and sleeps (for a test to
SIGKILL it from outside, or for ``train.round_timeout_s`` to end); PARTITION ``*``: the first partition of the
round that the worker serves. Unset: the strategy computes exactly what its base does, so a run resumed
without the variable continues the run that had it. Ray's workers inherit the variable from the process that
starts Ray (on a cluster: ``ray start`` on their node)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from flwr.app import RecordDict

from fedsim.models import FedsimModel
from fedsim.strategies import StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.scaffold import ScaffoldClient, ScaffoldSpec

WORKER_END = "FEDSIM_TEST_WORKER_END"


def end_worker_if_asked(info: RoundInfo) -> None:
    when = os.environ.get(WORKER_END, "").split(":")
    if len(when) < 3 or int(when[0]) != info.server_round or when[1] not in ("*", str(info.partition_id)):
        return
    if when[2] == "exit":
        os.kill(os.getpid(), signal.SIGKILL)
    Path(when[3], f"{info.partition_id}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


class DyingClient(ClientHooks[StrategySpec.Params]):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        end_worker_if_asked(info)


class DyingScaffoldClient(ScaffoldClient):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        end_worker_if_asked(info)
        super().begin_round(model, content, state, info)


class DyingFedAvg(StrategySpec):
    """FedAvg whose worker ends as FEDSIM_TEST_WORKER_END says (test plugin)."""

    Client = DyingClient


class DyingScaffold(ScaffoldSpec):
    """SCAFFOLD whose worker ends as FEDSIM_TEST_WORKER_END says (test plugin)."""

    Client = DyingScaffoldClient
