"""fedsim's ServerApp / ClientApp protocol (docs/protocol.md): an app that does not speak it is named,
with the key it lacks, instead of failing with a bare KeyError somewhere in a round."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.client.app import app as fedsim_client
from fedsim.client.app import partition_reply, query_partition
from fedsim.config_file import parse_config
from fedsim.engines.local import InlineExecutor, LocalGrid, node_context
from fedsim.errors import ProtocolError
from fedsim.experiment.resolve import resolve
from fedsim.server.loop import run_server
from tests.conftest import small_config


def stock_flower_client(with_partition_query: bool, train_keys: set[str]) -> ClientApp:
    """A Flower ClientApp as a Flower user writes one: it sends the model back with the ``train_keys`` of
    fedsim's train reply."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config[wire.PARTITION_ID])
        known = {wire.NUM_EXAMPLES: 10, wire.TRAIN_LOSS: 0.5, wire.PARTITION_ID: pid}
        metrics = MetricRecord({k: v for k, v in known.items() if k in train_keys})
        return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)

    if with_partition_query:
        app.query("partition")(query_partition)  # fedsim's answer: the node's partition and its data's fingerprint
    return app


def serve(tmp_path: Path, client: ClientApp) -> None:
    experiment = resolve(parse_config(small_config(tmp_path, train={"rounds": 1})))
    run_server(LocalGrid(InlineExecutor(client, run_id=1, num_partitions=4, state_memory_mb=64)), experiment)


def test_a_stock_flower_client_app_is_refused_before_round_one(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError) as err:
        serve(tmp_path, stock_flower_client(False, {wire.NUM_EXAMPLES}))
    message = str(err.value)
    assert "does not run fedsim's ClientApp" in message and "'query.partition'" in message
    assert "docs/protocol.md" in message and "train-loss" in message and "fedsim.deploy.clientapp:app" in message
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


def test_a_partition_answer_without_the_data_fingerprint_names_the_key_and_the_node(tmp_path: Path) -> None:
    app = ClientApp()
    app.query("partition")(partition_reply)  # a fedsim before data fingerprints answered with the partition alone
    with pytest.raises(ProtocolError) as err:
        serve(tmp_path, app)
    assert str(err.value).startswith("node 1: its 'query.partition' reply has no ConfigRecord 'config' (it has ")
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


@pytest.mark.parametrize("missing", [wire.PARTITION_ID, wire.TRAIN_LOSS])
def test_a_reply_without_a_key_names_the_key_and_the_node(tmp_path: Path, missing: str) -> None:
    keys = {wire.NUM_EXAMPLES, wire.TRAIN_LOSS, wire.PARTITION_ID} - {missing}
    with pytest.raises(ProtocolError, match=rf"^node \d+: its 'train' reply's 'metrics' record has no '{missing}'"):
        serve(tmp_path, stock_flower_client(True, keys))


def test_fedsims_client_names_what_a_message_or_its_node_lacks() -> None:
    # the identity messages are sent under
    LocalGrid(InlineExecutor(fedsim_client, run_id=1, num_partitions=1, state_memory_mb=64))
    bare = Message(RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 1})}), dst_node_id=1, message_type="train")
    with pytest.raises(ProtocolError, match=r"'train' message has no 'fedsim-config'.*fedsim's ServerApp"):
        fedsim_client(bare, node_context(1, 0, 1))
    no_partition = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    query = Message(RecordDict(), dst_node_id=7, message_type=wire.QUERY_PARTITION)
    with pytest.raises(ProtocolError, match=r"node 7: its node config has no 'partition-id'.*--node-config"):
        fedsim_client(query, no_partition)
    with pytest.raises(ProtocolError, match=r"'query.partition' message has no 'fedsim-config'.*fedsim's ServerApp"):
        fedsim_client(query, node_context(1, 0, 1))  # the node reads the run's data to answer
