"""The one local training loop, and the hooks through which strategies change it.

Every strategy, normaliser and engine trains through :func:`train_local`, one client at a time or
several at once (``simulation.vmap_clients``). An algorithm's client half is a :class:`ClientHooks`
subclass overriding only what differs from FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict

from fedsim.arrays import copy_into, to_array_record
from fedsim.data.batches import BatchStream
from fedsim.models import FedsimModel


@dataclass(frozen=True)
class RoundInfo:
    """What a client knows about the round it is training in."""

    server_round: int
    partition_id: int
    local_steps: int
    local_epochs: int | None
    lr: float
    class_counts: torch.Tensor  # this client's training samples per class (FedLC, FedRS)


class ClientHooks:
    """Client half of a strategy. The defaults are FedAvg; override only what differs.

    Call order per round: ``load_global`` -> ``begin_round`` -> K x (``adjust_logits``,
    ``extra_loss``, backward, ``correct_gradients``, SGD step) -> ``end_round`` -> ``reply_arrays``.
    ``state`` is the client's own persistent RecordDict (Flower's ``Context.state``): client state
    that crosses rounds lives there, never on the server.
    """

    def __init__(self, params: object) -> None:
        self.params = params

    def load_global(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        load_arrays(model, arrays)

    def load_for_eval(self, model: FedsimModel, arrays: ArrayRecord, state: RecordDict) -> None:
        """The model a client is scored with: by default the one it would train from."""
        self.load_global(model, arrays, state)

    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        """Read what the server sent beside the model (e.g. SCAFFOLD's c)."""

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits

    def extra_loss(
        self, model: FedsimModel, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor | None:
        return None

    def correct_gradients(self, model: FedsimModel) -> None:
        """Change ``p.grad`` in place before the optimiser step (e.g. SCAFFOLD)."""

    def end_round(self, model: FedsimModel, state: RecordDict, info: RoundInfo, steps: int) -> RecordDict:
        """Update client state after local work; return extra records for the reply."""
        return RecordDict()

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        return dump_arrays(model)


def load_arrays(model: torch.nn.Module, arrays: ArrayRecord, skip: frozenset[str] = frozenset()) -> None:
    """Copy arrays into the model's own tensors (no new model, no new tensors kept)."""
    copy_into(model.state_dict(), arrays, skip)


def dump_arrays(model: torch.nn.Module, skip: frozenset[str] = frozenset()) -> ArrayRecord:
    return to_array_record({k: v for k, v in model.state_dict().items() if k not in skip})


@dataclass(frozen=True)
class TrainResult:
    num_examples: int
    steps: int
    mean_loss: float


@dataclass(frozen=True)
class Lane:
    """One client's local work in a round: its model, its strategy hooks, its batches."""

    model: FedsimModel
    hooks: ClientHooks
    stream: BatchStream
    info: RoundInfo

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = self.info
        return self.stream.epochs(info.local_epochs) if info.local_epochs else self.stream.batches(info.local_steps)


# The lanes' inputs of one step -> each lane's (features, logits), indexable by lane
Forward = Callable[[list[torch.Tensor]], tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]]


def client_loss(lane: Lane, features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A client's training loss on one batch: cross-entropy of the hooks' logits plus the hooks' extra term."""
    logits = lane.hooks.adjust_logits(logits, lane.info)
    loss = F.cross_entropy(logits, y)
    extra = lane.hooks.extra_loss(lane.model, features, logits, y)
    return loss if extra is None else loss + extra


def own_forward(model: FedsimModel) -> Forward:
    """One lane through its model's own forward."""

    def forward(xs: list[torch.Tensor]) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
        features = model.forward_features(xs[0])
        return (features,), (model.forward_head(features),)

    return forward


def train_local(
    lanes: Sequence[Lane], optimizer: torch.optim.Optimizer, forward: Forward | None = None
) -> list[TrainResult]:
    """Run the round's local work of every lane: K mini-batch steps (or whole epochs) of SGD with the hooks.

    One lane is one client on its model's own forward. Several lanes train together when ``forward``
    computes all of them at once (fedsim.vectorized: vmap over their stacked parameters): their
    losses are summed and share no parameter, so every lane's gradient, hooks and SGD update are its
    own; ``optimizer`` holds every lane's parameters. Lanes training together take equal step counts.
    """
    if forward is None:
        (only,) = lanes
        forward = own_forward(only.model)
    for lane in lanes:
        lane.model.train()
    optimizer.state.clear()  # momentum must not leak from the previous round or another client
    totals, steps = torch.zeros(len(lanes), device=lanes[0].stream.x.device), 0  # summed where the losses are
    for batch in zip(*(lane.batches() for lane in lanes), strict=True):
        features, logits = forward([x for x, _ in batch])
        ys = [y for _, y in batch]
        losses = torch.stack([client_loss(lane, features[i], logits[i], ys[i]) for i, lane in enumerate(lanes)])
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        for lane in lanes:
            lane.hooks.correct_gradients(lane.model)
        optimizer.step()
        totals += losses.detach()
        steps += 1
    # a NaN / inf loss is reported, not raised: the server stops the run whatever its failure policy
    return [
        TrainResult(num_examples=steps * lane.stream.batch_size, steps=steps, mean_loss=float(total) / max(steps, 1))
        for lane, total in zip(lanes, totals, strict=True)
    ]


@torch.no_grad()
def evaluate(
    model: FedsimModel, x: torch.Tensor, y: torch.Tensor, batch_size: int, num_classes: int, prepare
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Loss sum, per-class correct counts and per-class totals of ``model`` on (x, y)."""
    model.eval()
    loss = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros(num_classes, dtype=torch.int64)
    for start in range(0, len(y), batch_size):
        xb, yb = prepare(x[start : start + batch_size]), y[start : start + batch_size]
        logits = model(xb)
        loss += F.cross_entropy(logits, yb, reduction="sum").double().cpu()
        hit = logits.argmax(1) == yb
        correct += torch.bincount(yb[hit].cpu(), minlength=num_classes)
    totals = torch.bincount(y.cpu(), minlength=num_classes)
    return float(loss), correct, totals
