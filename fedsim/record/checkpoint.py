"""``checkpoint.pt``: the server's side of a run after a round (:class:`Checkpoint`), written every
``output.checkpoint_every`` rounds by :class:`fedsim.server.checkpoint.Checkpointer` through the record's one
atomic write (fsynced before its rename, which commits the round). The file holds its record version and its
payload (the fields, as ``torch.save`` writes them) with the payload's entry (size and SHA-256,
:mod:`fedsim.record.manifest`): a file changed on disk is never resumed. It records the SHA-256 of each node's
state file (:mod:`fedsim.client.state`), which a resume checks
(:mod:`fedsim.server.client_states`). :func:`resume_config` says whether a run directory can resume, and with
what config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from fedsim.arrays import array_view, to_array_record
from fedsim.config import NOT_LEARNING, READ_BACK, RunConfig, flatten
from fedsim.config_file import read_run_config
from fedsim.errors import ConfigError, FedsimError
from fedsim.files import write_file
from fedsim.record.layout import CHECKPOINT, CONFIG, RECORD_VERSION, SUMMARY, VERSION_KEY
from fedsim.record.manifest import DATA_FINGERPRINT, SHA256, SIZE, check_entry, entry_of
from fedsim.record.paths import check_run_links, resolved
from fedsim.record.reader import check_version, load_torch, read_torch_bytes
from fedsim.record.writer import torch_bytes

PAYLOAD = "payload"  # the fields, torch.save's bytes as a uint8 tensor, beside their size and SHA-256
WHAT = "fedsim checkpoint"
CLIENT_STATE_RECORD = "client_state"  # partition -> SHA-256 of its state file (fedsim.server.client_states)
StateRecord = dict[int, str]  # partition -> SHA-256 of its state file of the checkpoint's round


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(array_view(a).copy()) for k, a in record.items()}


def _state_record(value: object) -> StateRecord:
    """The record of clients' state as read back."""
    if not isinstance(value, dict):
        raise TypeError(f"{CLIENT_STATE_RECORD} is a {type(value).__name__}, not a mapping")
    return {int(pid): str(sha256) for pid, sha256 in value.items()}


def checkpoint_bytes(fields: dict[str, Any]) -> bytes:
    """``checkpoint.pt`` of ``fields`` (a checkpoint's payload): the record version, and the fields as
    ``torch.save``'s bytes with their entry."""
    data = torch_bytes(fields)
    return torch_bytes({VERSION_KEY: RECORD_VERSION, **entry_of(data),
                        PAYLOAD: torch.frombuffer(bytearray(data), dtype=torch.uint8)})  # fmt: skip


@dataclass
class Checkpoint:
    """What ``checkpoint.pt`` holds: the server's side of a run after round ``round``."""

    round: int
    arrays: ArrayRecord  # the global model
    server_state: ArrayRecord  # the strategy's server_state()
    metrics: list[dict[str, Any]]  # metrics.jsonl up to this round
    elapsed_s: float  # run time up to this round (time_s goes on from here)
    run_key: str  # the clients' state subdirectory
    client_state: StateRecord  # the SHA-256 of each partition's state file
    config: str  # the RunConfig as JSON: a resume must not run another experiment
    data_sha256: str  # the data's fingerprint (fedsim.data.fingerprint)
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
        write_file(run_dir / CHECKPOINT, checkpoint_bytes(payload), fsync=True)

    @classmethod
    def load(cls, run_dir: Path, cfg: RunConfig | None = None) -> Checkpoint:
        """The checkpoint in ``run_dir``; with ``cfg``, refused unless ``cfg`` trains as the saved config (the data
        it trained on is the resume's to check: :func:`fedsim.data.fingerprint.check_same_data`)."""
        path = run_dir / CHECKPOINT
        try:
            outer = load_torch(path, read_torch_bytes(path, WHAT), WHAT)
        except FileNotFoundError as err:
            raise FedsimError(f"{run_dir}: no {CHECKPOINT} to resume from") from err
        if not isinstance(outer, dict):
            raise FedsimError(f"{path}: not a {WHAT} (a {type(outer).__name__}, not a mapping)")
        check_version(path, outer)
        payload = outer.get(PAYLOAD)
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
            raise FedsimError(f"{path}: not a {WHAT} (no {PAYLOAD} of bytes)")
        if type(outer.get(SIZE)) is not int or not isinstance(outer.get(SHA256), str):
            raise FedsimError(f"{path}: not a {WHAT} (no {SIZE} and {SHA256} of its {PAYLOAD})")
        data = payload.numpy().tobytes()
        check_entry(path, data, outer, CHECKPOINT, "it is not resumed: restore the run directory, or run the "
                    "experiment again")  # fmt: skip
        p = load_torch(path, data, WHAT)
        try:
            checkpoint = cls(
                round=int(p["round"]),
                arrays=to_array_record(p["model"]),
                server_state=to_array_record(p["server_state"]),
                metrics=json.loads(p["metrics"]),
                elapsed_s=float(p["elapsed_s"]),
                run_key=str(p["run_key"]),
                client_state=_state_record(p[CLIENT_STATE_RECORD]),
                config=str(p["config"]),
                data_sha256=str(p[DATA_FINGERPRINT]),
                rng=p["rng"],
                failed={int(r): pids for r, pids in json.loads(p["failed"]).items()},
            )
        except Exception as err:  # fields of other types: say which file, not a traceback
            raise FedsimError(f"{path}: not a readable fedsim checkpoint ({type(err).__name__}: {err})") from err
        if cfg is not None:
            _check_same_run(cfg, checkpoint.config)
        return checkpoint


def resume_config(run_dir: str | Path) -> RunConfig:
    """The config of an unfinished run that has a checkpoint; errors say why a run cannot resume."""
    path = resolved(Path(run_dir), "--resume")
    config_path = path / CONFIG
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
    """Refuse to resume a checkpoint under a config that trains differently (NOT_LEARNING's keys may differ)."""
    now = flatten(json.loads(cfg.to_json()))
    try:  # with today's defaults filled in, so options added since the checkpoint compare as their defaults
        then = flatten(json.loads(RunConfig.model_validate_json(saved_json, context={READ_BACK: True}).to_json()))
    except ValueError:  # written by a fedsim with other options: compare what it holds
        then = flatten(json.loads(saved_json))
    keys = now.keys() | then.keys()
    changed = sorted(k for k in keys if not k.startswith(NOT_LEARNING) and now.get(k) != then.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(f"config.yaml differs from the checkpoint's config ({diffs}); resume with the original")
