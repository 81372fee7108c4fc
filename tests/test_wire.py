"""fedsim's ServerApp / ClientApp protocol (docs/protocol.md): an app that does not speak it is named,
with the key it lacks, instead of failing with a bare KeyError somewhere in a round; each strategy's own keys
are declared once, in its file, and a plugin strategy's that reuse a name are refused when it is looked up."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.client.app import app as fedsim_client
from fedsim.client.app import partition_reply, query_partition
from fedsim.config_file import parse_config
from fedsim.engines.local import InlineExecutor, LocalGrid, node_context
from fedsim.errors import ConfigError, ProtocolError, RegistryError
from fedsim.experiment.resolve import resolve
from fedsim.server.loop import run_server
from fedsim.strategies import STRATEGIES, StrategySpec
from fedsim.strategies.base import declaring_class
from fedsim.strategies.scaffold import SCAFFOLD_C, ScaffoldSpec
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
    message = str(err.value)  # the message it did not answer, the keys, the app to run and the document
    assert "'query.partition'" in message and "train-loss" in message and "\n" not in message
    assert "docs/protocol.md" in message and "fedsim.deploy.clientapp:app" in message
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


def test_a_partition_answer_without_the_data_fingerprint_names_the_key_and_the_node(tmp_path: Path) -> None:
    app = ClientApp()
    app.query("partition")(partition_reply)  # a fedsim before data fingerprints answered with the partition alone
    with pytest.raises(ProtocolError) as err:
        serve(tmp_path, app)
    assert re.match(r"node 1\b.*'query\.partition'.*\bConfigRecord 'config'", str(err.value)), str(err.value)
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


@pytest.mark.parametrize("missing", [wire.PARTITION_ID, wire.TRAIN_LOSS])
def test_a_reply_without_a_key_names_the_key_and_the_node(tmp_path: Path, missing: str) -> None:
    keys = {wire.NUM_EXAMPLES, wire.TRAIN_LOSS, wire.PARTITION_ID} - {missing}
    with pytest.raises(ProtocolError, match=rf"^node \d+\b.*'train'.*'metrics'.*'{missing}'"):
        serve(tmp_path, stock_flower_client(True, keys))


def test_fedsims_client_names_what_a_message_or_its_node_lacks() -> None:
    # the identity messages are sent under
    LocalGrid(InlineExecutor(fedsim_client, run_id=1, num_partitions=1, state_memory_mb=64))
    bare = Message(RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 1})}), dst_node_id=1, message_type="train")
    with pytest.raises(ProtocolError, match=r"'train'.*'fedsim-config'.*\bServerApp\b"):
        fedsim_client(bare, node_context(1, 0, 1))
    no_partition = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    query = Message(RecordDict(), dst_node_id=7, message_type=wire.QUERY_PARTITION)
    with pytest.raises(ProtocolError, match=r"\bnode 7\b.*'partition-id'.*--node-config"):
        fedsim_client(query, no_partition)
    with pytest.raises(ProtocolError, match=r"'query\.partition'.*'fedsim-config'.*\bServerApp\b"):
        fedsim_client(query, node_context(1, 0, 1))  # the node reads the run's data to answer


# --- each strategy's own keys ------------------------------------------------------------------------


def test_no_key_is_declared_twice_across_the_core_and_the_strategies() -> None:
    declarations = {declaring_class(e.obj): e.name for e in STRATEGIES.builtins()}  # a subclass's rows are its base's
    rows = [(None, k) for k in wire.PROTOCOL] + [(name, k) for cls, name in declarations.items() for k in cls.protocol]
    # a row is (message, direction, record, key): the core itself sends `arrays` both ways
    counts = Counter((k.message, k.direction, k.record, k.key) for _, k in rows)
    assert not [where for where, n in counts.items() if n > 1]
    core_names = {name for k in wire.PROTOCOL for name in (k.message, k.record, k.key)} - {"*", "<record name>"}
    core_records = {k.record for k in wire.PROTOCOL}
    owners: dict[str, str] = {}  # a strategy's record, or its key in a record of the core's -> the strategy
    for owner, k in rows:
        if owner is not None:
            assert not (({k.record} - core_records) | ({k.key} - {"*"})) & core_names, (owner, k)
            named = k.key if k.record in core_records else k.record
            assert owners.setdefault(named, owner) == owner, (owner, k)
    # the moved keys are their strategies' now, spelled as they always were on the wire
    moved = ("fedprox", "scaffold", "fedbn")
    declared = {name: {(k.record, k.key) for k in STRATEGIES.get(name).protocol} for name in moved}
    assert declared == {
        "fedprox": {(wire.CONFIG, "proximal-mu")},
        "scaffold": {("scaffold.c", "*"), ("scaffold.delta-c", "*"), ("scaffold.c-i", "*")},
        "fedbn": {("fedbn.local", "*")},
    }
    assert not {"PROXIMAL_MU", "SCAFFOLD_C", "SCAFFOLD_DELTA_C", "SCAFFOLD_C_I", "FEDBN_LOCAL"} & set(vars(wire))


class SendsItsOwnRound(StrategySpec):
    """FedAvg that also sends a config entry named as the core's round (test plugin)."""

    protocol = (wire.Key(wire.TRAIN, "server → client", wire.CONFIG, wire.SERVER_ROUND, "int", "a round of its own"),)


