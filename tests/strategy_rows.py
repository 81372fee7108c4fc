"""One row per built-in strategy: the config sections of a small test run of it (its options, and what else it
needs, e.g. FedBN's BN layers). The end-to-end, vmapped-clients and resume tests take their strategies from
here, so a new strategy is tested under each of them by its one row (tests/test_strategy_rows.py checks every
registered strategy has one)."""

from __future__ import annotations

from typing import Any

from fedsim import wire
from fedsim.strategies import STRATEGIES, ServerSetup
from fedsim.strategies.aggregation import PartialAveraging
from fedsim.strategies.server_half import Checkpointable, FeatureCalibrated

ROWS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "fedprox": {"strategy": {"name": "fedprox", "mu": 0.1}},  # extra_loss over the client's own parameters
    "scaffold": {"strategy": {"name": "scaffold"}},  # correct_gradients on its own .grad, c_i across rounds
    "fedyogi": {"strategy": {"name": "fedyogi", "eta": 0.01}},  # server-side only: the clients are FedAvg's
    "fedlc": {"strategy": {"name": "fedlc"}},  # adjust_logits from the client's own label counts
    "fedrs": {"strategy": {"name": "fedrs"}},
    "feddecorr": {"strategy": {"name": "feddecorr"}},  # extra_loss on the client's own features
    "fedntd": {"strategy": {"name": "fedntd"}},  # extra_loss from its own frozen copy of the global model
    "fedbn": {"strategy": {"name": "fedbn"}, "model": {"norm": "bn"}},  # its BN tensors stay on the client
    "fedadam": {"strategy": {"name": "fedadam"}},
    "fedadagrad": {"strategy": {"name": "fedadagrad"}},
    "fedavgm": {"strategy": {"name": "fedavgm"}},
    "fedexp": {"strategy": {"name": "fedexp"}},  # server-side only; x^t as server state, scores the average
    # extra_loss through each client's own frozen global and previous models, on the paper's projection head
    "moon": {"strategy": {"name": "moon"}, "model": {"projection": 16}},
    "feddyn": {"strategy": {"name": "feddyn", "alpha": 0.1}},  # correct_gradients, g_k across rounds, h on the server
    "fednova": {"strategy": {"name": "fednova"}},  # its own record beside the model; FedAvg under local_steps
    # correct_gradients drops the head's gradients (momentum and weight decay on, to move it if anything could);
    # reply_arrays leaves the head out, the server keeps its own
    "fedbabu": {"strategy": {"name": "fedbabu"}, "train": {"momentum": 0.9, "weight_decay": 5e-4}},
    # adjust_logits from the client's label counts; a personal head of its hooks' own, stepped in the loop, in state
    "fedrod": {"strategy": {"name": "fedrod"}, "eval": {"personal": {"steps": 0}}},
    # its own message kind at each evaluation (query.feature_stats); the scored model is calibrated on the server
    "ccvr": {"strategy": {"name": "ccvr", "virtual_per_class": 50}},
    # adapt_model swaps the classifier for the fixed ETF (a frozen parameter); reply_arrays leaves it out; its
    # personalisation fine-tunes M and P in turn (a shortened local adaptation)
    "fedetf": {
        "strategy": {"name": "fedetf", "etf_dim": 12, "adapt_alternations": 2, "adapt_epochs": 1},
        "train": {"momentum": 0.9, "weight_decay": 5e-4},
        "eval": {"personal": {"steps": 0}},
    },
}


def sections(name: str) -> dict[str, Any]:
    """The row's sections, with ``strategy.name`` set."""
    row = ROWS[name]
    return {**row, "strategy": {"name": name, **row.get("strategy", {})}}


def keeps_client_state(name: str) -> bool:
    """Whether the strategy's clients keep records across rounds (its protocol declares them)."""
    return any(key.message == wire.CLIENT_STATE for key in STRATEGIES.get(name).protocol)


def has_own_messages(name: str) -> bool:
    """Whether the strategy's Messages or its clients' state differ from FedAvg's: records of its own (its protocol
    rows), replies that hold part of the model (its server averages what the clients send), or message kinds of
    the core's that only it asks (CCVR's feature statistics): what a transport or a runtime's node state could lose
    or mismatch."""
    server = server_of(name)
    return bool(STRATEGIES.get(name).protocol) or isinstance(server, PartialAveraging | FeatureCalibrated)


def keeps_server_state(name: str) -> bool:
    """Whether the strategy's server half has state a checkpoint must hold."""
    return isinstance(server_of(name), Checkpointable)


def server_of(name: str) -> Any:
    """The strategy's server half as its row configures it."""
    spec = STRATEGIES.get(name)
    options = {k: v for k, v in sections(name)["strategy"].items() if k != "name"}
    return spec(spec.Params.model_validate(options)).server(ServerSetup(4, parameter_keys=frozenset({"w"})))


def stateful() -> list[str]:
    """The strategies a resume must restore state for, on the client or the server."""
    return [name for name in ROWS if keeps_client_state(name) or keeps_server_state(name)]
