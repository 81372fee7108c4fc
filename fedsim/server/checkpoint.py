"""Checkpoints and resume: a run killed mid-way continues to the result it would have had.

Every ``output.checkpoint_every`` rounds the server first asks every client node to write its
``Context.state`` (SCAFFOLD's c_i, FedBN's local tensors) to a state directory of its own, then
writes ``checkpoint.pt`` in the run directory: the global model, the strategy's
``server_state()``, the SHA-256 of each node's state file, the round, the RNG states and the metrics
so far, to a temp file renamed over the last one. The rename commits the checkpoint; client files of
a round whose ``checkpoint.pt`` never landed are never read.

``fedsim run --resume RUN_DIR`` rebuilds the run from ``RUN_DIR/config.yaml``, restores the server
from ``checkpoint.pt``, has every node load the state file the checkpoint recorded for it (refusing,
before any training, a file that is missing, of another round or not the run's:
:mod:`fedsim.server.client_states`), and runs the round loop from the next round. Batches and
sampling are seeded per round, so the resumed rounds are the rounds the killed run would have run.

The clients' side (their state files) is :mod:`fedsim.client.state`.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.config import RunConfig
from fedsim.config_file import read_run_config
from fedsim.data.fingerprint import DATA_FINGERPRINT, check_same_data
from fedsim.errors import ConfigError, FedsimError
from fedsim.files import remove
from fedsim.integrity import digest, read_torch, verify
from fedsim.rundir import (
    CHECKPOINT,
    CLIENT_STATE,
    NOT_LEARNING,
    SUMMARY,
    RunDir,
    check_run_links,
    flatten,
    metrics_so_far,
    resolved,
    torch_write,
)  # fmt: skip
from fedsim.server.client_states import StateRecord, check_loaded, record_of, rounds_to_load
from fedsim.server.replies import describe_failures, missing_replies

# --- the server's checkpoint file ----------------------------------------------------------------

CHECKSUM = "sha256"  # the payload's digest (fedsim.integrity), stored beside its fields
CLIENT_STATE_RECORD = "client_state"  # partition -> SHA-256 of its state file (fedsim.server.client_states)


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(array_view(a).copy()) for k, a in record.items()}


def _state_record(value: object) -> StateRecord | None:
    """The record of clients' state as read back (None: a checkpoint written before records)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{CLIENT_STATE_RECORD} is a {type(value).__name__}, not a mapping")
    return {int(pid): str(sha256) for pid, sha256 in value.items()}


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


@dataclass
class Checkpoint:
    """What ``checkpoint.pt`` holds: the server's side of a run after round ``round``."""

    round: int
    arrays: ArrayRecord  # the global model
    server_state: ArrayRecord  # the strategy's server_state()
    metrics: list[dict[str, Any]]  # metrics.jsonl up to this round
    elapsed_s: float  # run time up to this round (time_s goes on from here)
    run_key: str  # the clients' state subdirectory
    client_state: StateRecord | None  # the SHA-256 of each partition's state file; None if written before them
    config: str  # the RunConfig as JSON: a resume must not run another experiment
    data_sha256: str | None  # the data's fingerprint (fedsim.data.fingerprint), None if written before them
    rng: dict[str, Any]
    # partitions left out (on_client_failure: skip) since the last metrics line, which the next one lists
    failed: dict[int, list[int]] = field(default_factory=dict)

    def save(self, run_dir: Path) -> None:
        payload = {
            "round": self.round,
            "model": _tensors(self.arrays),
            "server_state": _tensors(self.server_state),
            "metrics": json.dumps(self.metrics),
            "elapsed_s": self.elapsed_s,
            "run_key": self.run_key,
            CLIENT_STATE_RECORD: self.client_state,
            "config": self.config,
            DATA_FINGERPRINT: self.data_sha256,
            "rng": self.rng,
            "failed": json.dumps(self.failed),
        }
        payload[CHECKSUM] = digest(payload)  # verified on load: a file changed on disk is never resumed
        torch_write(run_dir / CHECKPOINT, payload, fsync=True)

    @classmethod
    def load(cls, run_dir: Path, cfg: RunConfig | None = None, data_sha256: str | None = None) -> Checkpoint:
        """The checkpoint in ``run_dir``; with ``cfg``, refused unless ``cfg`` trains as the saved config, and with
        ``data_sha256`` (the fingerprint of ``cfg``'s data), on the same data."""
        path = run_dir / CHECKPOINT
        try:
            p = read_torch(path, "fedsim checkpoint")
        except FileNotFoundError as err:
            raise FedsimError(f"{run_dir}: no {CHECKPOINT} to resume from") from err
        if not isinstance(p, dict):
            raise FedsimError(f"{path}: not a fedsim checkpoint (a {type(p).__name__}, not a mapping)")
        verify(path, {k: v for k, v in p.items() if k != CHECKSUM}, p.get(CHECKSUM))
        try:
            checkpoint = cls(
                round=int(p["round"]),
                arrays=to_array_record(p["model"]),
                server_state=to_array_record(p["server_state"]),
                metrics=json.loads(p["metrics"]),
                elapsed_s=float(p["elapsed_s"]),
                run_key=str(p["run_key"]),
                client_state=_state_record(p.get(CLIENT_STATE_RECORD)),
                config=str(p["config"]),
                data_sha256=p.get(DATA_FINGERPRINT),
                rng=p["rng"],
                failed={int(r): pids for r, pids in json.loads(p["failed"]).items()},
            )
        except Exception as err:  # fields of other types: say which file, not a traceback
            raise FedsimError(f"{path}: not a readable fedsim checkpoint ({type(err).__name__}: {err})") from err
        if cfg is not None:
            _check_same_run(cfg, checkpoint.config)
            if data_sha256 is not None:
                check_same_data(checkpoint.data_sha256, data_sha256, path, cfg.data.root)
        return checkpoint


