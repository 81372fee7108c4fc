"""What a worker keeps across rounds (fedsim.client.runtime): the runtime a run config builds, its clients' data
slices, model slots and optimisers, the seeded batches of a round, a train or evaluate Message served, and the
process's cache of runtimes. Real runtimes on the shipped MNIST subset; every expected number is computed here,
from the dataset and a model of the run's own, never by the runtime under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedsim import wire
from fedsim.arrays import array_view, load_arrays, to_array_record
from fedsim.client import runtime as runtime_module
from fedsim.client.runtime import ClientRuntime, config_of, prepare, round_seed, runtime_for
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream, to_float
from fedsim.engines.local import identify_as_server, node_context, node_id_of
from fedsim.experiment.resolve import resolve
from fedsim.layout import usable_cores
from fedsim.models import FedsimModel
from tests.conftest import small_config


@pytest.fixture(autouse=True)
def _server_identity() -> None:
    identify_as_server(1)  # Flower's Message() reads the sender's identity, as a grid sets it


def build(tmp_path: Path, **sections: Any) -> ClientRuntime:
    return ClientRuntime(resolve(parse_config(small_config(tmp_path, **sections))))


def global_model(rt: ClientRuntime, seed: int) -> ArrayRecord:
    """A global model of the run's architecture, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return to_array_record(rt.experiment.build_model().state_dict())


def message(rt: ClientRuntime, arrays: ArrayRecord, server_round: int, pid: int, kind: str = wire.TRAIN) -> Message:
    """A train or evaluate Message as fedsim's ServerApp sends it to partition ``pid``'s node."""
    config = ConfigRecord({wire.SERVER_ROUND: server_round, wire.RUN_CONFIG: rt.cfg.to_json()})
    content = RecordDict({wire.ARRAYS: arrays, wire.CONFIG: config})
    return Message(content, dst_node_id=node_id_of(pid), message_type=kind)


def model_with(rt: ClientRuntime, arrays: ArrayRecord) -> FedsimModel:
    """A model of the run built here, holding ``arrays``: the runtime's own model is not used."""
    model = rt.experiment.build_model()
    load_arrays(model, arrays)
    return model


def tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(array_view(a).copy()) for k, a in record.items()}


