"""A test plugin strategy: FedAvg whose clients append ``<round> <partition>`` to ``record_dir/<pid>`` at
every local step (from ``extra_loss``, which the one training loop calls once per client and step). A
process's file shows how it trained: clients trained together interleave their steps (0 2 0 2 0 2),
clients trained one at a time do not (0 0 0 2 2 2). Referenced from YAML as
``tests.plugins.step_order:StepOrder``."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from flwr.app import RecordDict

from fedsim.models import FedsimModel
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec


class StepOrderClient(ClientHooks["StepOrder.Params"]):
    info: RoundInfo | None = None

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        self.info = info

    def extra_loss(
        self, model: FedsimModel, x: torch.Tensor, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        assert self.info is not None  # begin_round comes first (ClientHooks' call order)
        with open(Path(self.params.record_dir) / str(os.getpid()), "a") as f:  # one file per process: no races
            f.write(f"{self.info.server_round} {self.info.partition_id}\n")
        return None  # FedAvg's loss: the numbers are FedAvg's


class StepOrder(StrategySpec):
    """FedAvg that records the order of its clients' local steps, per process (test plugin)."""

    Client = StepOrderClient

    class Params(StrategySpec.Params):
        record_dir: str
