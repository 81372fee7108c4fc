"""FedBABU (Oh, Kim, Yun, *FedBABU: Toward Enhanced Representation for Federated Image Classification*, ICLR 2022):
only the body is trained and aggregated; the head stays at its random initialisation.

The head θ_cls is the model's ``classifier`` (the authors' last linear layer); the body θ_ext is every other
tensor, a projection head included. Client (Algorithm 1, ClientBodyUpdate): the one training loop's SGD on the
body with the head fixed at θ_cls^0; the head's gradients are dropped before each step, so no update, momentum
or weight decay reaches it (the authors' SGD parameter group of learning rate 0). The reply holds the body
alone. Server: FedAvg over the body; the global model keeps its head, θ_cls^0, bit for bit. Personalisation:
fine-tuning the whole model (``eval.personal``, the generic one; docs/algorithms.md gives the paper's settings).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict

from fedsim.arrays import dump_arrays
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import PartialAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.hooks import ClientHooks
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup


def head_keys(model: FedsimModel) -> frozenset[str]:
    """State-dict keys of the head θ_cls: the classifier's parameters and buffers."""
    return frozenset(f"classifier.{key}" for key in model.classifier.state_dict())


class FedBABUClient(ClientHooks[StrategySpec.Params]):
    """Trains the body only, and sends it without the head."""

    def correct_gradients(self, model: FedsimModel) -> None:
        for p in model.classifier.parameters():
            p.grad = None  # the SGD step skips a parameter without a gradient

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        return dump_arrays(model, skip=head_keys(model))


@STRATEGIES.register("fedbabu")
class FedBABUSpec(StrategySpec):
    """FedBABU: the head frozen at its initialisation, the body trained and averaged (Oh et al. 2022)."""

    Client = FedBABUClient

    def server(self, setup: ServerSetup) -> PartialAveraging:
        return PartialAveraging(**EVERY_NODE)
