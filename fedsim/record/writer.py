"""The run directory as a run writes it (:class:`RunDir`): every file through :mod:`fedsim.files`, whole files
to a temp file renamed over the last (never half-written, never through a link), metrics.jsonl a line at a
time; with the manifest of the files' sizes and SHA-256s (:mod:`fedsim.record.manifest`) in progress.json each
round and in summary.json at the end. A write that fails (a full disk) is one error naming the file; it leaves
no temp file, and what was written before it stays."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fedsim.config import RunConfig, flatten
from fedsim.files import append_file, write_file
from fedsim.record.layout import (
    CONFIG,
    ERROR,
    MANIFEST,
    METRICS,
    MODEL,
    PARTITION,
    PROGRESS,
    RECORD_VERSION,
    SUMMARY,
    VERSION_KEY,
    WORKERS,
)
from fedsim.record.manifest import FILES, SUMMARY_CHECKSUM, FileEntry, GrowingEntry, entry_of, summary_checksum
from fedsim.record.paths import make_dir
from fedsim.record.reader import read_metrics


def torch_bytes(value: Any) -> bytes:
    """``torch.save(value)``'s bytes: serialised in memory, since torch's own writer turns a full disk into a
    RuntimeError at an arbitrary place in the file."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def json_line(record: dict[str, Any]) -> bytes:
    """A record of a JSON Lines file (metrics.jsonl, workers.jsonl; JSON-safe: :func:`json_safe` applied, or read
    back from the file) as its line."""
    return (json.dumps(record, allow_nan=False) + "\n").encode()


def append_workers(run_dir: Path, workers: list[dict[str, Any]]) -> None:
    """Lines more of ``workers.jsonl``: workers of the Ray pool, each where it ran (:class:`WorkerRecord`)."""
    append_file(run_dir / WORKERS, b"".join(json_line(json_safe(w)) for w in workers))


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
        self.files: dict[str, FileEntry] = {}  # the entry of each file of the manifest written so far
        self.metrics = GrowingEntry()  # metrics.jsonl's, as its lines are appended

    def _write(self, name: str, data: bytes) -> None:
        """Write the file ``name`` whole, and keep its entry where the manifest lists it."""
        write_file(self.path / name, data)
        if name in MANIFEST:
            self.files[name] = entry_of(data)

    def write_config(self, cfg: RunConfig) -> None:
        tree = cfg.model_dump(mode="json")
        self._write(CONFIG, yaml.safe_dump(tree, sort_keys=False).encode())
        if self.trackers is not None:
            self.trackers.log_config(flatten(tree))

    def write_partition(self, train_counts: np.ndarray, test_counts: np.ndarray, classes: list[str]) -> None:
        lines = ["split,client," + ",".join(classes) + ",total"]
        for split, counts in (("train", train_counts), ("test", test_counts)):
            for cid, row in enumerate(counts):
                lines.append(f"{split},{cid}," + ",".join(str(int(v)) for v in row) + f",{int(row.sum())}")
        self._write(PARTITION, ("\n".join(lines) + "\n").encode())

    def restore_metrics(self, records: list[dict[str, Any]]) -> None:
        """A resumed run: the lines up to its checkpoint, dropping any the killed run wrote after it; the next
        progress.json lists them (the resume removed the killed run's, :func:`claimed`, and until then its
        checkpoint vouches for the lines: :func:`fedsim.record.verify.check_against_checkpoint`)."""
        data = b"".join(json_line(r) for r in records)
        write_file(self.path / METRICS, data)
        self.metrics = GrowingEntry(data)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One line more, on disk before it counts in the entry progress.json and summary.json list."""
        record = json_safe(record)
        data = json_line(record)
        append_file(self.path / METRICS, data)  # no half line: the lines before it stay readable
        self.metrics.add(data)
        if self.trackers is not None:
            self.trackers.log_metrics(record)

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Write ``model.pt`` (a plain state dict, for ``torch.load``), which the summary lists and ``fedsim
        local`` checks."""
        self._write(MODEL, torch_bytes(state_dict))

    def manifest(self) -> dict[str, FileEntry]:
        """The entry of every file of the manifest written so far (metrics.jsonl's: of its lines so far)."""
        return {**self.files, METRICS: self.metrics.entry()}

    def write_progress(self, server_round: int, loss: float | None, acc: float | None) -> None:
        """The latest round, for whoever shows progress from outside the ServerApp (``fedsim deploy``), and the
        manifest of the files so far, by which an unfinished run's files are checked."""
        progress = json_safe({"round": server_round, "loss": loss, "acc": acc})
        progress.update({VERSION_KEY: RECORD_VERSION, FILES: self.manifest()})
        write_file(self.path / PROGRESS, record_json(PROGRESS, progress))

    def write_error(self, message: str) -> None:
        """Why the run stopped, for a launcher that cannot see the ServerApp's exception."""
        write_file(self.path / ERROR, message.encode())

    def write_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` with the manifest of the run's files and its own checksum; returns it as
        written."""
        summary = {**json_safe(summary), VERSION_KEY: RECORD_VERSION, FILES: self.manifest()}
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
    if isinstance(value, list | tuple):  # a tuple is written as a JSON list too
        return [json_safe(v) for v in value]
    return value
