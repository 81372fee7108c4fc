"""The strategy contract and its registry (strategies/base.py): FedAvg's halves by default, and a stock Flower
strategy wrapped as a spec whose options are its constructor's, with the ranges its maths needs. The protocol rows a
strategy declares: tests/test_wire.py."""

from __future__ import annotations

import pytest
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy

from fedsim.errors import ConfigError, RegistryError
from fedsim.registry import validate_options
from fedsim.strategies import STRATEGIES
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.base import StrategySpec, wrap_flower_strategy
from fedsim.strategies.hooks import ClientHooks
from fedsim.strategies.server_half import ServerSetup
from tests.strategy_harness import mlp

SETUP = ServerSetup(4, frozenset({"w"}))


def test_a_spec_is_fedavg_unless_it_says_otherwise() -> None:
    spec = StrategySpec(StrategySpec.Params())
    assert type(spec.client()) is ClientHooks and spec.client() is not spec.client()  # a fresh one per model
    assert isinstance(spec.server(SETUP), FastAveraging)
    model = mlp()
    assert spec.adapt_model(model, seed=0) is model


def test_a_flower_strategy_is_wrapped_with_its_constructors_options_and_their_ranges() -> None:
    spec = wrap_flower_strategy(FedProx)
    assert spec is not None and spec.__name__ == "FlowerFedProxSpec"
    assert spec.__doc__.startswith("Flower's FedProx: ") and spec.__doc__.endswith("(FedAvg's client half)")
    params = validate_options(spec.Params, {"proximal_mu": 0.3, "fraction_train": 1.0}, "strategy")
    server = spec(params).server(SETUP)
    assert isinstance(server, FedProx) and server.proximal_mu == 0.3
    # each names the field, its value and the bound (the wording is pydantic's)
    with pytest.raises(ConfigError, match=r"^strategy\.proximal_mu = -1\.0: .*greater than or equal to 0$"):
        validate_options(spec.Params, {"proximal_mu": -1.0}, "strategy")
    with pytest.raises(ConfigError, match=r"^strategy\.fraction_train = 1\.5: .*less than or equal to 1$"):
        validate_options(spec.Params, {"fraction_train": 1.5}, "strategy")
    assert "train_metrics_aggr_fn" not in spec.Params.model_fields  # a callable: no option, its default kept


def test_what_is_not_a_flower_strategy_is_not_wrapped_and_one_needing_an_object_is_refused() -> None:
    assert wrap_flower_strategy(FedAvg()) is None and wrap_flower_strategy(dict) is None

    class Wraps(Strategy):
        def __init__(self, inner: Strategy) -> None:
            self.inner = inner

    with pytest.raises(RegistryError, match=r"Wraps needs 'inner' \(Strategy\), which a config cannot give"):
        wrap_flower_strategy(Wraps)


def test_a_stock_flower_strategy_is_named_by_its_dotted_path() -> None:
    spec = STRATEGIES.get("flwr.serverapp.strategy:FedAvgM")
    assert issubclass(spec, StrategySpec) and spec.strategy_class.__name__ == "FedAvgM"
