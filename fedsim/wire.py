"""fedsim's protocol: the messages, records and keys its ServerApp and ClientApp exchange.

One place for every key of the core, so the server and client halves cannot drift apart; :data:`PROTOCOL`
lists them all. A strategy's own records and keys are declared in its file, as :class:`Key` rows of its
``StrategySpec.protocol`` (``fedsim.strategies.base``, which refuses a row that reuses a name of the core's),
and ``docs/protocol.md`` renders the core's rows and each built-in strategy's (:func:`protocol_markdown`;
``python docs/gen_protocol.py > docs/protocol.md``; a test keeps the two equal). The readers at the end are how
either side reads a key it needs: a missing one is a :class:`~fedsim.errors.ProtocolError` naming the key, the
message and the node, not a ``KeyError``.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Context, Error, Message

from fedsim.errors import PluginExit, ProtocolError

CLIENT_APP_RAISED_EXCEPTION = 1  # Flower's ErrorCode of that name
CLIENT_APP_CRASHED = 8  # Flower's ErrorCode of that name: the process running the ClientApp is gone

ARRAYS = "arrays"  # the model's ArrayRecord (Flower's default key, kept so Flower strategies work)
CONFIG = "config"  # the per-round ConfigRecord (Flower's default key)
METRICS = "metrics"  # the reply's MetricRecord

# ConfigRecord entries
SERVER_ROUND = "server-round"  # set by Flower's strategies too
RUN_CONFIG = "fedsim-config"  # the RunConfig as JSON: clients need no files of their own
RESUME = "fedsim-resume"  # a run config entry, in no message: the ServerApp goes on from the run dir's checkpoint
DATA_SHA256 = "data-sha256"  # a node's answer to QUERY_PARTITION: the fingerprint of its data (fedsim.data.fingerprint)

# MetricRecord entries
NUM_EXAMPLES = "num-examples"  # Flower's default weighting key
PARTITION_ID = "partition-id"  # also the node_config key Flower's simulation and SuperNodes use
NUM_PARTITIONS = "num-partitions"  # node_config: how many partitions there are (Flower's name)
TRAIN_LOSS = "train-loss"
CORRECT = "correct"
EVAL_LOSS = "eval-loss"
PERSONAL_CORRECT = "personal-correct"  # eval.personal: test samples the client's personalised model got right

# Message types (Flower's "train" and "evaluate", and fedsim's queries)
TRAIN = "train"
EVALUATE = "evaluate"
QUERY_PARTITION = "query.partition"  # asks a node which partition and which data it holds
SAVE_STATE = "query.save_state"  # a checkpoint: write your Context.state of round STATE_ROUND
LOAD_STATE = "query.load_state"  # a resumed run: load your newest state of a round <= STATE_ROUND
FEATURE_STATS = "query.feature_stats"  # per-class statistics of your training features under this model

# ConfigRecord entries of SAVE_STATE / LOAD_STATE (fedsim.server.checkpoint, fedsim.client.state)
STATE_ROUND = "state-round"
STATE_KEEP = "state-keep"  # the last committed checkpoint's round: its state file must survive pruning
STATE_DIR = "state-dir"  # the server's default directory; a node_config entry of this name overrides it
RUN_KEY = "run-key"  # one run's subdirectory of the state directory: "<run dir name>-<random>"
STATE_SHA256 = "state-sha256"  # a node's answer: the SHA-256 of the state file it wrote or read ("" if none)

# FEATURE_STATS's reply: an ArrayRecord of the per-class statistics of the classifier's input over the client's
# training samples, in float64 (the features themselves never leave the client)
FEATURES = "feature-stats"
CLASS_COUNTS = "counts"  # (K,) samples per class
CLASS_MEANS = "means"  # (K, d) each class's mean feature (0 for a class the client lacks)
CLASS_COVARIANCES = "covariances"  # (K, d, d) each class's unbiased covariance (0 for fewer than 2 samples)

# Records of the core's own beside the model (a strategy's records: its StrategySpec.protocol)
PACKED = "fedsim.packed"  # ConfigRecord, between processes only: packed ArrayRecords' layout (fedsim.deploy.packing)
CLIENT_STATE = "Context.state"  # a row's message for a record a client keeps between rounds (SAVE_STATE saves it)
DELIVERY = "fedsim.delivery"  # ConfigRecord on every message to a node: what the server kept of its replies
ACCEPTED_ROUND = "accepted-round"  # the last round whose training reply from the node the server aggregated
PENDING = "fedsim.pending"  # Context.state, under on_client_failure: skip: a round's state changes held
PENDING_RECORD = "fedsim.pending:"  # Context.state: the prefix of a held record's name (fedsim.client.pending)
STATE_SEP = "/"  # server_state() keys are "<slot>/<tensor name>", e.g. "v_t/fc.weight"


@dataclass(frozen=True)
class Key:
    """One entry of the protocol: where it travels, in which record, and what it holds."""

    message: str  # message type, "node config", "run config", or CLIENT_STATE (kept by the client, never sent)
    direction: str  # "server → client", "client → server", "node", "client"
    record: str  # record name (ArrayRecord / ConfigRecord / MetricRecord) or "node_config"
    key: str  # the entry ("*" for every tensor of an ArrayRecord)
    kind: str
    meaning: str


def delivery_row(message: str) -> Key:
    """The row of the delivery record every message of ``message``'s type carries to a node."""
    return Key(
        message, "server → client", DELIVERY, ACCEPTED_ROUND, "int",
        "the last round whose training reply from this node the server aggregated (0: none)",
    )  # fmt: skip


