"""fedsim's ClientApp (fedsim/client/app.py): each message type of the protocol reaches its handler; the train,
evaluate and feature-statistics messages are served by the process's one runtime for the run the message names;
the queries answer the node's partition id (and the fingerprint of its data, or the state file it wrote or read),
checked here against the dataset, the files on disk and statistics computed here; and every handler runs as plugin
code, where an exit is an exception. Real messages on the shipped MNIST subset, through the app as Flower calls it."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.arrays import array_view
from fedsim.client import app as app_module
from fedsim.client.app import app, partition_reply, plugin_guarded
from fedsim.client.runtime import ClientRuntime, prepare
from fedsim.client.state import decode
from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.data import load_dataset
from fedsim.data.batches import to_float
from fedsim.data.fingerprint import fingerprint
from fedsim.engines.local import identify_as_server, node_context, node_id_of
from fedsim.errors import PluginExit
from fedsim.experiment.resolve import resolve
from fedsim.plugin_guard import _real_exit
from tests.conftest import MNIST_SMALL, small_config
from tests.test_client_runtime import global_model, model_with


@pytest.fixture(autouse=True)
def _server_identity() -> None:
    identify_as_server(1)  # Flower's Message() reads the sender's identity, as a grid sets it


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[RunConfig]:
    """The run's config; the process's runtimes cleared before and after (each test counts what it builds)."""
    prepare.cache_clear()
    yield parse_config(small_config(tmp_path))
    prepare.cache_clear()


def message(cfg: RunConfig, kind: str, pid: int, arrays: ArrayRecord | None = None, server_round: int = 2) -> Message:
    """A message of type ``kind`` to partition ``pid``'s node as fedsim's ServerApp sends it: the run config, the
    round and (train, evaluate, feature statistics) the global model."""
    content = RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: server_round, wire.RUN_CONFIG: cfg.to_json()})})
    if arrays is not None:
        content[wire.ARRAYS] = arrays
    return Message(content, dst_node_id=node_id_of(pid), message_type=kind)


def state_message(kind: str, pid: int, states: Path, state_round: int, keep: int = 0) -> Message:
    """A SAVE_STATE or LOAD_STATE query as a checkpoint or a resume sends it: no run config, no model."""
    ask = {wire.STATE_ROUND: state_round, wire.STATE_KEEP: keep, wire.STATE_DIR: str(states), wire.RUN_KEY: "k"}
    return Message(RecordDict({wire.CONFIG: ConfigRecord(ask)}), dst_node_id=node_id_of(pid), message_type=kind)


def tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(array_view(a).copy()) for k, a in record.items()}


def test_a_partition_reply_holds_the_nodes_partition_id_alone_in_reply_to_the_message() -> None:
    msg = Message(RecordDict(), dst_node_id=node_id_of(3), message_type=wire.QUERY_PARTITION)
    reply = partition_reply(msg, node_context(1, 3, 5))
    assert list(reply.content.keys()) == [wire.METRICS]
    assert dict(reply.content.metric_records[wire.METRICS]) == {wire.PARTITION_ID: 3}
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


@pytest.mark.parametrize("pid", [0, 2])
def test_the_partition_query_answers_the_partition_and_the_fingerprint_of_the_whole_dataset(
    cfg: RunConfig, pid: int
) -> None:
    msg = message(cfg, wire.QUERY_PARTITION, pid)
    reply = app(msg, node_context(1, pid, 4))
    assert sorted(reply.content.keys()) == [wire.CONFIG, wire.METRICS]
    assert dict(reply.content.metric_records[wire.METRICS]) == {wire.PARTITION_ID: pid}
    # the data the node read, all of it (not its slice): the same answer from every node of the run
    expected = fingerprint(load_dataset("npz", MNIST_SMALL))
    assert dict(reply.content.config_records[wire.CONFIG]) == {wire.DATA_SHA256: expected}
    assert len(expected) == 64 and int(expected, 16) >= 0
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


@pytest.mark.parametrize(
    ("kind", "method"),
    [(wire.TRAIN, "train"), (wire.EVALUATE, "evaluate"), (wire.FEATURE_STATS, "feature_stats")],
)
def test_model_messages_reach_the_runtime_of_the_run_they_name(
    cfg: RunConfig, one_thread: None, kind: str, method: str
) -> None:
    """The app's reply is the reply of a runtime of the run built here, to the same message, byte for byte."""
    arrays = global_model(ClientRuntime(resolve(cfg)), 5)
    msg = message(cfg, kind, 1, arrays)
    reply = app(msg, node_context(1, 1, 4))
    expected = getattr(ClientRuntime(resolve(cfg)), method)(msg, node_context(1, 1, 4))
    assert reply.content == expected.content
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    assert reply.content.metric_records[wire.METRICS][wire.PARTITION_ID] == 1


