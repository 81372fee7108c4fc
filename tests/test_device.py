"""GPU-correct without a GPU: the training loop, every strategy's client hooks, several clients trained
together (vmap) and evaluation run with the model and data on PyTorch's ``meta`` device (shapes, no
values) under a dispatch mode that fails any operation mixing that device with host tensors, as CUDA
does. Only explicit transfers (``copy_``, ``to``) may cross, and reads back to the host are counted:
the loop reads its losses once per round, evaluation its sums once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.client.vectorized import StackedForward
from fedsim.models import FedsimModel, create_model
from fedsim.models.evaluation import evaluate
from fedsim.norms import create_norm
from fedsim.strategies import STRATEGIES
from fedsim.strategies.fedprox import PROXIMAL_MU
from fedsim.strategies.hooks import RoundInfo
from fedsim.strategies.scaffold import SCAFFOLD_C

DEVICE = torch.device("meta")
TRANSFERS = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class OneDevice(TorchDispatchMode):
    """Fails an op whose tensors sit on two devices (a 0-d host scalar aside, as CUDA allows), and stands in
    for the values of reads back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        devices = {
            t.device.type for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)
        }  # fmt: skip
        if len(devices) > 1 and func not in TRANSFERS:
            raise AssertionError(f"{func} mixes devices {sorted(devices)}")
        if func is torch.ops.aten._local_scalar_dense.default:  # .item(), float(): a read from the device
            self.reads += 1
            return 0
        target = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and args[0].device == DEVICE and target not in (None, DEVICE):
            self.reads += 1
            return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        return func(*args, **kwargs)


class DeviceStream:
    """Batches already on the device, as ClientRuntime's one-time move leaves a client's slice."""

    batch_size = 4

    def __init__(self) -> None:
        self.x = torch.empty(8, 3, 32, 32, device=DEVICE)
        self.num_samples = 8

    def batches(self, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(k):
            yield torch.empty(4, 3, 32, 32, device=DEVICE), torch.zeros(4, dtype=torch.long, device=DEVICE)


def model_on_device(norm: str = "ln") -> FedsimModel:
    return create_model("cnn", 10, (3, 32, 32), create_norm(norm)).to(DEVICE)


def server_content(model: FedsimModel) -> RecordDict:
    """What a round's train message carries beside the model (every strategy's records)."""
    zeros = {n: torch.zeros_like(p, device="cpu") for n, p in model.named_parameters()}
    return RecordDict({wire.CONFIG: ConfigRecord({PROXIMAL_MU: 0.1}), SCAFFOLD_C: to_array_record(zeros)})


def client_round(name: str, model: FedsimModel, state: RecordDict) -> ClientRound:
    spec = STRATEGIES.get(name)
    hooks = spec(spec.Params()).client()
    info = RoundInfo(1, 0, 3, None, 0.1, 0.0, torch.tensor([5, 3] + [0] * 8))  # class counts live on the host
    host_weights = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()}
    hooks.load_global(model, to_array_record(host_weights), state)  # arrays arrive on the host
    hooks.begin_round(model, server_content(model), state, info)
    return ClientRound(model, hooks, DeviceStream(), info)


@pytest.mark.parametrize("name", sorted(e.name for e in STRATEGIES))
def test_one_client_trains_with_every_tensor_on_its_device(name: str) -> None:
    model, state = model_on_device("bn" if name == "fedbn" else "ln"), RecordDict()
    with OneDevice() as mode:
        work = client_round(name, model, state)
        (result,) = train_local([work], LocalSgd(model.parameters(), lr=0.1, momentum=0.9))
        reads = mode.reads
        work.hooks.end_round(model, state, work.info, result.steps)
        reply = work.hooks.reply_arrays(model, state)
    assert result.steps == 3 and reads == 1  # the round's losses, once
    assert isinstance(reply, ArrayRecord) and len(reply)


def test_clients_trained_together_keep_every_tensor_on_their_device() -> None:
    models = [model_on_device() for _ in range(3)]
    with OneDevice() as mode:
        rounds = [client_round("scaffold", m, RecordDict()) for m in models]
        params = [p for m in models for p in m.parameters()]
        results = train_local(rounds, LocalSgd(params, lr=0.1), StackedForward(models))
    assert [r.steps for r in results] == [3, 3, 3] and mode.reads == 1


def test_evaluation_sums_on_the_device_and_reads_once() -> None:
    model = model_on_device()
    x, y = torch.empty(10, 3, 32, 32, device=DEVICE), torch.zeros(10, dtype=torch.long, device=DEVICE)
    with OneDevice() as mode:
        evaluate(model, x, y, 4, 10, lambda batch: batch)
    assert mode.reads == 3  # the loss sum, the per-class counts and totals: once each, not per batch


def test_the_check_catches_a_host_accumulator() -> None:
    """The bug this file exists for: a loss total kept on the host while the losses are on the device."""
    loss = torch.empty(3, device=DEVICE)
    with OneDevice(), pytest.raises(AssertionError, match="mixes devices"):
        total = torch.zeros(3)
        total += loss