def model_rows(message: str, model: str) -> tuple[Key, ...]:
    """The rows of a message that carries a model to a node (``model``: which one), its round and the run config."""
    return (
        Key(message, "server → client", ARRAYS, "*", "ArrayRecord", model),
        Key(message, "server → client", CONFIG, SERVER_ROUND, "int", "the round"),
        Key(message, "server → client", CONFIG, RUN_CONFIG, "str", "the run's config as JSON"),
        delivery_row(message),
    )


PROTOCOL: tuple[Key, ...] = (
    Key("node config", "node", "node_config", PARTITION_ID, "int", "the partition this node holds (required)"),
    Key("node config", "node", "node_config", NUM_PARTITIONS, "int", "how many partitions the federation has"),
    Key("node config", "node", "node_config", STATE_DIR, "str", "where this node keeps client state (optional)"),
    Key("run config", "launcher → server", "run_config", RUN_CONFIG, "str", "the run's config as JSON"),
    Key("run config", "launcher → server", "run_config", RESUME, "bool", "go on from the run dir's checkpoint"),
    Key(QUERY_PARTITION, "server → client", CONFIG, RUN_CONFIG, "str", "the run's config as JSON"),
    Key(QUERY_PARTITION, "client → server", METRICS, PARTITION_ID, "int", "the node's partition id"),
    Key(QUERY_PARTITION, "client → server", CONFIG, DATA_SHA256, "str", "SHA-256 of the data the node read (hex)"),
    *model_rows(TRAIN, "the global model's state dict"),
    Key(TRAIN, "client → server", ARRAYS, "*", "ArrayRecord", "the model after local training (FedBN: no norms)"),
    Key(TRAIN, "client → server", METRICS, NUM_EXAMPLES, "int", "samples trained on (the averaging weight)"),
    Key(TRAIN, "client → server", METRICS, TRAIN_LOSS, "float", "mean training loss over the local steps"),
    Key(TRAIN, "client → server", METRICS, PARTITION_ID, "int", "who answered"),
    *model_rows(EVALUATE, "the global model's state dict"),
    Key(EVALUATE, "client → server", METRICS, NUM_EXAMPLES, "int", "the client's test samples"),
    Key(EVALUATE, "client → server", METRICS, CORRECT, "int", "test samples classified correctly"),
    Key(EVALUATE, "client → server", METRICS, EVAL_LOSS, "float", "summed test loss"),
    Key(
        EVALUATE, "client → server", METRICS, PERSONAL_CORRECT, "int",
        "eval.personal on: test samples the client's personalised model classified correctly",
    ),  # fmt: skip
    Key(EVALUATE, "client → server", METRICS, PARTITION_ID, "int", "who answered"),
    Key(SAVE_STATE, "server → client", CONFIG, STATE_ROUND, "int", "the checkpoint's round"),
    Key(SAVE_STATE, "server → client", CONFIG, STATE_KEEP, "int", "the last committed checkpoint's round"),
    Key(SAVE_STATE, "server → client", CONFIG, STATE_DIR, "str", "the default state directory"),
    Key(SAVE_STATE, "server → client", CONFIG, RUN_KEY, "str", "this run's subdirectory"),
    delivery_row(SAVE_STATE),
    Key(SAVE_STATE, "client → server", METRICS, PARTITION_ID, "int", "who saved"),
    Key(SAVE_STATE, "client → server", CONFIG, STATE_SHA256, "str", 'SHA-256 of the file written (hex; "": no state)'),
    Key(LOAD_STATE, "server → client", CONFIG, STATE_ROUND, "int", "load the newest state of round <= this (0: none)"),
    Key(LOAD_STATE, "server → client", CONFIG, STATE_DIR, "str", "the default state directory"),
    Key(LOAD_STATE, "server → client", CONFIG, RUN_KEY, "str", "this run's subdirectory"),
    Key(LOAD_STATE, "client → server", METRICS, PARTITION_ID, "int", "who loaded"),
    Key(LOAD_STATE, "client → server", CONFIG, STATE_ROUND, "int", "the round of the file read (0: none)"),
    Key(LOAD_STATE, "client → server", CONFIG, STATE_SHA256, "str", 'SHA-256 of the file read (hex; "": none)'),
    Key(LOAD_STATE, "client → server", CONFIG, STATE_DIR, "str", "the directory it read from (for messages)"),
    *model_rows(FEATURE_STATS, "the model whose features are asked"),
    Key(FEATURE_STATS, "client → server", FEATURES, CLASS_COUNTS, "int64 (K,)", "training samples per class"),
    Key(FEATURE_STATS, "client → server", FEATURES, CLASS_MEANS, "float64 (K, d)", "each class's mean feature"),
    Key(
        FEATURE_STATS, "client → server", FEATURES, CLASS_COVARIANCES, "float64 (K, d, d)",
        "each class's unbiased feature covariance (0 below 2 samples)",
    ),  # fmt: skip
    Key(FEATURE_STATS, "client → server", METRICS, PARTITION_ID, "int", "who answered"),
    Key(CLIENT_STATE, "client", PENDING, SERVER_ROUND, "int", "on_client_failure: skip: the round of the held changes"),
    Key(
        CLIENT_STATE, "client", PENDING_RECORD, "<record name>", "any record",
        "held as fedsim.pending:<record name>: that round's new value, applied once the server aggregated its reply",
    ),  # fmt: skip
    Key("any", "both ways", PACKED, "<record name>", "str", "under a SuperLink: that ArrayRecord packed (JSON layout)"),
)

