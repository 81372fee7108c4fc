"""A run directory as a run writes it (fedsim/record/writer.py): every file whole, metrics a line at a time, and the
manifest in progress.json and summary.json matching the bytes on disk. The record read back and verified:
tests/test_reader.py, tests/test_record_verify.py; a full disk mid-write: tests/test_ownership.py."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from fedsim.record.layout import RECORD_VERSION
from fedsim.record.manifest import summary_checksum
from fedsim.record.reader import read_partition
from fedsim.record.writer import RunDir, json_safe


def entry(path: Path) -> dict[str, object]:
    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_the_manifest_lists_every_file_as_it_is_on_disk(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.write_partition(np.array([[3, 1], [0, 5]]), np.array([[2, 0], [0, 1]]), ["cat", "dog"])
    run.append_metrics({"round": 2, "client_mean_acc": 0.5})
    run.write_progress(2, 0.7, 0.5)
    progress = json.loads((run.path / "progress.json").read_text())
    assert progress["round"] == 2 and progress["record_version"] == RECORD_VERSION
    assert progress["files"] == {"partition.csv": entry(run.path / "partition.csv"),
                                 "metrics.jsonl": entry(run.path / "metrics.jsonl")}  # fmt: skip
    run.append_metrics({"round": 4, "client_mean_acc": 0.6})
    run.save_model({"w": torch.ones(2)})
    summary = run.write_summary({"rounds": 4, "final_client_mean_acc": 0.6})
    assert summary == json.loads((run.path / "summary.json").read_text())
    assert summary["files"]["metrics.jsonl"] == entry(run.path / "metrics.jsonl")  # both lines, kept up to date
    assert summary["files"]["model.pt"] == entry(run.path / "model.pt")
    assert summary["summary_sha256"] == summary_checksum(summary)
    assert torch.equal(torch.load(run.path / "model.pt", weights_only=True)["w"], torch.ones(2))
    assert read_partition(run.path)[0] == ["cat", "dog"]


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.append_metrics({"round": 1, "train_loss": math.inf, "per_class_acc": [0.5, math.nan], "x": {"y": -math.inf}})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "round": 1, "train_loss": None, "per_class_acc": [0.5, None], "x": {"y": None}}  # fmt: skip
    assert json_safe({"a": (1.0, math.nan)}) == {"a": [1.0, None]}  # a tuple is a JSON list too


def test_a_resumed_run_restores_the_lines_up_to_its_checkpoint(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for r in (2, 4, 6):
        run.append_metrics({"round": r, "client_mean_acc": r / 10})
    resumed = RunDir(tmp_path)
    resumed.restore_metrics(run.read_metrics()[:2])  # the checkpoint was at round 4
    resumed.append_metrics({"round": 6, "client_mean_acc": 0.65})
    assert [m["client_mean_acc"] for m in resumed.read_metrics()] == [0.2, 0.4, 0.65]
    assert resumed.manifest()["metrics.jsonl"] == entry(tmp_path / "metrics.jsonl")
