"""The checksums of record version 1 (and the subset an unversioned record has), which only ``fedsim record
upgrade`` reads (:mod:`fedsim.record.upgrade`): each a :func:`fedsim.digest.digest` of what a file holds as read
back, not of its bytes. :func:`check_legacy` checks those a record has against its files once, before the
upgrade lists the files by size and SHA-256 (:mod:`fedsim.record.manifest`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.config import NOT_LEARNING, flatten
from fedsim.config_file import read_yaml
from fedsim.digest import digest
from fedsim.errors import FedsimError
from fedsim.record.layout import CONFIG, SUMMARY

CONFIG_SHA256, PARTITION_SHA256, SUMMARY_SHA256 = "config_sha256", "partition_sha256", "summary_sha256"
METRICS_SHA256, METRICS_LINES, MODEL_SHA256 = "metrics_sha256", "metrics_lines", "model_sha256"
PAYLOAD_SHA256 = "sha256"  # checkpoint.pt: the digest of its other fields
KEYS = (CONFIG_SHA256, PARTITION_SHA256, METRICS_SHA256, METRICS_LINES, MODEL_SHA256, SUMMARY_SHA256)


def metrics_checksum(lines: list[dict[str, Any]]) -> str:
    """Version 1's checksum of metrics.jsonl: a SHA-256 chained over the digests of its lines."""
    sha256 = ""
    for line in lines:
        sha256 = hashlib.sha256(f"{sha256}:{digest(line)}".encode()).hexdigest()
    return sha256


def config_checksum(tree: dict[str, Any]) -> str:
    """Version 1's checksum of config.yaml: the digest of its keys but :data:`NOT_LEARNING`'s."""
    return digest({k: v for k, v in flatten(tree).items() if not k.startswith(NOT_LEARNING)})


def partition_checksum(classes: list[str], counts: dict[str, np.ndarray]) -> str:
    """Version 1's checksum of partition.csv: the digest of its classes and counts."""
    return digest({"classes": list(classes), **{split: c.tolist() for split, c in counts.items()}})


def summary_checksum(summary: dict[str, Any]) -> str:
    """Version 1's checksum of summary.json: the digest of its other fields as JSON holds them."""
    return digest(json.loads(json.dumps({k: v for k, v in summary.items() if k != SUMMARY_SHA256})))


def check_legacy(
    path: Path, name: str, record: dict[str, Any], metrics: list[dict[str, Any]],
    partition: tuple[list[str], dict[str, np.ndarray]] | None, model: dict[str, Any] | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The checksums ``record`` (``name``: summary.json or progress.json of an older version) has, checked
    against the run's files: its config, the lines of ``metrics`` it covers, its ``partition`` and ``model``
    (model.pt's state dict); returns the lines it covers (those up to its round where it has no count: one
    line more is the round after, which a run wrote before its progress)."""

    def differs(key: str, file: str) -> FedsimError:
        return FedsimError(f"{path}: {file} is not the file the run wrote ({key} in {name} differs; edited after the "
                           "run, or another run's): restore the whole run directory")  # fmt: skip

    def counted(key: str) -> int:  # an older record's count, checked before it slices or compares
        value = record.get(key)
        if type(value) is not int or value < 0:
            raise FedsimError(f"{path}: {name} has {key} = {value!r} where an older fedsim wrote a count (a "
                              "whole number, 0 or more): not the file the run wrote; restore the whole run "
                              "directory")  # fmt: skip
        return value

    if name == SUMMARY and record.get(SUMMARY_SHA256) not in (None, summary_checksum(record)):
        raise differs(SUMMARY_SHA256, SUMMARY)
    recorded = record.get(CONFIG_SHA256)
    if recorded is not None and recorded != config_checksum(read_yaml(path / CONFIG, "the run's config.yaml")):
        raise differs(CONFIG_SHA256, CONFIG)
    if record.get(METRICS_LINES) is not None:
        lines = counted(METRICS_LINES)
        covered = metrics[:lines]
        if len(covered) != lines or metrics_checksum(covered) != record.get(METRICS_SHA256):
            raise differs(METRICS_SHA256, "metrics.jsonl")
        if name == SUMMARY and len(metrics) != len(covered):
            raise differs(METRICS_LINES, "metrics.jsonl")
    elif name == SUMMARY:
        covered = metrics
    else:
        last = counted("round")
        covered = [line for line in metrics if line["round"] <= last]
    if partition is not None and record.get(PARTITION_SHA256) not in (None, partition_checksum(*partition)):
        raise differs(PARTITION_SHA256, "partition.csv")
    if model is not None and record.get(MODEL_SHA256) not in (None, digest(model)):
        raise differs(MODEL_SHA256, "model.pt")
    return covered


def check_checkpoint(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """A version-1 checkpoint's fields (``payload``, read from ``path``) once their digest is the one it holds,
    without it; one without the records of version 1 (clients' state, the data's fingerprint) cannot be
    continued by this fedsim."""
    fields = {k: v for k, v in payload.items() if k != PAYLOAD_SHA256}
    if payload.get(PAYLOAD_SHA256) != digest(fields):
        raise FedsimError(f"{path}: its contents do not match the checksum fedsim wrote with them (the file changed "
                          "on disk after it was written): restore the whole run directory")  # fmt: skip
    if missing := [key for key in ("client_state", "data_sha256") if fields.get(key) is None]:
        raise FedsimError(f"{path}: written by a fedsim before it recorded {missing[0]}, which a resume checks: it "
                          "cannot be upgraded; run the experiment again (or move checkpoint.pt away to upgrade "
                          "the rest)")  # fmt: skip
    return fields
