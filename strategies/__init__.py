"""Strategies: each registered name pairs a server half (a Flower strategy) with a client half.

A strategy module defines a :class:`StrategySpec` subclass registered in :data:`STRATEGIES`:

- ``Params``: a pydantic model of the YAML options (``strategy: {name: ..., <options>}``), the
  single place its hyper-parameters and their defaults are declared;
- ``server(params, fedsim_server_args)``: builds the Flower ``Strategy`` (server half);
- ``client(params)``: builds the :class:`fedsim.training.ClientHooks` (client half).
"""

from __future__ import annotations

from typing import Any, ClassVar

from flwr.serverapp.strategy import Strategy
from pydantic import BaseModel, ConfigDict

from fedsim.registry import Registry
from fedsim.server_strategy import FedsimFedAvg
from fedsim.training import ClientHooks


class StrategyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StrategySpec:
    """Base of every registered strategy. The class docstring's first line is its summary.

    The defaults are FedAvg's halves: a strategy that only changes the client sets ``Client``;
    one whose server takes options or differs overrides ``server``.
    """

    Params: ClassVar[type[StrategyParams]] = StrategyParams
    Client: ClassVar[type[ClientHooks]] = ClientHooks

    @classmethod
    def server(cls, params: Any) -> Strategy:
        return FedsimFedAvg()

    @classmethod
    def client(cls, params: Any) -> ClientHooks:
        return cls.Client(params)


STRATEGIES: Registry[type[StrategySpec]] = Registry("strategies")

# Registration happens on import (the built-ins, one module per algorithm)
from fedsim.strategies import (  # noqa: E402,F401
    fedavg,
    fedbn,
    feddecorr,
    fedlc,
    fedprox,
    fedrs,
    fedyogi,
    scaffold,
    server_opt,
)