def train_slice(rt: ClientRuntime, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.from_numpy(rt.fed.partition.train[pid])
    return rt.fed.dataset.x_train[idx], rt.fed.dataset.y_train[idx]


def test_a_rounds_seed_depends_on_seed_round_and_partition_alone() -> None:
    # the seeds every recorded run's batches were drawn from: a change here changes every run's numbers
    assert round_seed(0, 1, 0) == 3964924996
    assert round_seed(0, 1, 1) == 901243215
    assert round_seed(1, 1, 0) == 1189033389
    assert round_seed(0, 2, 0) == 3141116543
    seeds = {round_seed(s, r, p) for s in range(3) for r in range(1, 4) for p in range(4)}
    assert len(seeds) == 36 and all(0 <= s < 2**32 for s in seeds)


def test_the_runtime_builds_the_runs_model_hooks_and_inputs(tmp_path: Path) -> None:
    rt = build(tmp_path, strategy={"name": "fedprox", "mu": 0.3}, data={"normalize": True})
    fresh = rt.experiment.build_model().state_dict()
    built = rt.model.state_dict()
    assert {k: v.shape for k, v in built.items()} == {k: v.shape for k, v in fresh.items()}
    assert rt.device == torch.device("cpu") and all(v.device.type == "cpu" for v in built.values())
    assert type(rt.hooks).__name__ == "FedProxClient" and rt.hooks.params.mu == 0.3
    assert rt.slot(0) == (rt.model, rt.hooks)
    # data.normalize: the train set's per-channel mean and std, which MNIST's are not (0, 1)
    mean, std = rt.to_inputs.stats  # type: ignore[misc]
    x = rt.fed.dataset.x_train.double() / 255
    assert mean.item() == pytest.approx(x.mean().item(), rel=1e-5)
    assert std.item() == pytest.approx(x.std().item(), rel=1e-4)
    assert build(tmp_path).to_inputs.stats is None


def test_a_cnn_on_the_cpu_is_made_channels_last(tmp_path: Path) -> None:
    rt = build(tmp_path, model={"name": "cnn", "hidden": [32]})
    # conv2 has 64 input channels: channels_last and the default layout differ (conv1's one channel does not)
    assert not rt.experiment.build_model().conv2.weight.is_contiguous(memory_format=torch.channels_last)
    assert rt.model.conv2.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_clients_data_is_its_partitions_slice_cut_once(tmp_path: Path) -> None:
    rt = build(tmp_path)
    ds, part = rt.fed.dataset, rt.fed.partition
    for pid in range(4):
        data = rt.data(pid)
        assert torch.equal(data.x_train, ds.x_train[part.train[pid]]) and data.x_train.dtype == torch.uint8
        assert torch.equal(data.y_train, ds.y_train[part.train[pid]])
        assert torch.equal(data.x_test, ds.x_test[part.test[pid]])
        assert torch.equal(data.y_test, ds.y_test[part.test[pid]])
        assert data.class_counts.tolist() == torch.bincount(data.y_train, minlength=10).tolist()
        assert data.class_counts.sum() == len(part.train[pid]) > 0
        assert rt.data(pid) is data  # kept, not cut again
    sizes = [len(rt.data(p).y_train) for p in range(4)]
    assert sizes == [1297, 1556, 1203, 944]  # dirichlet(0.5) of seed 0 over the 5,000 training images


def test_slots_beyond_the_first_are_copies_with_hooks_of_their_own(tmp_path: Path) -> None:
    rt = build(tmp_path)
    model2, hooks2 = rt.slot(2)
    model1, hooks1 = rt.slot(1)
    assert rt.slot(1) == (model1, hooks1) and rt.slot(2) == (model2, hooks2)  # made once
    models, hooks = [rt.model, model1, model2], [rt.hooks, hooks1, hooks2]
    assert len({id(m) for m in models}) == len({id(h) for h in hooks}) == 3
    assert len({type(h) for h in hooks}) == 1
    shapes = {k: v.shape for k, v in rt.model.state_dict().items()}
    for m in (model1, model2):
        assert {k: v.shape for k, v in m.state_dict().items()} == shapes
    pointers = [p.data_ptr() for m in models for p in m.parameters()]
    assert len(set(pointers)) == len(pointers)  # no parameter shared between slots


def test_one_optimiser_per_group_size_over_its_slots_parameters(tmp_path: Path) -> None:
    rt = build(tmp_path, train={"lr": 0.07, "momentum": 0.5, "weight_decay": 1e-3})
    one, two = rt.optimizer(1), rt.optimizer(2)
    assert rt.optimizer(1) is one and rt.optimizer(2) is two
    assert [id(p) for p in one.params] == [id(p) for p in rt.model.parameters()]
    assert [id(p) for p in two.params] == [id(p) for k in range(2) for p in rt.slot(k)[0].parameters()]
    assert (two.lr, two.momentum, two.weight_decay) == (0.07, 0.5, 1e-3)


def test_a_stream_is_the_clients_batches_drawn_from_its_seed(tmp_path: Path) -> None:
    rt = build(tmp_path, train={"batch_size": 8})
    x, y = train_slice(rt, 2)

    def drawn(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        stream = rt.stream(2, seed)
        assert stream.num_samples == len(y) == 1203 and stream.batch_size == 8
        return list(stream.batches(3))

    first = drawn(5)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, drawn(5), strict=True))
    assert not torch.equal(first[0][1], drawn(6)[0][1])
    # the batches of a BatchStream built here over the client's slice, from the same seed
    expected = list(BatchStream(x, y, 8, torch.Generator().manual_seed(5)).batches(3))
    for (xb, yb), (xe, ye) in zip(first, expected, strict=True):
        assert torch.equal(xb, xe) and torch.equal(yb, ye) and xb.dtype == torch.float32