def resume_config(run_dir: str | Path) -> RunConfig:
    """The config of an unfinished run that has a checkpoint; errors say why a run cannot resume."""
    path = resolved(Path(run_dir), "--resume")
    config_path = path / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{path}: not a run directory (no config.yaml)")
    check_run_links(path)  # a link there is said as one, before what it points to is read as the run's
    if (path / SUMMARY).is_file():
        raise FedsimError(f"{path}: the run already finished ({SUMMARY} exists); there is nothing to resume")
    cfg = read_run_config(config_path)
    if not (path / CHECKPOINT).is_file():
        raise FedsimError(
            f"{path}: no {CHECKPOINT} to resume from; checkpoints are written every "
            f"output.checkpoint_every rounds (this run: {cfg.output.checkpoint_every}, 0 = off) "
            "once that many rounds have run"
        )
    cfg.output.run_dir = str(path)  # the directory may have moved since
    return cfg


def _check_same_run(cfg: RunConfig, saved_json: str) -> None:
    """Refuse to resume a checkpoint under a config that trains differently (rundir.NOT_LEARNING may differ)."""
    now = flatten(json.loads(cfg.to_json()))
    then = flatten(json.loads(saved_json))
    keys = now.keys() | then.keys()
    changed = sorted(k for k in keys if not k.startswith(NOT_LEARNING) and now.get(k) != then.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(f"config.yaml differs from the checkpoint's config ({diffs}); resume with the original")


# --- the server's side: when to checkpoint, and restoring one ------------------------------------


class Checkpointer:
    """Writes one run's checkpoints (server file and client states) and restores a resumed run."""

    def __init__(
        self,
        cfg: RunConfig,
        out: RunDir,
        grid: Grid,
        node_of_partition: dict[int, int],
        resumed: Checkpoint | None,
        data_sha256: str,
    ) -> None:
        self.cfg, self.out, self.grid, self.data_sha256 = cfg, out, grid, data_sha256
        self.every = cfg.output.checkpoint_every
        self.partition_of_node = {n: p for p, n in node_of_partition.items()}
        if resumed is None:  # a fresh run: a run key of its own, so no node ever loads another run's state
            self.run_key, self.last, self.record = f"{out.path.name}-{uuid.uuid4().hex[:8]}", 0, None
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
        """Client states first, then ``checkpoint.pt``, whose rename commits round ``server_round``."""
        every = dict.fromkeys(self.partition_of_node.values(), server_round)
        replies = self._tell_clients(wire.SAVE_STATE, server_round, every)
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
        recorded for its partition, or none; anything else stops the resume here, before any training."""
        rounds = rounds_to_load(self.last, self.record, self.partition_of_node.values())
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
                RecordDict({wire.CONFIG: self._state_config(rounds[pid])}), dst_node_id=node, message_type=message_type
            )
            for node, pid in sorted(self.partition_of_node.items())
        ]
        replies = list(self.grid.send_and_receive(messages, timeout=self.cfg.train.round_timeout_s))
        # a checkpoint missing one client's state would not resume to the same run: no failure policy here
        everyone = sorted(self.partition_of_node.values())
        reasons = missing_replies(replies, everyone, self.partition_of_node, self.cfg.train.round_timeout_s)
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