def test_one_runtime_serves_every_message_of_a_run(cfg: RunConfig, one_thread: None) -> None:
    arrays = global_model(ClientRuntime(resolve(cfg)), 5)
    for pid, kind in [(0, wire.QUERY_PARTITION), (0, wire.TRAIN), (3, wire.EVALUATE), (2, wire.FEATURE_STATS)]:
        app(message(cfg, kind, pid, None if kind == wire.QUERY_PARTITION else arrays), node_context(1, pid, 4))
    assert prepare.cache_info().misses == 1  # built by the first message, kept for the rest


def test_feature_statistics_are_of_the_nodes_training_slice_under_the_model_sent(
    cfg: RunConfig, one_thread: None
) -> None:
    rt = ClientRuntime(resolve(cfg))
    arrays, pid = global_model(rt, 9), 2
    reply = app(message(cfg, wire.FEATURE_STATS, pid, arrays), node_context(1, pid, 4))
    assert sorted(reply.content.keys()) == [wire.FEATURES, wire.METRICS]
    stats = tensors(reply.content.array_records[wire.FEATURES])

    idx = torch.from_numpy(rt.fed.partition.train[pid])
    x, y = rt.fed.dataset.x_train[idx], rt.fed.dataset.y_train[idx]
    model = model_with(rt, arrays).eval()
    with torch.no_grad():
        z = model.forward_features(to_float(x)).double()
    assert stats[wire.CLASS_COUNTS].tolist() == torch.bincount(y, minlength=10).tolist()
    assert stats[wire.CLASS_COUNTS].tolist() == rt.fed.train_counts[pid].tolist()
    assert stats[wire.CLASS_COUNTS][[5, 7]].tolist() == [0, 0]  # dirichlet(0.5) left client 2 without two classes
    assert stats[wire.CLASS_MEANS].shape == (10, 64) and stats[wire.CLASS_COVARIANCES].shape == (10, 64, 64)
    for c in range(10):
        zc = z[y == c]
        # float32 features, the reply's computed in forward chunks, these in one batch: a few float32 ulps (1.2e-7)
        # of features of order 1, summed in float64
        mean = zc.mean(0) if len(zc) else torch.zeros(64, dtype=torch.float64)  # a class it lacks: 0
        torch.testing.assert_close(stats[wire.CLASS_MEANS][c], mean, rtol=1e-6, atol=1e-6)
        expected = torch.cov(zc.T) if len(zc) > 1 else torch.zeros(64, 64, dtype=torch.float64)
        torch.testing.assert_close(stats[wire.CLASS_COVARIANCES][c], expected, rtol=1e-6, atol=1e-6)


def test_save_state_writes_the_nodes_state_and_answers_the_files_sha256_without_reading_data(tmp_path: Path) -> None:
    states = tmp_path / "run" / "client_state"
    state = RecordDict({"c": ArrayRecord({"w": torch.tensor([1.5, -2.0, 0.25])}), "n": ConfigRecord({"k": 7})})
    context = Context(1, node_id_of(2), {wire.PARTITION_ID: 2, wire.NUM_PARTITIONS: 4}, state, {})
    msg = state_message(wire.SAVE_STATE, 2, states, 3)
    reply = app(msg, context)  # the message names no run: the node answers from its Context.state alone
    written = (states / "partition-2" / "round-3.bin").read_bytes()
    assert [p.name for p in (states / "partition-2").iterdir()] == ["round-3.bin"]
    assert sorted(reply.content.keys()) == [wire.CONFIG, wire.METRICS]
    assert dict(reply.content.metric_records[wire.METRICS]) == {wire.PARTITION_ID: 2}
    assert dict(reply.content.config_records[wire.CONFIG]) == {wire.STATE_SHA256: hashlib.sha256(written).hexdigest()}
    saved = decode(written)
    assert sorted(saved.keys()) == ["c", "n"] and dict(saved.config_records["n"]) == {"k": 7}
    assert tensors(saved.array_records["c"])["w"].tolist() == [1.5, -2.0, 0.25]
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


