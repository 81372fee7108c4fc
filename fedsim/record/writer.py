"""The run directory as a run writes it (:class:`RunDir`): every file through :mod:`fedsim.files`, whole files
to a temp file renamed over the last (never half-written, never through a link), metrics.jsonl a line at a
time; and with the checksums of the rest (:mod:`fedsim.record.checksums`) in progress.json each round and in
summary.json at the end. A write that fails (a full disk) is one error naming the file; it leaves no temp file,
and what was written before it stays."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pydantic_core import from_json

from fedsim.config import RunConfig, flatten
from fedsim.files import append_file, write_file
from fedsim.record.checksums import (
    CONFIG_CHECKSUM,
    PARTITION_CHECKSUM,
    SUMMARY_CHECKSUM,
    MetricsChecksum,
    config_checksum,
    config_tree,
    digest,
    partition_checksum,
    summary_checksum,
)  # fmt: skip
from fedsim.record.layout import (
    CONFIG,
    ERROR,
    METRICS,
    MODEL,
    PARTITION,
    PROGRESS,
    RECORD_VERSION,
    SUMMARY,
    VERSION_KEY,
)
from fedsim.record.paths import make_dir
from fedsim.record.reader import read_metrics


def write_torch(path: Path, value: Any, fsync: bool = False) -> None:
    """``torch.save(value)`` into ``path`` by :func:`fedsim.files.write_file` (``fsync``: synced before it is
    renamed, as checkpoints are): serialised in memory first, since torch's own writer turns a full disk into a
    RuntimeError at an arbitrary place in the file."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    write_file(path, buffer.getbuffer(), fsync=fsync)


def _metrics_line(record: dict[str, Any]) -> bytes:
    """A metrics record (JSON-safe: :func:`json_safe` applied, or read back from the file) as its line."""
    return (json.dumps(record, allow_nan=False) + "\n").encode()


def record_json(name: str, value: dict[str, Any]) -> bytes:
    """``progress.json`` (one line, rewritten every round) or ``summary.json`` (indented, for reading) as written."""
    if name == SUMMARY:
        return (json.dumps(value, indent=2, allow_nan=False) + "\n").encode()
    return json.dumps(value, allow_nan=False).encode()


class RunDir:
    """A run's directory as the run writes it. ``trackers`` (:func:`fedsim.trackers.open_trackers` for the
    directory once made) get what it gets: its config, every metrics line, and at :meth:`close` its files."""

    def __init__(self, path: str | Path, trackers: Callable[[Path], Any] | None = None) -> None:
        self.path = Path(path)
        make_dir(self.path)
        self.trackers = trackers(self.path) if trackers is not None else None
        self.config_sha256: str | None = None  # write_config's
        self.partition_sha256: str | None = None  # write_partition's
        self.metrics_checksum = MetricsChecksum()  # of the lines of metrics.jsonl written so far

    def write_config(self, cfg: RunConfig) -> None:
        tree = config_tree(cfg)
        write_file(self.path / CONFIG, yaml.safe_dump(tree, sort_keys=False).encode())
        self.config_sha256 = config_checksum(tree)  # what progress.json ties the rounds so far to
        if self.trackers is not None:
            self.trackers.log_config(flatten(tree))

    def write_partition(self, train_counts: np.ndarray, test_counts: np.ndarray, classes: list[str]) -> None:
        """Write ``partition.csv``, and keep its :func:`partition_checksum` for progress.json and the summary."""
        lines = ["split,client," + ",".join(classes) + ",total"]
        for split, counts in (("train", train_counts), ("test", test_counts)):
            for cid, row in enumerate(counts):
                lines.append(f"{split},{cid}," + ",".join(str(int(v)) for v in row) + f",{int(row.sum())}")
        write_file(self.path / PARTITION, ("\n".join(lines) + "\n").encode())
        self.partition_sha256 = partition_checksum(classes, {"train": train_counts, "test": test_counts})

    def restore_metrics(self, records: list[dict[str, Any]]) -> None:
        """A resumed run: the lines up to its checkpoint, dropping any the killed run wrote after it; the next
        progress.json covers them (the resume removed the killed run's, :func:`claimed`, and until then its
        checkpoint vouches for the lines: :func:`fedsim.record.verify.check_against_checkpoint`)."""
        lines = [_metrics_line(r) for r in records]
        write_file(self.path / METRICS, b"".join(lines))
        self.metrics_checksum = MetricsChecksum(from_json(line) for line in lines)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One line more, on disk before it counts in the metrics checksum progress.json and summary.json record."""
        record = json_safe(record)
        data = _metrics_line(record)
        append_file(self.path / METRICS, data)  # no half line: the lines before it stay readable
        self.metrics_checksum.add(from_json(data))
        if self.trackers is not None:
            self.trackers.log_metrics(record)

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> str:
        """Write ``model.pt`` (a plain state dict, for ``torch.load``); returns its checksum, which the
        summary records (``model_sha256``) and ``fedsim local`` checks."""
        write_torch(self.path / MODEL, state_dict)
        return digest(state_dict)

    def write_progress(self, server_round: int, loss: float | None, acc: float | None) -> None:
        """The latest round, for whoever shows progress from outside the ServerApp (``fedsim deploy``), and the
        checksums of the config it runs (:meth:`write_config`) and of the metrics lines so far: an unfinished
        run's config.yaml and metrics.jsonl are checked by them."""
        progress = json_safe({"round": server_round, "loss": loss, "acc": acc, **self._checksums()})
        write_file(self.path / PROGRESS, record_json(PROGRESS, progress))

    def _checksums(self) -> dict[str, Any]:
        """What progress.json and summary.json record of the run's files so far (config, partition, metrics), and
        of which record version they are."""
        return {VERSION_KEY: RECORD_VERSION, CONFIG_CHECKSUM: self.config_sha256,
                PARTITION_CHECKSUM: self.partition_sha256, **self.metrics_checksum.record()}  # fmt: skip

    def write_error(self, message: str) -> None:
        """Why the run stopped, for a launcher that cannot see the ServerApp's exception."""
        write_file(self.path / ERROR, message.encode())

    def write_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` with the checksums of the run's config, partition and metrics lines, and its own;
        returns it as written."""
        summary = json_safe({**summary, **self._checksums()})
        summary[SUMMARY_CHECKSUM] = summary_checksum(summary)
        write_file(self.path / SUMMARY, record_json(SUMMARY, summary))
        return summary

    def close(self) -> None:
        """The trackers get the run's files and are closed (once, however the run ended)."""
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON has no NaN or inf (readers would choke)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