def test_begin_loads_the_message_into_the_slot_and_seeds_the_round(tmp_path: Path) -> None:
    rt = build(tmp_path, train={"local_steps": 4, "lr": 0.02})
    arrays = global_model(rt, 11)
    work = rt.begin(1, message(rt, arrays, 3, pid=2), node_context(1, 2, 4))
    assert work.model is rt.slot(1)[0] and work.hooks is rt.slot(1)[1]
    for k, v in tensors(arrays).items():
        assert torch.equal(work.model.state_dict()[k], v), k
    info = work.info
    assert (info.server_round, info.partition_id, info.local_steps, info.local_epochs, info.lr) == (3, 2, 4, None, 0.02)
    assert torch.equal(info.class_counts, rt.data(2).class_counts)
    x, y = train_slice(rt, 2)
    expected = BatchStream(x, y, 16, torch.Generator().manual_seed(round_seed(0, 3, 2)))
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(work.batches(), expected.batches(4), strict=True)
    )


def test_training_replies_one_sgd_step_of_the_global_model_and_its_numbers(tmp_path: Path, one_thread: None) -> None:
    """One local step of plain SGD, computed here with autograd on a model of the run's own: the loss is the
    global model's on the client's first batch of the round, the reply the model one step on."""
    rt = build(tmp_path, train={"local_steps": 1, "lr": 0.5})
    arrays, pid, server_round = global_model(rt, 3), 1, 2
    msg = message(rt, arrays, server_round, pid)
    reply = rt.train(msg, node_context(1, pid, 4))

    model = model_with(rt, arrays)
    x, y = train_slice(rt, pid)
    ((xb, yb),) = BatchStream(x, y, 16, torch.Generator().manual_seed(round_seed(0, server_round, pid))).batches(1)
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    with torch.no_grad():
        expected = {k: p - 0.5 * p.grad for k, p in model.named_parameters()}

    metrics = reply.content[wire.METRICS]
    assert metrics[wire.NUM_EXAMPLES] == len(y) == 1556  # the client's samples: FedAvg's weight
    assert metrics[wire.PARTITION_ID] == pid
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(loss.item(), rel=1e-6)
    sent = tensors(reply.content.array_records[wire.ARRAYS])
    assert set(sent) == set(model.state_dict())
    for k, v in expected.items():
        torch.testing.assert_close(sent[k], v, rtol=1e-6, atol=1e-7)
        assert not torch.equal(sent[k], tensors(arrays)[k]), k  # every parameter moved
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