def test_load_state_replaces_the_nodes_state_with_the_newest_file_up_to_the_round(tmp_path: Path) -> None:
    states = tmp_path / "run" / "client_state"
    node = {wire.PARTITION_ID: 1, wire.NUM_PARTITIONS: 4}

    def saved_at(server_round: int, keep: int, value: float) -> bytes:
        state = RecordDict({"c": ArrayRecord({"w": torch.full((2,), value)})})
        app(state_message(wire.SAVE_STATE, 1, states, server_round, keep), Context(1, 2, node, state, {}))
        return (states / "partition-1" / f"round-{server_round}.bin").read_bytes()

    round_2 = saved_at(2, 0, 2.0)
    saved_at(4, 2, 4.0)  # keeps round 2's file: the last committed checkpoint's
    context = Context(1, 2, node, RecordDict({"stale": ConfigRecord({"x": 1})}), {})
    reply = app(state_message(wire.LOAD_STATE, 1, states, 3), context)
    assert dict(reply.content.metric_records[wire.METRICS]) == {wire.PARTITION_ID: 1}
    assert dict(reply.content.config_records[wire.CONFIG]) == {
        wire.STATE_ROUND: 2,
        wire.STATE_SHA256: hashlib.sha256(round_2).hexdigest(),
        wire.STATE_DIR: str(states / "partition-1"),
    }
    assert list(context.state.keys()) == ["c"]  # the whole state replaced: nothing stale left
    assert tensors(context.state.array_records["c"])["w"].tolist() == [2.0, 2.0]

    reply = app(state_message(wire.LOAD_STATE, 1, states, 1), context)  # no file of a round <= 1: empty
    assert dict(reply.content.config_records[wire.CONFIG])[wire.STATE_ROUND] == 0
    assert dict(reply.content.config_records[wire.CONFIG])[wire.STATE_SHA256] == ""
    assert list(context.state.keys()) == []


def test_the_guard_passes_the_handlers_reply_through_and_restores_os_exit_after() -> None:
    msg = Message(RecordDict(), dst_node_id=1, message_type=wire.TRAIN)
    answer = Message(RecordDict({wire.METRICS: MetricRecord({"x": 1})}), reply_to=msg)
    seen: list[bool] = []

    def handler(m: Message, c: Context) -> Message:
        seen.append(m is msg and os._exit is not _real_exit)  # inside: os._exit is the guard's
        return answer

    assert plugin_guarded(msg, node_context(1, 0, 1), handler) is answer
    assert seen == [True] and os._exit is _real_exit


class Exits:
    """A runtime whose handlers end the process, as a plugin's code might."""

    def __init__(self, how: str) -> None:
        self.how = how

    def _exit(self, *args: Any) -> Message:
        if self.how == "sys.exit":
            sys.exit(3)
        assert os._exit is not _real_exit, "os._exit is not guarded: calling it would end pytest"
        os._exit(4)

    train = evaluate = feature_stats = _exit


@pytest.mark.parametrize(("how", "call"), [("sys.exit", "sys.exit(3)"), ("os._exit", "os._exit(4)")])
@pytest.mark.parametrize("kind", [wire.TRAIN, wire.EVALUATE, wire.FEATURE_STATS])
def test_an_exit_in_a_handler_is_a_plugin_exit_not_the_end_of_the_process(
    monkeypatch: pytest.MonkeyPatch, how: str, call: str, kind: str
) -> None:
    monkeypatch.setattr(app_module, "runtime_for", lambda msg: Exits(how))
    with pytest.raises(PluginExit) as err:
        app(Message(RecordDict(), dst_node_id=1, message_type=kind), node_context(1, 0, 1))
    assert call in str(err.value) and "Exits._exit" in str(err.value)
    assert os._exit is _real_exit


def test_a_message_type_outside_the_protocol_has_no_handler() -> None:
    msg = Message(RecordDict(), dst_node_id=1, message_type="query.weights")
    with pytest.raises(ValueError, match="'weights'"):
        app(msg, node_context(1, 0, 1))
