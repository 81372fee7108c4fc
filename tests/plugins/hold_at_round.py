"""A test plugin strategy: FedAvg that waits at the start of the round ``hold_file`` names, for as long as it
names it, writing ``<hold_file>.<pid>`` (the round) while it waits: a run held at an exact round on any
machine, however slow or loaded, for a test to act there, where a watcher polling the run raced it.
``side: client`` (tests/test_sweep_execute.py): the clients wait as they begin the round, so a signal finds the run
in it; ``side: server`` (tests/test_deploy.py): the server waits before it sends the round's Messages, so a
SuperNode killed meanwhile is dead before the round, never half-way through sending a reply.
No ``hold_file``: no wait. Referenced from YAML as ``tests.plugins.hold_at_round:HoldAtRound``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsim.models import FedsimModel
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup


def held_round(hold_file: Path) -> int | None:
    try:
        return int(hold_file.read_text())
    except (OSError, ValueError):  # no file (or being written): no hold
        return None


def wait_while_held(hold_file: Path, server_round: int) -> None:
    while held_round(hold_file) == server_round:
        Path(f"{hold_file}.{os.getpid()}").write_text(str(server_round))
        time.sleep(0.05)


class HoldClient(ClientHooks["HoldAtRound.Params"]):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        if self.params.side == "client":
            wait_while_held(Path(self.params.hold_file), info.server_round)


class HoldingServer(FastAveraging):
    def __init__(self, hold_file: Path) -> None:
        super().__init__(**EVERY_NODE)
        self.hold_file = hold_file

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        wait_while_held(self.hold_file, server_round)
        return super().configure_train(server_round, arrays, config, grid)


class HoldAtRound(StrategySpec):
    """FedAvg that waits at the round ``hold_file`` names, in its clients or its server (test plugin)."""

    Client = HoldClient

    class Params(StrategySpec.Params):
        hold_file: str
        side: Literal["client", "server"] = "client"

    def server(self, setup: ServerSetup) -> FastAveraging:
        return HoldingServer(Path(self.params.hold_file)) if self.params.side == "server" else super().server(setup)
