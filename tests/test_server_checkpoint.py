"""The server's checkpointer (fedsim/server/checkpoint.py): when a checkpoint is due, what a save asks of the client
nodes (the partitions this process served, each told its round, the round to keep, the state directory and the run
key) and what checkpoint.pt then holds, a client that cannot save or load stopping it, a resume's restore telling
the recorded partitions (every node, on a grid whose nodes outlive the process) and refusing a state file that is not
the recorded one, the state files removed at the end, the line saying where a stopped run stands, and the global RNG
states saved and restored. The nodes are this test's: a grid whose executor answers as fedsim's ClientApp answers
SAVE_STATE and LOAD_STATE, from a table of each partition's state file. checkpoint.pt's own format:
tests/test_record_checkpoint.py."""

from __future__ import annotations

import io
import random
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.engines.local import LocalGrid
from fedsim.errors import FedsimError
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.writer import RunDir
from fedsim.server.checkpoint import Checkpointer, rng_state, set_rng_state
from tests.conftest import small_config
from tests.fault_lines import fault_line

# partition -> node: node ids are not partition ids (nor in their order) on Flower's runtimes, and discovery finds
# the nodes in no order of partitions
NODES = {2: 3, 0: 907, 3: 1200, 1: 45}
DATA = "cd" * 32  # the data's fingerprint the run was given
SHA_1, SHA_3 = "1a" * 32, "3c" * 32  # the state files of partitions 1 and 3


class Nodes:
    """Client nodes as the checkpointer sees them: each answers SAVE_STATE with the SHA-256 of the state file it
    wrote ("" without state) and LOAD_STATE with the round and SHA-256 of the file it read (0 and "" for none), as
    fedsim's ClientApp does; ``silent`` partitions never answer, ``failing`` ones answer with an error."""

    def __init__(
        self, states: dict[int, str], silent: Collection[int] = (), failing: Mapping[int, str] | None = None,
        reads: Mapping[int, int] | None = None,
    ) -> None:  # fmt: skip
        self.states = dict(states)  # partition -> the SHA-256 of its state file
        self.silent, self.failing = set(silent), dict(failing or {})
        self.reads = dict(reads or {})  # partition -> the round of a file it reads whatever it is told (a stray one)
        self.partition_of = {node: pid for pid, node in NODES.items()}
        self.sent: list[Message] = []
        self.timeouts: list[float | None] = []

    def node_ids(self) -> list[int]:
        return list(self.partition_of)

    def execute(self, messages: Sequence[Message], timeout: float | None = None) -> list[Message]:
        self.sent += messages
        self.timeouts.append(timeout)
        replies = []
        for m in messages:
            pid = self.partition_of[m.metadata.dst_node_id]
            if pid in self.silent:
                continue
            if pid in self.failing:
                replies.append(wire.failure_reply(m, self.failing[pid]))
                continue
            config = m.content.config_records[wire.CONFIG]
            asked, sha256 = int(config[wire.STATE_ROUND]), self.states.get(pid, "")  # type: ignore[arg-type]
            if m.metadata.message_type == wire.LOAD_STATE:  # the newest file of a round <= the one asked, if any
                asked = self.reads.get(pid, asked if sha256 else 0)
                sha256 = sha256 if asked else ""
            answer = {wire.STATE_SHA256: sha256, wire.STATE_ROUND: asked, wire.STATE_DIR: config[wire.STATE_DIR]}
            content = {wire.METRICS: MetricRecord({wire.PARTITION_ID: pid}), wire.CONFIG: ConfigRecord(answer)}
            replies.append(Message(RecordDict(content), reply_to=m))  # type: ignore[arg-type]
        return replies

    def told(self) -> list[tuple[str, int, dict[str, object], int]]:
        """Each message sent: its type, its partition, its config and the accepted round it was stamped with."""
        return [
            (m.metadata.message_type, self.partition_of[m.metadata.dst_node_id], dict(m.content[wire.CONFIG]),
             int(m.content[wire.DELIVERY][wire.ACCEPTED_ROUND]))  # type: ignore[arg-type]
            for m in self.sent
        ]  # fmt: skip


class LastingGrid(LocalGrid):
    """A grid whose nodes were started before this process (a SuperLink's): they may hold state a resume must
    clear."""

    fresh_nodes = False