class KeepsARecordCalledMetrics(StrategySpec):
    """FedAvg whose clients keep a record named as the core's metrics (test plugin)."""

    protocol = (wire.Key(wire.CLIENT_STATE, "client", wire.METRICS, "*", "ArrayRecord", "its own tensors"),)


class SendsScaffoldsC(StrategySpec):
    """FedAvg that sends a record named as SCAFFOLD's, declared anew (test plugin)."""

    protocol = (wire.Key(wire.TRAIN, "server → client", SCAFFOLD_C, "*", "ArrayRecord", "something else"),)


class ScaffoldWithAnotherName(ScaffoldSpec):
    """SCAFFOLD itself under a plugin's name: it inherits SCAFFOLD's rows, which are no one else's (test plugin)."""


class ScaffoldWithMore(ScaffoldSpec):
    """SCAFFOLD whose server also sends a record of its own: its base's rows and one more (test plugin)."""

    protocol = (*ScaffoldSpec.protocol, wire.Key(wire.TRAIN, "server → client", "more.h", "*", "ArrayRecord", "h"))


class SendsItsOwnRecord(StrategySpec):
    """FedAvg that sends a record of its own (test plugin)."""

    protocol = (wire.Key(wire.TRAIN, "server → client", "sends-its-own.x", "*", "ArrayRecord", "its own tensors"),)


class ProtocolOfStrings(StrategySpec):
    """A protocol written as names, not rows (test plugin)."""

    protocol = ("my.key",)  # type: ignore[assignment]


def strategy_error(tmp_path: Path, plugin: type) -> str:
    """The one-line error of a config that names ``plugin`` (by its dotted path) as its strategy."""
    cfg = parse_config(small_config(tmp_path, strategy={"name": f"{__name__}:{plugin.__name__}"}))
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    return str(err.value)


@pytest.mark.parametrize(
    ("plugin", "named"),
    [
        (SendsItsOwnRound, ("'server-round' (record 'config', message 'train')", "core protocol")),
        (KeepsARecordCalledMetrics, ("'*' (record 'metrics', message 'Context.state')", "core protocol")),
        (SendsScaffoldsC, ("'*' (record 'scaffold.c', message 'train')", "strategy 'scaffold'")),
        (ProtocolOfStrings, ("fedsim.wire.Key", "('my.key',)")),
    ],
)  # fmt: skip
def test_a_plugin_strategy_whose_key_collides_is_refused_in_one_line_naming_it(
    tmp_path: Path, plugin: type, named: tuple[str, ...]
) -> None:
    """The plugin, its key and the one it collides with are named (the wording: tests/test_bad_inputs.py)."""
    message = strategy_error(tmp_path, plugin)
    assert "\n" not in message
    assert message.startswith("strategy.name: ") and f"'{__name__}:{plugin.__name__}'" in message, message
    assert all(n in message for n in named), message
    # registered as a built-in or an installed entry point would be, it is refused the same way, and not added
    with pytest.raises(RegistryError, match=rf"'colliding'.*\b{__name__}:{plugin.__name__}\b"):
        STRATEGIES.register("colliding")(plugin)
    assert "colliding" not in STRATEGIES


def test_a_plugin_strategy_with_keys_of_its_own_or_inherited_is_accepted(tmp_path: Path) -> None:
    for plugin in (SendsItsOwnRecord, ScaffoldWithAnotherName, ScaffoldWithMore):
        cfg = parse_config(small_config(tmp_path, strategy={"name": f"{__name__}:{plugin.__name__}"}))
        assert type(resolve(cfg).strategy) is plugin
