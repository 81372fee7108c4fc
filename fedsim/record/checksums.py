"""The checksums a run directory records of its files, so that a file that changed on disk after fedsim wrote
it is refused instead of reported, trained on or continued from.

:func:`digest` is a SHA-256 over a canonical encoding of a value, not of a file's bytes: it is the same for the
same tensors and fields however ``torch.save`` lays them out, and it covers every byte of every tensor (a flipped
bit in a weight, which ``torch.load`` reads without complaint, changes it). The record's checksums are digests of
what each file holds as read back: :func:`config_checksum`, :func:`partition_checksum`, :class:`MetricsChecksum`
(chained over metrics.jsonl's lines), :func:`summary_checksum`, the model's and the checkpoint's payload.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.config import NOT_LEARNING, RunConfig, flatten
from fedsim.errors import FedsimError
from fedsim.record.layout import VERSION_KEY

MODEL_CHECKSUM = "model_sha256"  # summary.json: model.pt's checksum (digest)
CONFIG_CHECKSUM = "config_sha256"  # summary.json, progress.json: config.yaml's checksum (config_checksum)
PARTITION_CHECKSUM = "partition_sha256"  # summary.json, progress.json: partition.csv's (partition_checksum)
METRICS_CHECKSUM = "metrics_sha256"  # summary.json, progress.json: metrics.jsonl's lines' (MetricsChecksum)
METRICS_LINES = "metrics_lines"  # summary.json, progress.json: how many lines of metrics.jsonl it covers
SUMMARY_CHECKSUM = "summary_sha256"  # summary.json: the checksum of its other fields (summary_checksum)
DATA_FINGERPRINT = "data_sha256"  # checkpoint.pt, summary.json: the data's fingerprint (fedsim.data.fingerprint)
# summary.json's keys for fedsim, not for reading
CHECKSUMS = (MODEL_CHECKSUM, CONFIG_CHECKSUM, PARTITION_CHECKSUM, METRICS_CHECKSUM, METRICS_LINES, SUMMARY_CHECKSUM)
# what a summary holds for fedsim to check files against, not for a researcher to read: summaries shown leave them out
CHECKS = (*CHECKSUMS, DATA_FINGERPRINT, VERSION_KEY)


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}:".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"list:{len(value)}:".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        data = value.encode()
        h.update(f"str:{len(data)}:".encode() + data)
    elif value is None or isinstance(value, (bool, int, float)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"no canonical encoding for {type(value).__name__}")


def digest(value: Any) -> str:
    """SHA-256 (hex) of ``value``: nested dicts, lists and tuples of tensors, strings, numbers, None."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def verify(path: Path, value: Any, expected: object) -> None:
    """Refuse ``value`` read from ``path`` unless its digest is ``expected`` (what fedsim wrote with it)."""
    if not isinstance(expected, str):
        raise FedsimError(f"{path}: no checksum to check it against (written by a fedsim without checksums, "
                          "or not by fedsim): refused")  # fmt: skip
    if digest(value) != expected:
        raise FedsimError(f"{path}: its contents do not match the checksum fedsim wrote with them (the file "
                          "changed on disk after it was written): refused")  # fmt: skip


class MetricsChecksum:
    """A SHA-256 chained over metrics.jsonl's lines, each as read back (:func:`fedsim.record.checksums.digest` of its
    values, so key order and spacing do not count), and how many lines it covers: one line more is one step, so
    a run that appends a line per evaluation keeps it up to date without reading the file again."""

    def __init__(self, values: Iterable[dict[str, Any]] = ()) -> None:
        self.sha256, self.lines = "", 0
        for value in values:
            self.add(value)

    def add(self, value: dict[str, Any]) -> None:
        self.sha256 = hashlib.sha256(f"{self.sha256}:{digest(value)}".encode()).hexdigest()
        self.lines += 1

    def record(self) -> dict[str, Any]:
        """What progress.json and summary.json record of the lines so far."""
        return {METRICS_CHECKSUM: self.sha256, METRICS_LINES: self.lines}


def config_tree(cfg: RunConfig) -> dict[str, Any]:
    """The sections of ``cfg`` as a run directory's config.yaml holds them."""
    return cfg.model_dump(mode="json")


def config_checksum(tree: dict[str, Any]) -> str:
    """The checksum (:func:`fedsim.record.checksums.digest`) of what a config's sections ``tree`` (as config.yaml holds
    them) say a run learns: its keys but :data:`NOT_LEARNING`'s, which a resumed run may change (its directory
    moved) and reports ignore. Of the file's own keys (:func:`config_tree` where the run writes it), not of a
    validated config's: a later fedsim that adds a key (with its default) still finds an earlier run's
    config.yaml unchanged."""
    flat = flatten(tree)
    return digest({key: value for key, value in flat.items() if not key.startswith(NOT_LEARNING)})


def summary_checksum(summary: dict[str, Any]) -> str:
    """The checksum (:func:`fedsim.record.checksums.digest`) of a summary's fields but its own (``summary_sha256``), as
    JSON holds them: every number a report or ``fedsim.open_run`` shows (wall time, speed) is the run's."""
    return digest(json.loads(json.dumps({k: v for k, v in summary.items() if k != SUMMARY_CHECKSUM})))


def partition_checksum(classes: list[str], counts: dict[str, np.ndarray]) -> str:
    """The checksum (:func:`fedsim.record.checksums.digest`) of a partition table: its class names and, per split, the
    clients x classes counts (of what the table says, not of its bytes)."""
    return digest({"classes": list(classes), **{split: c.tolist() for split, c in counts.items()}})
