"""Plugins that try to end or stall a run the ways a plugin must not (test plugins for fedsim's guards around
plugin code): ``tests.plugins.misbehaving:<Name>`` with ``how: sys_exit | os_exit | sleep``.

- ``InClient``: a strategy whose client hook ``begin_round`` does it, for client ``partition`` in round ``round``;
- ``InAggregate``: a strategy whose server half's ``aggregate_train`` does it in round ``round``;
- ``InForward``: a normaliser whose module's ``forward`` does it (in a client's training);
- ``LeavesThread``: a normaliser that starts a non-daemon thread waiting forever, named ``left-by-norm``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, Literal

import torch
from flwr.app import RecordDict
from pydantic import Field
from torch import nn

from fedsim.models import FedsimModel
from fedsim.norms import Normaliser, Site
from fedsim.strategies import ClientHooks, RoundInfo, StrategySpec
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

How = Literal["sys_exit", "os_exit", "sleep"]


def misbehave(how: How) -> None:
    if how == "sys_exit":
        sys.exit(0)
    if how == "os_exit":
        os._exit(0)
    while True:  # never returns
        time.sleep(3600)


class _Misbehaving(StrategySpec.Params):
    how: How
    partition: int = Field(0, ge=0)
    round: int = Field(1, ge=1)


class _ClientThatExits(ClientHooks[_Misbehaving]):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        if info.partition_id == self.params.partition and info.server_round == self.params.round:
            misbehave(self.params.how)


class InClient(StrategySpec):
    """FedAvg whose client ``partition`` exits or hangs in round ``round`` (test plugin)."""

    Params = _Misbehaving
    Client = _ClientThatExits


class _ExitingAverage(FastAveraging):
    def __init__(self, params: _Misbehaving) -> None:
        super().__init__(**EVERY_NODE)
        self.params = params

    def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> Any:
        if server_round == self.params.round:
            misbehave(self.params.how)
        return super().aggregate_train(server_round, replies)


class InAggregate(StrategySpec):
    """FedAvg whose aggregate_train exits or hangs in round ``round`` (test plugin)."""

    Params = _Misbehaving

    def server(self, setup: ServerSetup) -> FastAveraging:
        return _ExitingAverage(self.params)


class _Exits(nn.Module):
    def __init__(self, how: How) -> None:
        super().__init__()
        self.how: How = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # training, not the server's look at the model
            misbehave(self.how)
        return x


class InForward(Normaliser):
    """Identity at every site, exiting or hanging in its forward while a client trains (test plugin)."""

    class Params(Normaliser.Params):
        how: How

    params: Params

    def make(self, site: Site, num_features: int) -> nn.Module:
        return _Exits(self.params.how)


class LeavesThread(Normaliser):
    """Identity at every site, leaving a non-daemon thread named ``left-by-norm`` that never ends (test plugin)."""

    def make(self, site: Site, num_features: int) -> nn.Module:
        if not any(t.name == "left-by-norm" for t in threading.enumerate()):
            threading.Thread(target=threading.Event().wait, name="left-by-norm").start()
        return nn.Identity()