@pytest.fixture(autouse=True)
def rng_kept() -> Iterator[None]:
    """The global RNG states as they were before the test (these tests draw and set them)."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


def config(tmp_path: Path, every: int = 2) -> RunConfig:
    return parse_config(small_config(tmp_path, output={"checkpoint_every": every}))


def checkpointer(
    tmp_path: Path, nodes: Nodes, every: int = 2, resumed: Checkpoint | None = None, grid: type = LocalGrid
) -> Checkpointer:
    return Checkpointer(config(tmp_path, every), RunDir(tmp_path / "run"), grid(nodes), NODES, resumed, DATA)


def served(ckpt: Checkpointer, server_round: int, partitions: list[int], accepted: list[int]) -> None:
    """A round's training messages to ``partitions``, of which the replies of ``accepted`` were aggregated."""
    messages = [Message(RecordDict(), dst_node_id=NODES[p], message_type=wire.TRAIN) for p in partitions]
    stamped = ckpt.deliveries.stamp(messages)
    replies = [Message(RecordDict({wire.METRICS: MetricRecord({wire.PARTITION_ID: p})}), reply_to=m)
               for p, m in zip(partitions, stamped, strict=True) if p in accepted]  # fmt: skip
    ckpt.deliveries.accept(server_round, replies)


def resumed_at(round_: int, record: dict[int, str]) -> Checkpoint:
    """A checkpoint of round ``round_`` recording ``record``, as a resume loads it."""
    return Checkpoint(
        round=round_, arrays=ArrayRecord(), server_state=ArrayRecord(), metrics=[], elapsed_s=0.0, run_key="t-key",
        client_state=record, config="{}", data_sha256=DATA, rng={}, failed={},
    )  # fmt: skip


def arrays(**tensors: torch.Tensor) -> ArrayRecord:
    return to_array_record(tensors)


# --- when -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("every", "due"), [(2, [2, 4, 6, 8]), (3, [3, 6]), (1, [1, 2, 3, 4, 5, 6, 7, 8]), (0, [])])
def test_a_checkpoint_is_due_every_checkpoint_every_rounds_and_never_at_zero(
    tmp_path: Path, every: int, due: list[int]
) -> None:
    ckpt = checkpointer(tmp_path, Nodes({}), every)
    assert [r for r in range(1, 9) if ckpt.due(r)] == due


def test_a_resumed_run_is_due_only_after_its_checkpoints_round(tmp_path: Path) -> None:
    ckpt = checkpointer(tmp_path, Nodes({}), 2, resumed_at(4, {}))
    assert [r for r in range(1, 11) if ckpt.due(r)] == [6, 8, 10]


def test_a_fresh_run_has_a_run_key_of_its_own_and_a_resumed_one_the_checkpoints(tmp_path: Path) -> None:
    first, second = checkpointer(tmp_path, Nodes({})), checkpointer(tmp_path, Nodes({}))
    for ckpt in (first, second):
        assert re.fullmatch(r"run-[0-9a-f]{8}", ckpt.run_key), ckpt.run_key  # the run directory's name, then random
        assert (ckpt.last, ckpt.record) == (0, {})
    assert first.run_key != second.run_key  # no node loads another run's state from a shared state directory
    resumed = checkpointer(tmp_path, Nodes({}), resumed=resumed_at(4, {3: SHA_3}))
    assert (resumed.run_key, resumed.last, resumed.record) == ("t-key", 4, {3: SHA_3})


# --- save -----------------------------------------------------------------------------------


