"""What a checkpoint records of its clients' state, and the check a resume makes against that record.

At a checkpoint every node writes its ``Context.state`` to a file of its own and answers with the
file's SHA-256 (:mod:`fedsim.client.state`); ``checkpoint.pt`` records them, partition by partition,
for the partitions that had state (a client never sampled before the checkpoint has none). A resume
has each recorded partition's node load its newest file of a round <= the checkpoint's and every
other node load nothing; each answers with the round and SHA-256 of the file it read. Unless every
answer is the recorded file, the resume stops before any training, naming the run directory, the
partition, the file and what is wrong with it. The record is the only thing that ties the files to the
run: ``RUN_DIR/client_state`` has no run key, and a missing file otherwise reads as a client that
never trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from flwr.app import Message

from fedsim import wire
from fedsim.errors import FedsimError
from fedsim.record.checkpoint import StateRecord

SHOWN = 5  # partitions named in a message; the rest are counted


def record_of(replies: Iterable[Message]) -> StateRecord:
    """The record of a checkpoint, from the nodes' answers to SAVE_STATE (partitions without state left out)."""
    answers = {wire.partition_of(r): str(wire.reply_config(r, wire.STATE_SHA256)) for r in replies}
    return {pid: sha256 for pid, sha256 in sorted(answers.items()) if sha256}


def rounds_to_load(checkpoint_round: int, record: StateRecord, partitions: Iterable[int]) -> dict[int, int]:
    """The round each partition loads its newest state up to: 0 (none) where the checkpoint recorded no state,
    so a file the run never wrote is not read."""
    return {pid: checkpoint_round if pid in record else 0 for pid in partitions}


def check_loaded(run_dir: Path, checkpoint_round: int, record: StateRecord, replies: Iterable[Message]) -> None:
    """Refuse the resume unless every node read the state file ``record`` holds for its partition."""
    problems: list[str] = []
    for reply in sorted(replies, key=wire.partition_of):
        pid = wire.partition_of(reply)
        read_round = int(wire.reply_config(reply, wire.STATE_ROUND))
        sha256 = str(wire.reply_config(reply, wire.STATE_SHA256))
        directory = Path(str(wire.reply_config(reply, wire.STATE_DIR)))
        wrong = _wrong(record.get(pid, ""), checkpoint_round, read_round, sha256, directory)
        if wrong:
            problems.append(f"partition {pid}: {wrong}")
    if not problems:
        return
    listed = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
    raise FedsimError(
        f"{run_dir}: cannot resume: its clients' state is not the state checkpoint.pt recorded at round "
        f"{checkpoint_round}: {listed}"
    )


def _wrong(expected: str, checkpoint_round: int, read_round: int, sha256: str, directory: Path) -> str:
    """What is wrong with the file a node read (round ``read_round``, 0: none), "" if it is the one expected."""
    wanted = directory / f"round-{checkpoint_round}.bin"
    if not expected:  # no state recorded: the node was asked to read none
        return f"{directory / f'round-{read_round}.bin'} is not this run's (it had no state then)" if read_round else ""
    if not read_round:
        return f"{wanted} is missing"
    if read_round != checkpoint_round:
        return f"{wanted} is missing (round-{read_round}.bin there is another round's)"
    if sha256 != expected:
        return f"{wanted} is not the file this run wrote (another run's, or changed since it was written)"
    return ""
