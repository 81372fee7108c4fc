"""Strategies: each registered name pairs a server half (a Flower strategy) with a client half.

A strategy is a :class:`StrategySpec` subclass registered in :data:`STRATEGIES`, built as
``Spec(params)``:

- ``Params``: a pydantic model of the YAML options (``strategy: {name: ..., <options>}``), the
  single place its hyper-parameters and their defaults are declared;
- ``server(setup)``: builds the Flower ``Strategy`` (server half), given what the run tells it
  (:class:`~fedsim.strategies.server_half.ServerSetup`);
- ``client()``: builds the :class:`~fedsim.strategies.hooks.ClientHooks` (client half).

The defaults are FedAvg's halves. A stock Flower strategy class named by a dotted path
(``strategy: {name: "flwr.serverapp.strategy:FedAvg", <its constructor's keyword arguments>}``)
is wrapped as a spec with FedAvg's client half. Each algorithm's exact update: docs/algorithms.md.
"""

from __future__ import annotations

from fedsim.strategies import (  # noqa: F401 (the built-ins register themselves on import)
    ccvr,
    fedavg,
    fedbabu,
    fedbn,
    feddecorr,
    feddyn,
    fedetf,
    fedexp,
    fedlc,
    fednova,
    fedntd,
    fedprox,
    fedrod,
    fedrs,
    fedyogi,
    moon,
    scaffold,
    server_opt,
)
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import STRATEGIES, FlowerStrategySpec, StrategySpec, wrap_flower_strategy
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import ServerSetup

__all__ = [
    "STRATEGIES", "ClientHooks", "FastAveraging", "FlowerStrategySpec", "RoundInfo", "ServerSetup", "StrategySpec",
    "wrap_flower_strategy",
]  # fmt: skip