def test_a_save_asks_the_clients_served_then_writes_checkpoint_pt_of_the_round(tmp_path: Path) -> None:
    nodes = Nodes({1: SHA_1})  # partition 1's node wrote a state file; 3's has no state, 0 and 2 were never served
    ckpt = checkpointer(tmp_path, nodes)
    served(ckpt, 1, [3, 1], accepted=[3])  # partition 1's reply left out (on_client_failure: skip)
    ckpt.out.append_metrics({"round": 2, "client_mean_acc": 0.5})
    model = arrays(w=torch.arange(6.0).reshape(2, 3))
    state = arrays(**{"c/w": torch.full((2, 3), -0.25)})
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    nodes.sent.clear()
    ckpt.save(2, model, state, 12.5, {2: [1]})

    state_dir = str(tmp_path / "run" / "client_state")
    told = {wire.STATE_ROUND: 2, wire.STATE_KEEP: 0, wire.STATE_DIR: state_dir, wire.RUN_KEY: ckpt.run_key}
    # the partitions served, by partition; each with the round whose reply from it was kept
    assert nodes.told() == [(wire.SAVE_STATE, 1, told, 0), (wire.SAVE_STATE, 3, told, 1)]
    assert nodes.timeouts[-1] == 3600.0  # train.round_timeout_s
    saved = Checkpoint.load(tmp_path / "run", config(tmp_path))
    assert (saved.round, saved.elapsed_s, saved.run_key, saved.data_sha256) == (2, 12.5, ckpt.run_key, DATA)
    assert saved.client_state == {1: SHA_1}  # partition 3's node had no state: not recorded
    assert saved.metrics == [{"round": 2, "client_mean_acc": 0.5}] and saved.failed == {2: [1]}
    assert saved.config == config(tmp_path).to_json()
    assert np.array_equal(array_view(saved.arrays["w"]), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert np.array_equal(array_view(saved.server_state["c/w"]), np.full((2, 3), -0.25, dtype=np.float32))
    assert torch.equal(saved.rng["torch"], rng)  # the RNG as the round left it
    assert ckpt.last == 2 and not ckpt.due(2) and ckpt.due(4)


def test_the_next_save_keeps_the_last_committed_rounds_state_and_replaces_the_checkpoint(tmp_path: Path) -> None:
    nodes = Nodes({0: "0a" * 32})
    ckpt = checkpointer(tmp_path, nodes)
    served(ckpt, 1, [0], accepted=[0])
    ckpt.save(2, arrays(w=torch.zeros(2)), ArrayRecord(), 1.0, {})
    nodes.states[0] = "0b" * 32  # its state file of round 4
    nodes.sent.clear()
    ckpt.save(4, arrays(w=torch.ones(2)), ArrayRecord(), 2.0, {})
    (save,) = nodes.told()
    assert save[2][wire.STATE_ROUND] == 4 and save[2][wire.STATE_KEEP] == 2  # round 2's file survives pruning
    saved = Checkpoint.load(tmp_path / "run")
    assert (saved.round, saved.client_state, saved.elapsed_s) == (4, {0: "0b" * 32}, 2.0)
    assert np.array_equal(array_view(saved.arrays["w"]), np.ones(2, dtype=np.float32))


def test_a_save_before_any_client_was_served_asks_no_node_and_records_no_state(tmp_path: Path) -> None:
    nodes = Nodes({0: "0a" * 32})
    ckpt = checkpointer(tmp_path, nodes)
    ckpt.save(2, arrays(w=torch.zeros(1)), ArrayRecord(), 0.5, {})
    assert nodes.told() == [] and Checkpoint.load(tmp_path / "run").client_state == {}


def test_clients_that_cannot_save_stop_the_checkpoint_and_the_last_one_stays(tmp_path: Path) -> None:
    nodes = Nodes({0: "0a" * 32, 1: SHA_1, 2: "2a" * 32, 3: SHA_3})
    ckpt = checkpointer(tmp_path, nodes)
    served(ckpt, 1, [0, 1, 2, 3], accepted=[0, 1, 2, 3])
    ckpt.save(2, arrays(w=torch.zeros(2)), ArrayRecord(), 1.0, {})
    nodes.silent, nodes.failing = {1}, {3: "OSError: [Errno 28] No space left on device"}
    with pytest.raises(FedsimError) as err:
        ckpt.save(4, arrays(w=torch.ones(2)), ArrayRecord(), 2.0, {})
    message = str(err.value)  # the round, which clients and why (wording: the corpus)
    assert re.match(r"round 4\b.*\bsave\b", message) and "\n" not in message, message
    assert "client 1: " in message and "train.round_timeout_s = 3600 s" in message, message
    assert "client 3: OSError: [Errno 28] No space left on device" in message, message
    assert "client 0" not in message and "client 2" not in message, message
    assert Checkpoint.load(tmp_path / "run").round == 2 and ckpt.last == 2  # nothing of round 4 committed


# --- restore --------------------------------------------------------------------------------


def test_a_restore_on_a_fresh_grid_tells_the_recorded_partitions_only(tmp_path: Path) -> None:
    nodes = Nodes({1: SHA_1, 3: SHA_3})
    ckpt = checkpointer(tmp_path, nodes, resumed=resumed_at(4, {3: SHA_3, 1: SHA_1}))
    ckpt.restore_clients()
    told = {wire.STATE_ROUND: 4, wire.STATE_KEEP: 4, wire.STATE_DIR: str(tmp_path / "run" / "client_state"),
            wire.RUN_KEY: "t-key"}  # fmt: skip
    assert nodes.told() == [(wire.LOAD_STATE, 1, told, 0), (wire.LOAD_STATE, 3, told, 0)]
    assert ckpt.deliveries.touched == {1, 3}  # so the next checkpoint asks them again


def test_a_restore_on_a_grid_of_lasting_nodes_tells_every_node_the_others_to_load_none(tmp_path: Path) -> None:
    nodes = Nodes({1: SHA_1, 3: SHA_3})
    ckpt = checkpointer(tmp_path, nodes, resumed=resumed_at(4, {3: SHA_3, 1: SHA_1}), grid=LastingGrid)
    ckpt.restore_clients()
    assert [(kind, pid, told[wire.STATE_ROUND]) for kind, pid, told, _ in nodes.told()] == [
        (wire.LOAD_STATE, 0, 0), (wire.LOAD_STATE, 1, 4), (wire.LOAD_STATE, 2, 0), (wire.LOAD_STATE, 3, 4)
    ]  # fmt: skip


def test_a_restore_refuses_state_files_that_are_not_the_ones_recorded(tmp_path: Path) -> None:
    # partition 3's file changed since; partition 0's node reads a file of round 4 where the checkpoint recorded none
    nodes = Nodes({0: "0a" * 32, 1: SHA_1, 3: "ff" * 32}, reads={0: 4})
    ckpt = checkpointer(tmp_path, nodes, resumed=resumed_at(4, {1: SHA_1, 3: SHA_3}), grid=LastingGrid)
    with pytest.raises(FedsimError) as err:
        ckpt.restore_clients()
    message = str(err.value)  # the run directory, the round and each partition at fault (wording: the corpus)
    assert message.startswith(f"{tmp_path / 'run'}: ") and re.search(r"\bround 4\b", message), message
    state_file = re.escape(str(tmp_path / "run" / "client_state" / "round-4.bin"))
    assert re.search(rf"\bpartition 0: {state_file}", message), message
    assert re.search(rf"\bpartition 3: {state_file}", message), message
    assert "partition 1" not in message and "partition 2" not in message, message


def test_a_restore_stops_when_a_node_does_not_answer(tmp_path: Path) -> None:
    nodes = Nodes({1: SHA_1, 3: SHA_3}, silent=[3])
    ckpt = checkpointer(tmp_path, nodes, resumed=resumed_at(4, {1: SHA_1, 3: SHA_3}))
    with pytest.raises(FedsimError) as err:
        ckpt.restore_clients()
    message = str(err.value)  # wording: the corpus
    assert re.match(r"round 4\b.*\bload\b.*\bclient 3: ", message) and "client 1" not in message, message


# --- the end, and a stop ----------------------------------------------------------------------


def test_finish_removes_the_client_states_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    ckpt = checkpointer(tmp_path, Nodes({}))
    ckpt.finish()  # a run that never checkpointed: nothing to remove
    ckpt.save(2, arrays(w=torch.zeros(1)), ArrayRecord(), 1.0, {})
    state_file = tmp_path / "run" / "client_state" / ckpt.run_key / "0" / "round-2.bin"
    state_file.parent.mkdir(parents=True)
    state_file.write_bytes(b"state")
    ckpt.finish()
    assert not (tmp_path / "run" / "client_state").exists()
    assert Checkpoint.load(tmp_path / "run").round == 2


def test_describe_says_the_last_checkpoint_and_what_metrics_are_kept(tmp_path: Path) -> None:
    run_dir = re.escape(str(tmp_path / "run"))
    off = checkpointer(tmp_path, Nodes({}), every=0)
    nothing = fault_line("nothing kept", run_dir=run_dir)
    assert re.fullmatch(fault_line("no checkpoint kept", kept=nothing), off.describe()), off.describe()
    off.out.append_metrics({"round": 1, "client_mean_acc": 0.25})
    metrics = fault_line("metrics kept", run_dir=run_dir)
    assert re.fullmatch(fault_line("no checkpoint kept", kept=metrics), off.describe()), off.describe()

    on = checkpointer(tmp_path / "on", Nodes({}), every=3)
    said = on.describe()  # not due yet: none written, under the run's own checkpoint_every
    assert "output.checkpoint_every: 3" in said and not re.search(r"\bround \d", said), said
    on.save(3, arrays(w=torch.zeros(1)), ArrayRecord(), 1.0, {})
    where = re.escape(str(tmp_path / "on" / "run"))
    kept = fault_line("checkpoint kept", round=3, run_dir=where) + "; " + fault_line("no metrics kept", run_dir=where)
    assert re.fullmatch(kept, on.describe()), on.describe()


# --- the RNG states -------------------------------------------------------------------------


def draws() -> list[float]:
    """Numbers from each global stream, a cached Gaussian of each first (numpy's polar method and Python's gauss
    draw two and keep one)."""
    return [np.random.standard_normal(), random.gauss(0.0, 1.0), *torch.rand(3).tolist(), np.random.rand(),
            random.random(), np.random.standard_normal(), random.gauss(0.0, 1.0)]  # fmt: skip


def test_the_rng_states_restore_every_stream_even_through_a_weights_only_load() -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.standard_normal()  # a Gaussian cached in numpy's state
    random.gauss(0.0, 1.0)  # and in Python's
    assert np.random.get_state()[3] == 1 and random.getstate()[2] is not None
    state = rng_state()
    expected = draws()
    draws()  # the streams move on
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    set_rng_state(torch.load(buffer, weights_only=True))  # as checkpoint.pt holds it
    assert draws() == expected
    set_rng_state(state)
    assert draws() == expected
