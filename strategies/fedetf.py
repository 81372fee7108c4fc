"""FedETF (Li, Shang, He, Lin, Wu, *No Fear of Classifier Biases: Neural Collapse Inspired Federated Learning with
Synthetic and Fixed Classifier*, ICCV 2023), as the authors' code (ZexiLee/ICCV-2023-FedETF) runs it.

The model's classifier becomes :class:`ETFClassifier`: a trainable projection layer (one linear map from the
classifier's input to the ETF's dimension d), L2 normalisation of its output μ, and logits β·Mᵀμ with M a fixed
random simplex ETF (d x K, :func:`simplex_etf`, drawn from the run's seed) and β a learnable temperature.
Client, per batch: the balanced softmax CE(β·Mᵀμ + γ·log n, y), n the client's training samples per class.
Server: FedAvg over everything but M; M never leaves a client, the global model keeps it bit for bit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from pydantic import Field, ValidationInfo, field_validator
from torch import nn

from fedsim.arrays import dump_arrays
from fedsim.errors import ConfigError
from fedsim.models import FedsimModel
from fedsim.strategies.aggregation import PartialAveraging
from fedsim.strategies.base import STRATEGIES, StrategySpec
from fedsim.strategies.fedrod import balanced_prior
from fedsim.strategies.hooks import ClientHooks, FineTune, RoundInfo
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup

ETF_KEY = "classifier.etf"  # the fixed ETF M in the model's state dict
# the largest ETF dimension: the authors' is the classes or a few hundred; a typo of a billion would allocate
# its d x K draw (float64) before anything else could refuse it
MAX_ETF_DIM = 65536


def simplex_etf(dim: int, classes: int, seed: int) -> torch.Tensor:
    """M = sqrt(K/(K−1))·U·(I_K − 1/K·11ᵀ), U (dim x K) the orthonormal Q of a uniform [0, 1) matrix's QR, as the
    authors draw it; float64 from ``seed``'s own generator, so every process draws the same M."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.rand(dim, classes, generator=g, dtype=torch.float64))
    centring = torch.eye(classes, dtype=torch.float64) - 1 / classes
    return math.sqrt(classes / (classes - 1)) * u @ centring


class ETFClassifier(nn.Module):
    """Logits β·Mᵀμ, μ = P(z)/‖P(z)‖: the projection P and temperature β trained, the ETF M a frozen parameter
    (a parameter, not a buffer, so it travels and vmaps like the model's other tensors)."""

    def __init__(self, width: int, etf: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.projection = nn.Linear(width, etf.shape[0])
        self.scale = nn.Parameter(torch.tensor(scale))
        self.etf = nn.Parameter(etf.float(), requires_grad=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        mu = F.normalize(self.projection(z), dim=1, eps=1e-12)
        return self.scale * (mu @ self.etf)


# the local adaptation's own options (FedETFSpec.Params)
ADAPT_OPTIONS = frozenset({"adapt_alternations", "adapt_epochs", "adapt_etf_lr", "adapt_projection_lr"})


class FedETFClient(ClientHooks["FedETFSpec.Params"]):
    """The balanced softmax on the ETF logits; the reply leaves the ETF out."""

    prior: torch.Tensor

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        device = next(model.parameters()).device
        self.prior = balanced_prior(info.class_counts, self.params.gamma).float().to(device)

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits + self.prior.to(logits.dtype)

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        return dump_arrays(model, skip=frozenset({ETF_KEY}))

    def personalize(self, model: FedsimModel, state: RecordDict, fine_tune: FineTune) -> nn.Module:
        """The authors' local adaptation (``Client_personalization``): one more round of the balanced softmax from
        the global model, as training runs it; then ``adapt_alternations`` times, ``adapt_epochs`` epochs of plain
        cross-entropy on M alone (SGD, no momentum, no weight decay), then as many on the projection P alone (the
        run's momentum and weight decay). β and the body stay as the first round left them."""
        p = self.params
        if not p.adaptation:
            fine_tune(model)
            return model
        t, decay = fine_tune.training, fine_tune.weight_decay
        self.prior = balanced_prior(t.class_counts, p.gamma).float().to(model.classifier.etf.device)
        trained = [q for q in model.parameters() if q.requires_grad]  # everything but M
        steps, epochs = t.local_steps, t.local_epochs
        fine_tune.train(model, trained, self, t.lr, momentum=t.momentum, weight_decay=decay, steps=steps, epochs=epochs)
        plain, head, epochs = ClientHooks(p), model.classifier, p.adapt_epochs
        for _ in range(p.adapt_alternations):
            fine_tune.train(model, [head.etf], plain, p.adapt_etf_lr, epochs=epochs)
            projection = list(head.projection.parameters())
            lr = p.adapt_projection_lr
            fine_tune.train(model, projection, plain, lr, momentum=t.momentum, weight_decay=decay, epochs=epochs)
        return model


@STRATEGIES.register("fedetf")
class FedETFSpec(StrategySpec):
    """FedETF: a fixed simplex-ETF classifier behind a projection, balanced softmax, FedAvg (Li et al. 2023)."""

    Client = FedETFClient

    class Params(StrategySpec.Params):
        etf_dim: int | None = Field(
            None,
            ge=2,
            le=MAX_ETF_DIM,
            description="the ETF's dimension d (at least the number of classes); none: the classes",
        )
        scale: float = Field(1.0, gt=0, description="the temperature β's initial value (authors: 1, 10 for their CNN)")
        gamma: float = Field(1.0, ge=0, description="exponent γ on the class counts in the balanced softmax")
        adaptation: bool = Field(
            True,
            description="personalised evaluation (eval.personal) runs the authors' local adaptation, whose work is "
            "the adapt_* options; false: the generic fine-tuning, M fixed",
        )
        adapt_alternations: int = Field(
            20, ge=0, le=10**4, description="the local adaptation's alternations of M's and P's fine-tuning"
        )
        adapt_epochs: int = Field(3, ge=1, le=10**4, description="epochs of M's, then of P's, in each alternation")
        adapt_etf_lr: float = Field(0.1, gt=0, description="M's fine-tuning learning rate (SGD, no momentum)")
        adapt_projection_lr: float = Field(
            0.05, gt=0, description="P's fine-tuning learning rate (SGD, train.momentum and train.weight_decay)"
        )

        @field_validator(*sorted(ADAPT_OPTIONS))
        @classmethod
        def _read_by_the_adaptation(cls, value: float, info: ValidationInfo) -> float:
            # given (a default is not validated) beside the generic fine-tuning: a measurement believed made
            if info.data.get("adaptation") is False:
                raise ValueError(
                    "read only by the local adaptation, which adaptation: false turns off; remove it, or set "
                    "adaptation: true"
                )
            return value

    personal_options = ADAPT_OPTIONS | {"adaptation"}

    def fine_tunes(self) -> bool:
        return not self.params.adaptation  # the local adaptation reads train's work and its own options

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        classes = model.num_classes
        dim = self.params.etf_dim or classes
        if dim < classes:
            raise ConfigError(
                f"strategy.etf_dim = {dim}: below the dataset's {classes} classes; "
                f"the ETF's orthonormal basis needs etf_dim >= {classes}"
            )
        if classes < 2:
            raise ConfigError(f"strategy: fedetf needs at least 2 classes for a simplex ETF, the dataset has {classes}")
        width = model.classifier.in_features
        model.classifier = ETFClassifier(width, simplex_etf(dim, classes, seed), self.params.scale)
        return model

    def server(self, setup: ServerSetup) -> PartialAveraging:
        return PartialAveraging(**EVERY_NODE)
