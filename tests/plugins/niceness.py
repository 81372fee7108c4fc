"""A test plugin strategy: FedAvg whose clients write their process's niceness to ``record_dir/<pid>``
(where and at what CPU priority clients train). Referenced from YAML as ``tests.plugins.niceness:Niceness``."""

from __future__ import annotations

import os
from pathlib import Path

from flwr.app import RecordDict

from fedsim.models import FedsimModel
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec


class NicenessClient(ClientHooks["Niceness.Params"]):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        (Path(self.params.record_dir) / str(os.getpid())).write_text(str(os.nice(0)))


class Niceness(StrategySpec):
    """FedAvg that records each client process's niceness (test plugin)."""

    Client = NicenessClient

    class Params(StrategySpec.Params):
        record_dir: str
