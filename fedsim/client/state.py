"""A client node's own state across rounds, on disk for checkpoints (the server's side:
:mod:`fedsim.server.checkpoint`).

Every ``output.checkpoint_every`` rounds the server asks each node to write its ``Context.state``
(SCAFFOLD's c_i, FedBN's local tensors); a resumed run asks each node to load its newest state of a
round <= the checkpoint's. Files: ``<state dir>/<run key>/partition-<pid>/round-<r>.bin`` (a Flower
RecordDict as protobuf). The state dir is ``RUN_DIR/client_state``, or the node config's
``state-dir`` for SuperNodes on hosts that do not share the run directory; the run key keeps runs
apart there.
"""

from __future__ import annotations

import os
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import ProtoRecordDict, recorddict_from_proto, recorddict_to_proto

from fedsim import wire
from fedsim.errors import FedsimError
from fedsim.reading import GIB, read_bytes

STATE_BYTES = 2 * GIB  # protobuf's own bound on one message: no state file fedsim wrote is larger


def encode(state: RecordDict) -> bytes:
    """A RecordDict as bytes (Flower's protobuf form: arrays byte for byte)."""
    return recorddict_to_proto(state).SerializeToString()


def decode(data: bytes) -> RecordDict:
    return recorddict_from_proto(ProtoRecordDict.FromString(data))


def state_dir(config: ConfigRecord, context: Context) -> Path:
    """This node's state directory for the run the message belongs to."""
    pid = wire.node_partition(context)
    base = context.node_config.get(wire.STATE_DIR)
    root = Path(str(base)) / str(config[wire.RUN_KEY]) if base else Path(str(config[wire.STATE_DIR]))
    return root / f"partition-{pid}"


def _saved_rounds(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem.removeprefix("round-")) for p in directory.glob("round-*.bin"))


def save_client_state(state: RecordDict, directory: Path, server_round: int, keep: int) -> None:
    """Write ``state`` as of ``server_round``; keep only it and the file the checkpoint of ``keep`` needs."""
    if not len(state):  # never trained: a resumed node starts empty anyway
        return
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".round-{server_round}.bin.{os.getpid()}.tmp"
    tmp.write_bytes(encode(state))
    os.replace(tmp, directory / f"round-{server_round}.bin")
    older = [r for r in _saved_rounds(directory) if r <= keep]
    needed = {server_round, max(older)} if older else {server_round}
    for r in _saved_rounds(directory):
        if r not in needed:
            (directory / f"round-{r}.bin").unlink(missing_ok=True)


def load_client_state(directory: Path, upto: int) -> RecordDict:
    """The newest state saved at a round <= ``upto`` (empty if none: the node had not trained)."""
    rounds = [r for r in _saved_rounds(directory) if r <= upto]
    if not rounds:
        return RecordDict()
    path = directory / f"round-{rounds[-1]}.bin"
    return decode(read_bytes(path, "a client's saved state", STATE_BYTES, FedsimError))


def state_query(msg: Message, context: Context) -> None:
    """What the ClientApp does for SAVE_STATE and LOAD_STATE messages."""
    config = msg.content.config_records[wire.CONFIG]
    directory, server_round = state_dir(config, context), int(config[wire.STATE_ROUND])
    if msg.metadata.message_type == wire.SAVE_STATE:
        save_client_state(context.state, directory, server_round, int(config[wire.STATE_KEEP]))
    else:
        loaded = load_client_state(directory, server_round)
        context.state.clear()
        context.state.update(loaded)
