"""A client node's own state across rounds, on disk for checkpoints (the server's side:
:mod:`fedsim.server.checkpoint`).

Every ``output.checkpoint_every`` rounds the server asks each node to write its ``Context.state``
(SCAFFOLD's c_i, FedBN's local tensors) and the node answers with the SHA-256 of the file it wrote,
which ``checkpoint.pt`` records; a resumed run asks each node to load its newest state of a round <=
the round the checkpoint recorded for it, and the node answers with that file's round and SHA-256, which
the server checks against its record (:mod:`fedsim.server.client_states`). Files:
``<state dir>/<run key>/partition-<pid>/round-<r>.bin`` (a Flower RecordDict as protobuf). The state dir
is ``RUN_DIR/client_state``, or the node config's ``state-dir`` for SuperNodes on hosts that do not
share the run directory; the run key keeps runs apart there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import ProtoRecordDict, recorddict_from_proto, recorddict_to_proto
from google.protobuf.message import DecodeError

from fedsim import wire
from fedsim.client.pending import replace_state, settle
from fedsim.errors import FedsimError
from fedsim.files import remove, write_file
from fedsim.reading import GIB, read_bytes

STATE_BYTES = 2 * GIB  # protobuf's own bound on one message: no state file fedsim wrote is larger


def encode(state: RecordDict) -> bytes:
    """A RecordDict as bytes (Flower's protobuf form: arrays byte for byte)."""
    return recorddict_to_proto(state).SerializeToString()


def decode(data: bytes) -> RecordDict:
    return recorddict_from_proto(ProtoRecordDict.FromString(data))


def state_dir(config: ConfigRecord, context: Context) -> tuple[Path, Path]:
    """The directory the user gave for this node's state (the node config's ``state-dir``, else the run
    directory, whose ``client_state/`` the message names), and this node's state directory below it for the
    run the message belongs to: fedsim's, never written through a link (:mod:`fedsim.files`)."""
    pid = wire.node_partition(context)
    base = context.node_config.get(wire.STATE_DIR)
    if base:
        root = Path(str(base))
        return root, root / str(config[wire.RUN_KEY]) / f"partition-{pid}"
    states = Path(str(config[wire.STATE_DIR]))
    return states.parent, states / f"partition-{pid}"


def _saved_rounds(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem.removeprefix("round-")) for p in directory.glob("round-*.bin"))


def save_client_state(
    state: RecordDict, directory: Path, server_round: int, keep: int, root: Path | None = None
) -> str:
    """Write ``state`` as of ``server_round``; keep only it and the file the checkpoint of ``keep`` needs.
    The SHA-256 of the file written, "" if none (an empty state is not written). ``root``: the user's directory
    that ``directory`` is made under (:func:`state_dir`; default: the one above it)."""
    if not len(state):  # never trained: a resumed node starts empty anyway
        return ""
    root = root or directory.parent
    data = encode(state)
    write_file(directory / f"round-{server_round}.bin", data, root)
    older = [r for r in _saved_rounds(directory) if r <= keep]
    needed = {server_round, max(older)} if older else {server_round}
    for r in _saved_rounds(directory):
        if r not in needed:
            remove(directory / f"round-{r}.bin", root)
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class LoadedState:
    """What a node read back: the state, the round of its file and the file's SHA-256 (0 and "": no file)."""

    state: RecordDict
    round: int
    sha256: str


def load_client_state(directory: Path, upto: int) -> LoadedState:
    """The newest state saved at a round <= ``upto`` (empty if none: the node had not trained)."""
    rounds = [r for r in _saved_rounds(directory) if r <= upto]
    if not rounds:
        return LoadedState(RecordDict(), 0, "")
    data = read_bytes(directory / f"round-{rounds[-1]}.bin", "a client's saved state", STATE_BYTES, FedsimError)
    try:
        state = decode(data)
    except DecodeError:  # changed since written: the server, comparing its SHA-256 with the checkpoint's, names it
        state = RecordDict()
    return LoadedState(state, rounds[-1], hashlib.sha256(data).hexdigest())


def state_query(msg: Message, context: Context) -> ConfigRecord:
    """What the ClientApp does for SAVE_STATE and LOAD_STATE messages; the answer's ConfigRecord says which
    file (its round and SHA-256) the node wrote or read, for the server to record or check."""
    config = msg.content.config_records[wire.CONFIG]
    (root, directory), server_round = state_dir(config, context), int(config[wire.STATE_ROUND])
    if msg.metadata.message_type == wire.SAVE_STATE:
        settle(context.state, msg)  # a checkpoint holds what the server kept of the node's replies
        sha256 = save_client_state(context.state, directory, server_round, int(config[wire.STATE_KEEP]), root)
        return ConfigRecord({wire.STATE_SHA256: sha256})
    loaded = load_client_state(directory, server_round)
    replace_state(context.state, loaded.state)
    return ConfigRecord(
        {wire.STATE_ROUND: loaded.round, wire.STATE_SHA256: loaded.sha256, wire.STATE_DIR: str(directory)}
    )