PLACEHOLDERS = frozenset({"*", "<record name>"})  # a row's key that stands for entries, not one name
CORE_RECORDS = frozenset(k.record for k in PROTOCOL)
CORE_NAMES = frozenset(name for k in PROTOCOL for name in (k.message, k.record, k.key)) - PLACEHOLDERS
"""Every name the core's protocol uses (message types, records, keys): a strategy's row may name none of them
as its own record or key (``fedsim.strategies.base.check_protocol``)."""


def protocol_markdown(strategies: Mapping[str, tuple[str, tuple[Key, ...]]]) -> str:
    """``docs/protocol.md``: the introduction, the table of :data:`PROTOCOL`, and a table per strategy that
    declares rows of its own (``strategies``: its registered name -> its summary and its rows)."""
    header = "| message | direction | record | key | type | meaning |\n|---|---|---|---|---|---|"

    def table(keys: tuple[Key, ...]) -> str:
        rows = (f"| `{k.message}` | {k.direction} | `{k.record}` | `{k.key}` | {k.kind} | {k.meaning} |" for k in keys)
        return "\n".join([header, *rows])

    sections = "\n\n".join(
        f"### `{name}`\n\n{summary}\n\n{table(keys)}" for name, (summary, keys) in sorted(strategies.items()) if keys
    )
    return f"""# fedsim's ServerApp / ClientApp protocol

Generated from `fedsim/wire.py` and each strategy's `protocol` (`python docs/gen_protocol.py > docs/protocol.md`;
a test keeps them equal).

A launcher (`fedsim deploy`, a compose project's `submit`) hands the ServerApp the run's config and
whether to resume it in Flower's run config. fedsim's ServerApp first sends every node a
`{QUERY_PARTITION}` message and maps partition ids to node ids from the replies (node ids are random
per run, partition ids are not). Each node reads the run's data to answer it, and a node whose data's
fingerprint is not the server's is refused before round 1 (fedsim's own engine, whose nodes share its
process, asks one). Each round the server sends `{TRAIN}` messages to the clients it sampled, and on
evaluation rounds `{EVALUATE}` messages to every client (with `eval.clients`, to a sample). Checkpoints
send `{SAVE_STATE}` to every node the run has sent anything and record the SHA-256 of each node's state
file in `checkpoint.pt`; a resumed run sends `{LOAD_STATE}` before its first round and refuses to go on
unless every node read the file the checkpoint recorded for it (a node the checkpoint recorded no state
for reads none; fedsim's own engine, whose nodes start with the run, tells only the recorded ones). A client
whose reply lacks a key below is reported by node and key; a ClientApp that has no `{QUERY_PARTITION}`
handler (a stock Flower ClientApp) is refused before round 1. Between the processes of a deployment each
ArrayRecord of several tensors travels packed into one Array, its layout in the ConfigRecord `{PACKED}`
(`fedsim/deploy/packing.py`: fewer objects for Flower to move one request at a time); both sides see the
records unpacked.

## The core

Every run, whatever its strategy.

{table(PROTOCOL)}

## Strategies

A strategy's own records and keys travel only under that strategy, beside the core's. Each is declared in
the strategy's file (`StrategySpec.protocol`), and none reuses a name of the core's. Rows of message
`{CLIENT_STATE}` are records a client keeps in its own state between rounds: never sent, written to the
node's state file by `{SAVE_STATE}` and read back by `{LOAD_STATE}`. A strategy not listed here sends only
the core's rows.

{sections}
"""


