"""Checkpoints and resume: a run killed mid-way continues to the result it would have had.

Every ``output.checkpoint_every`` rounds the server first asks every client node to write its
``Context.state`` (SCAFFOLD's c_i, FedBN's local tensors) to a state directory of its own, then
writes ``checkpoint.pt`` in the run directory (:class:`fedsim.record.checkpoint.Checkpoint`): the global
model, the strategy's ``server_state()``, the SHA-256 of each node's state file, the round, the RNG states
and the metrics so far, to a temp file renamed over the last one. The rename commits the checkpoint; client
files of a round whose ``checkpoint.pt`` never landed are never read.

``fedsim run --resume RUN_DIR`` rebuilds the run from ``RUN_DIR/config.yaml``, restores the server
from ``checkpoint.pt``, has every node load the state file the checkpoint recorded for it (refusing,
before any training, a file that is missing, of another round or not the run's:
:mod:`fedsim.server.client_states`), and runs the round loop from the next round. Batches and
sampling are seeded per round, so the resumed rounds are the rounds the killed run would have run.

The clients' side (their state files) is :mod:`fedsim.client.state`.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsim import wire
from fedsim.config import RunConfig
from fedsim.errors import FedsimError
from fedsim.files import remove
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.claim import metrics_so_far
from fedsim.record.layout import CLIENT_STATE
from fedsim.record.writer import RunDir
from fedsim.server.client_states import check_loaded, record_of, rounds_to_load
from fedsim.server.delivery import Deliveries
from fedsim.server.discovery import invert
from fedsim.server.replies import describe_failures, missing_replies


def rng_state() -> dict[str, Any]:
    """This process's global RNG states (torch, numpy, python) in types ``torch.load`` accepts."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(py_state), py_gauss],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, py_state, py_gauss = state["python"]
    random.setstate((version, tuple(py_state), py_gauss))


class Checkpointer:
    """Writes one run's checkpoints (server file and client states) and restores a resumed run."""

    def __init__(
        self,
        cfg: RunConfig,
        out: RunDir,
        grid: Grid,
        node_of_partition: Mapping[int, int],
        resumed: Checkpoint | None,
        data_sha256: str,
    ) -> None:
        self.cfg, self.out, self.grid, self.data_sha256 = cfg, out, grid, data_sha256
        self.every = cfg.output.checkpoint_every
        self.node_of_partition = node_of_partition
        self.partition_of_node = invert(node_of_partition)
        self.deliveries = Deliveries(self.partition_of_node)  # the round loop records them; every message carries them
        if resumed is None:  # a fresh run: a run key of its own, so no node ever loads another run's state
            self.run_key, self.last, self.record = f"{out.path.name}-{uuid.uuid4().hex[:8]}", 0, {}
        else:
            self.run_key, self.last, self.record = resumed.run_key, resumed.round, resumed.client_state

    def due(self, server_round: int) -> bool:
        return self.every > 0 and server_round > self.last and server_round % self.every == 0

    def save(
        self,
        server_round: int,
        arrays: ArrayRecord,
        server_state: ArrayRecord,
        elapsed_s: float,
        failed: dict[int, list[int]],
    ) -> None:
        """Client states first, then ``checkpoint.pt``, whose rename commits round ``server_round``. The nodes asked
        are those this process sent anything (``Deliveries.touched``): no other node's state changed since it began
        (a resume's nodes were each told theirs), so a round of a million-client run asks the clients it served."""
        touched = dict.fromkeys(sorted(self.deliveries.touched), server_round)
        replies = self._tell_clients(wire.SAVE_STATE, server_round, touched)
        Checkpoint(
            round=server_round,
            arrays=arrays,
            server_state=server_state,
            metrics=self.out.read_metrics(),
            elapsed_s=elapsed_s,
            run_key=self.run_key,
            client_state=record_of(replies),
            config=self.cfg.to_json(),
            data_sha256=self.data_sha256,
            rng=rng_state(),
            failed=failed,
        ).save(self.out.path)
        self.last = server_round

    def restore_clients(self) -> None:
        """Every node replaces its Context.state with its state as of the checkpoint: the file the checkpoint
        recorded for its partition, or none; anything else stops the resume here, before any training. Nodes started
        with this process (``grid.fresh_nodes``: fedsim's local grid) hold none: only the recorded are told."""
        everyone = self.record if getattr(self.grid, "fresh_nodes", False) else self.node_of_partition
        rounds = rounds_to_load(self.last, self.record, everyone)
        replies = self._tell_clients(wire.LOAD_STATE, self.last, rounds)
        check_loaded(self.out.path, self.last, self.record, replies)

    def finish(self) -> None:
        """A finished run cannot resume: its clients' state files go (``checkpoint.pt`` stays, small
        beside them: the last model and server state). Nodes with a ``state-dir`` of their own keep theirs."""
        remove(self.out.path / CLIENT_STATE)

    def describe(self) -> str:
        """Where the run stands on disk, for the message of an error that stopped it."""
        metrics = metrics_so_far(self.out.path)
        if self.last:
            return f"the last good checkpoint (round {self.last}) is in {self.out.path}; {metrics}"
        return f"no checkpoint was written (output.checkpoint_every: {self.every}); {metrics}"

    def _tell_clients(self, message_type: str, server_round: int, rounds: dict[int, int]) -> list[Message]:
        """Every node's answer to ``message_type`` for its partition's state of round ``rounds[partition]``
        (a node that does not answer stops the run)."""
        messages = [
            Message(
                RecordDict({wire.CONFIG: self._state_config(rounds[pid])}),
                dst_node_id=self.node_of_partition[pid],
                message_type=message_type,
            )
            for pid in sorted(rounds)
        ]
        stamped = self.deliveries.stamp(messages)
        replies = list(self.grid.send_and_receive(stamped, timeout=self.cfg.train.round_timeout_s))
        # a checkpoint missing one client's state would not resume to the same run: no failure policy here
        reasons = missing_replies(replies, sorted(rounds), self.partition_of_node, self.cfg.train.round_timeout_s)
        if reasons:
            verb = "save" if message_type == wire.SAVE_STATE else "load"
            raise FedsimError(
                f"round {server_round}: clients could not {verb} their state: {describe_failures(reasons)}"
            )
        return replies

    def _state_config(self, state_round: int) -> ConfigRecord:
        return ConfigRecord(
            {
                wire.STATE_ROUND: state_round,
                wire.STATE_KEEP: self.last,
                wire.STATE_DIR: str(self.out.path / CLIENT_STATE),
                wire.RUN_KEY: self.run_key,
            }
        )