def test_training_a_message_gives_the_same_model_whatever_the_worker_did_before(
    tmp_path: Path, one_thread: None
) -> None:
    """Weights loaded anew, momentum cleared and a normaliser's noise and the batches seeded per client and round:
    a client's reply is the same from a fresh worker and from one that served another client first, whatever
    torch's global RNG holds."""
    norm = {"name": "ln_randomized", "sigma": 0.1}
    rt = build(tmp_path, model={"norm": norm}, train={"momentum": 0.9})
    arrays = global_model(rt, 0)

    def trained(worker: ClientRuntime, pid: int, server_round: int, rng: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(rng)
        reply = worker.train(message(worker, arrays, server_round, pid), node_context(1, pid, 4))
        return tensors(reply.content.array_records[wire.ARRAYS])

    alone = trained(rt, 0, 1, rng=1)
    other = ClientRuntime(rt.experiment)
    trained(other, 3, 1, rng=2)
    after = trained(other, 0, 1, rng=3)
    assert all(torch.equal(alone[k], after[k]) for k in alone)
    next_round = trained(other, 0, 2, rng=1)  # another round: other batches and noise
    assert not torch.equal(alone["classifier.weight"], next_round["classifier.weight"])


def test_evaluation_reports_the_clients_test_count_correct_and_summed_loss(tmp_path: Path) -> None:
    rt = build(tmp_path, eval={"batch_size": 64})
    arrays, pid = global_model(rt, 7), 3
    msg = message(rt, arrays, 2, pid, kind=wire.EVALUATE)
    reply = rt.evaluate(msg, node_context(1, pid, 4))

    model = model_with(rt, arrays).eval()
    idx = torch.from_numpy(rt.fed.partition.test[pid])
    x, y = rt.fed.dataset.x_test[idx], rt.fed.dataset.y_test[idx]
    with torch.no_grad():
        logits = model(to_float(x))
    metrics = reply.content[wire.METRICS]
    assert metrics[wire.NUM_EXAMPLES] == len(y) == 194
    assert metrics[wire.CORRECT] == int((logits.argmax(1) == y).sum())
    assert metrics[wire.EVAL_LOSS] == pytest.approx(F.cross_entropy(logits, y, reduction="sum").item(), rel=1e-5)
    assert metrics[wire.PARTITION_ID] == pid
    for k, v in tensors(arrays).items():  # the runtime's model now holds what it scored
        assert torch.equal(rt.model.state_dict()[k], v), k


def test_prepare_builds_one_runtime_per_run_config_and_keeps_the_last_two(tmp_path: Path) -> None:
    configs = [parse_config(small_config(tmp_path, name=f"r{k}")).to_json() for k in range(3)]
    prepare.cache_clear()
    try:
        first = prepare(configs[0])
        assert prepare(configs[0]) is first and first.cfg == config_of(configs[0])
        assert config_of(configs[0]) is config_of(configs[0]) and first.cfg.name == "r0"
        second = prepare(configs[1])
        assert second is not first and second.cfg.name == "r1"
        prepare(configs[2])  # a third run: the least recently used runtime goes
        assert prepare(configs[1]) is second
        again = prepare(configs[0])
        assert again is not first and again.cfg == first.cfg
        assert prepare.cache_info().misses == 4  # what a fork server reads as "runtimes this process built"
    finally:
        prepare.cache_clear()


@pytest.mark.parametrize(("threads", "num_cpus", "want"), [(2, 1, 2), ("auto", 1, 1), ("auto", 64, None)])
def test_runtime_for_serves_the_messages_run_with_its_threads(
    tmp_path: Path, one_thread: None, threads: int | str, num_cpus: int, want: int | None
) -> None:
    """``threads: auto`` in a client process: ``client_resources.num_cpus``, at most the cores it may run on."""
    sim = {"threads": threads, "client_resources": {"num_cpus": num_cpus}}
    cfg = parse_config(small_config(tmp_path, simulation=sim))
    content = RecordDict({wire.CONFIG: ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})})
    prepare.cache_clear()
    try:
        torch.set_num_threads(3)
        rt = runtime_for(Message(content, dst_node_id=1, message_type=wire.TRAIN))
        assert rt is runtime_module.prepare(cfg.to_json()) and rt.cfg == cfg
        assert torch.get_num_threads() == (want or usable_cores())
    finally:
        prepare.cache_clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_model_and_every_slice_live_on_the_device(tmp_path: Path) -> None:
    rt = build(tmp_path, model={"name": "cnn", "hidden": [32]}, simulation={"device": "cuda"})
    assert rt.device.type == "cuda" and all(p.is_cuda for p in rt.model.parameters())
    assert not rt.model.conv2.weight.is_contiguous(memory_format=torch.channels_last)  # a CPU-only choice
    data = rt.data(0)
    assert all(t.is_cuda for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    arrays = global_model(rt, 1)
    reply = rt.train(message(rt, arrays, 1, 0), node_context(1, 0, 4))
    sent = tensors(reply.content.array_records[wire.ARRAYS])  # back on the host, as Arrays
    assert np.isfinite(reply.content[wire.METRICS][wire.TRAIN_LOSS])
    assert set(sent) == set(tensors(arrays))
    assert not torch.equal(sent["classifier.weight"], tensors(arrays)["classifier.weight"])
