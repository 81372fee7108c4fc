"""The harness the strategies' maths tests share: a strategy's server half driven through fedsim's own
``LocalGrid`` with a stand-in executor playing the clients, as fedsim's round loop does, and one client's
round as a worker runs it; tiny models, data and streams."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.arrays import array_view
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, TrainResult, train_local
from fedsim.data.batches import BatchStream
from fedsim.engines.local import LocalGrid, node_id_of
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies import STRATEGIES
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import ServerSetup

Respond = Callable[[Message, int, RecordDict], RecordDict]



def train_one(model, stream, optimizer, hooks, info) -> TrainResult:  # type: ignore[no-untyped-def]
    """One client's round through the one training loop."""
    return train_local([ClientRound(model, hooks, stream, info)], optimizer)[0]


# --- harness -----------------------------------------------------------------------------------


class Clients:
    """A LocalGrid executor whose "ClientApp" is ``respond(message, partition id, its state)``."""

    def __init__(self, respond: Respond, num_clients: int) -> None:
        self.respond = respond
        self.states = {p: RecordDict() for p in range(num_clients)}

    def node_ids(self) -> list[int]:
        return [node_id_of(p) for p in self.states]

    def execute(self, messages: list[Message], timeout: float | None = None) -> list[Message]:
        replies = []
        for m in messages:
            pid = m.metadata.dst_node_id - 1
            replies.append(Message(self.respond(m, pid, self.states[pid]), reply_to=m))
        return replies

    def shutdown(self) -> None:
        pass


def server(name: str, num_clients: int, parameter_keys: set[str], **options):  # type: ignore[no-untyped-def]
    """The strategy's server half, as fedsim's round loop builds it."""
    s = STRATEGIES.get(name)
    return s(s.Params(**options)).server(ServerSetup(num_clients, frozenset(parameter_keys)))


def play_round(strategy, grid: LocalGrid, server_round: int, arrays: ArrayRecord, sampler=None) -> ArrayRecord:  # type: ignore[no-untyped-def]
    """One round as fedsim's loop plays it: the sampled nodes' messages, replies sorted by partition."""
    messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
    if sampler is not None:
        chosen = {node_id_of(p) for p in sampler.sample(server_round)}
        messages = [m for m in messages if m.metadata.dst_node_id in chosen]
    replies = sorted(grid.send_and_receive(messages), key=wire.partition_of)
    new, _ = strategy.aggregate_train(server_round, replies)
    return new


def client_round(  # type: ignore[no-untyped-def]
    net, hooks: ClientHooks, msg: Message, state: RecordDict, info: RoundInfo, stream, weight_decay: float
) -> tuple[ArrayRecord, RecordDict | None]:
    """One client's round as a worker runs it: the strategy's hooks around the one training loop, SGD at the
    round's learning rate and momentum; the arrays it sends and the record beside them."""
    hooks.load_global(net, msg.content[wire.ARRAYS], state)
    hooks.begin_round(net, msg.content, state, info)
    sgd = LocalSgd(net.parameters(), lr=info.lr, momentum=info.momentum, weight_decay=weight_decay)
    result = train_one(net, stream, sgd, hooks, info)
    extra = hooks.end_round(net, state, info, result.steps)
    return hooks.reply_arrays(net, state), extra


def reply(arrays: ArrayRecord, pid: int, n: int, extra: RecordDict | None = None) -> RecordDict:
    content = RecordDict(dict(extra or {}))
    content[wire.ARRAYS] = arrays
    content[wire.METRICS] = MetricRecord({wire.NUM_EXAMPLES: n, wire.PARTITION_ID: pid, wire.TRAIN_LOSS: 0.0})
    return content


def numpy_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: np.array(array_view(a), dtype=np.float64) for k, a in record.items()}


def spec(name: str, **options):  # type: ignore[no-untyped-def]
    """The strategy spec, built from its options as the config does."""
    s = STRATEGIES.get(name)
    return s(s.Params(**options))


def info(counts: list[int], lr: float = 0.1, steps: int = 1, pid: int = 0, server_round: int = 1) -> RoundInfo:
    return RoundInfo(server_round, pid, steps, None, lr, 0.0, torch.tensor(counts))


def stream(x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> BatchStream:
    return BatchStream(x, y, batch_size or len(y), torch.Generator().manual_seed(0))


def mlp(norm: str = "ln", in_shape=(1, 2, 2), classes: int = 3, **args) -> FedsimModel:
    return create_model("mlp", classes, in_shape, create_norm(norm), {"hidden": [4], **args})


def images(n: int, in_shape=(1, 2, 2)) -> torch.Tensor:
    return torch.randint(0, 256, (n, *in_shape), dtype=torch.uint8)



def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


