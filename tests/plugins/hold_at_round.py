"""A test plugin strategy: FedAvg whose clients wait at the start of the round that ``hold_file`` names, for
as long as it names it, writing ``<hold_file>.<pid>`` (the round) while they wait: a run held at an exact
round on any machine, however slow or loaded, for a test to signal there (tests/test_sweep.py), where a
watcher polling the run's checkpoints raced runs that could finish first. No ``hold_file``: no wait.
Referenced from YAML as ``tests.plugins.hold_at_round:HoldAtRound``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flwr.app import RecordDict

from fedsim.models import FedsimModel
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec


def held_round(hold_file: Path) -> int | None:
    try:
        return int(hold_file.read_text())
    except (OSError, ValueError):  # no file (or being written): no hold
        return None


class HoldClient(ClientHooks["HoldAtRound.Params"]):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        hold = Path(self.params.hold_file)
        while held_round(hold) == info.server_round:
            Path(f"{hold}.{os.getpid()}").write_text(str(info.server_round))
            time.sleep(0.05)


class HoldAtRound(StrategySpec):
    """FedAvg whose clients wait at the round ``hold_file`` names (test plugin)."""

    Client = HoldClient

    class Params(StrategySpec.Params):
        hold_file: str