# --- reading what the protocol says is there ---------------------------------------------------


def reply_metric(msg: Message, key: str) -> int | float:
    """Entry ``key`` of a reply's ``metrics`` record; a reply without it names the node and the key."""
    return _reply_entry(msg, msg.content.metric_records, "MetricRecord", METRICS, key)  # type: ignore[return-value]


def _reply_entry(msg: Message, records: Mapping[str, Mapping[str, object]], kind: str, name: str, key: str) -> object:
    """Entry ``key`` of the reply's record ``name`` among its ``records`` (those of type ``kind``)."""
    node = msg.metadata.src_node_id
    message = msg.metadata.message_type
    record = records.get(name)
    if record is None:
        raise ProtocolError(
            f"node {node}: its {message!r} reply has no {kind} {name!r} (it has "
            f"{sorted(msg.content.keys())}); fedsim's ServerApp needs fedsim's ClientApp (docs/protocol.md)"
        )
    if key not in record:
        raise ProtocolError(
            f"node {node}: its {message!r} reply's {name!r} record has no {key!r} (it has {sorted(record)}); "
            "fedsim's ServerApp needs fedsim's ClientApp (docs/protocol.md)"
        )
    return record[key]


def partition_of(msg: Message) -> int:
    """The partition a reply comes from."""
    return int(reply_metric(msg, PARTITION_ID))


def reply_config(msg: Message, key: str) -> object:
    """Entry ``key`` of a reply's ``config`` record; a reply without it names the node and the key."""
    return _reply_entry(msg, msg.content.config_records, "ConfigRecord", CONFIG, key)


def data_sha256_of(msg: Message) -> str:
    """The fingerprint of the data a node read, from its answer to :data:`QUERY_PARTITION`."""
    return str(reply_config(msg, DATA_SHA256))


def run_config_json(msg: Message) -> str:
    """The RunConfig JSON a train, evaluate or partition query message carries."""
    config = msg.content.config_records.get(CONFIG)
    if config is None or RUN_CONFIG not in config:
        raise ProtocolError(
            f"the {msg.metadata.message_type!r} message has no {RUN_CONFIG!r} in its ConfigRecord {CONFIG!r}: "
            "fedsim's ClientApp runs under fedsim's ServerApp (docs/protocol.md)"
        )
    return str(config[RUN_CONFIG])


def node_partition(context: Context) -> int:
    """The partition id this node was started with."""
    if PARTITION_ID not in context.node_config:
        raise ProtocolError(
            f"node {context.node_id}: its node config has no {PARTITION_ID!r} (it has "
            f"{sorted(context.node_config)}); start each SuperNode with "
            f"--node-config '{PARTITION_ID}=<i> {NUM_PARTITIONS}=<N>'"
        )
    return int(context.node_config[PARTITION_ID])


def error_reply(message: Message, err: Exception) -> Message:
    """The reply to a message whose handling raised, as Flower's runtime makes it: one line, the error and
    where it was raised (the server's message names the client; a traceback would be noise there). A
    plugin's exit says where itself."""
    frame = None
    if err.__traceback__ is not None and not isinstance(err, PluginExit):
        frame = traceback.extract_tb(err.__traceback__)[-1]
    where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame is not None else ""
    return failure_reply(message, f"{type(err).__name__}: {err}{where}")


def failure_reply(message: Message, reason: str, code: int = CLIENT_APP_RAISED_EXCEPTION) -> Message:
    """The error reply to ``message``, saying why in one line (``reason`` with its whitespace collapsed)."""
    return Message(Error(code=code, reason=" ".join(reason.split())), reply_to=message)
