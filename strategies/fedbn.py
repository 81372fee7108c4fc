"""FedBN (Li et al., ICLR 2021): normalisation layers stay on the client; the rest is FedAvg.

The client keeps the weights *and* running statistics of every normalisation module (asked of
:func:`fedsim.norms.norm_modules`, never by class: with ``norm: bn`` these are the BN layers) in
its own ``Context.state``, never sends them, and puts them back over whatever the server sends,
for training, and for evaluation unless ``evaluate: shared``. A client that has not trained yet
starts from the server's copy. The server averages what it receives and keeps its own values for
the rest.

``evaluate: local`` (default) scores each client's personalised model, FedBN's own protocol;
``evaluate: shared`` scores the global model as the server holds it (its normalisation tensors
never leave their initial values), which is how LN-FL's Tables 1 and 4 report FedBN.
"""

from __future__ import annotations

from typing import Literal

from flwr.app import ArrayRecord, RecordDict
from pydantic import Field

from fedsim import wire
from fedsim.arrays import copy_into, dump_arrays, load_arrays
from fedsim.errors import ConfigError
from fedsim.models import FedsimModel
from fedsim.norms import norm_modules
from fedsim.strategies.aggregation import PartialAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

FEDBN_LOCAL = "fedbn.local"  # Context.state: the client's own normalisation tensors


def local_keys(model: FedsimModel) -> frozenset[str]:
    """State-dict keys of every normalisation module: parameters and buffers."""
    return frozenset(f"{name}.{key}" for name, module in norm_modules(model) for key in module.state_dict())


class FedBNClient(ClientHooks["FedBNSpec.Params"]):
    """Loads the global model around its own normalisation tensors; sends everything else."""

    def load_global(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        if FEDBN_LOCAL not in state:
            load_arrays(model, arrays)
            return
        load_arrays(model, arrays, skip=local_keys(model))
        copy_into(model.state_dict(), state[FEDBN_LOCAL])

    def load_for_eval(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        if self.params.evaluate == "shared":
            load_arrays(model, arrays)
        else:
            self.load_global(model, arrays, state)

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        keys = local_keys(model)
        state[FEDBN_LOCAL] = dump_arrays(model, skip=frozenset(model.state_dict()) - keys)
        return RecordDict()

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        return dump_arrays(model, skip=local_keys(model))


@STRATEGIES.register("fedbn")
class FedBNSpec(StrategySpec):
    """FedBN: normalisation layers (weights + running stats) stay local, rest FedAvg (Li et al. 2021)."""

    Client = FedBNClient
    protocol = (
        wire.Key(wire.CLIENT_STATE, "client", FEDBN_LOCAL, "*", "ArrayRecord", "the client's normalisation tensors"),
    )

    class Params(StrategySpec.Params):
        evaluate: Literal["local", "shared"] = Field(
            "local", description="score each client's personalised model (local) or the global one (shared)"
        )

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        """``model`` as it is, once it has normalisation tensors to keep: without any, FedBN is FedAvg number for
        number, and a table would show a FedBN row that is not one."""
        if not local_keys(model):
            raise ConfigError(
                "model.norm: strategy 'fedbn' keeps each client's normalisation weights and statistics, and this "
                "model has none (norm none, or a normaliser without weights or running statistics): it would be "
                "FedAvg under another name; give model.norm bn, gn or ln (with affine weights), or strategy fedavg"
            )
        return model

    def server(self, setup: ServerSetup) -> PartialAveraging:
        return PartialAveraging(**EVERY_NODE)
