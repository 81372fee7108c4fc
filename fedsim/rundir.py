"""The run directory: everything a run leaves behind, never half-written.

Layout: ``config.yaml`` (resolved), ``partition.csv`` (clients x classes, train and test),
``metrics.jsonl`` (one line per evaluation, flushed as written), ``summary.json``, ``model.pt``,
and ``tb/`` TensorBoard events when asked for. Whole files are written to a temp file and renamed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fedsim.config import RunConfig


def default_run_dir(cfg: RunConfig) -> Path:
    if cfg.output.run_dir:
        return Path(cfg.output.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output.dir) / f"{cfg.name}-{stamp}"


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: str | Path, tensorboard: bool = False) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"))

    def write_config(self, cfg: RunConfig) -> None:
        text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
        atomic_write(self.path / "config.yaml", text.encode())

    def write_partition(self, train_counts: np.ndarray, test_counts: np.ndarray, classes: list[str]) -> None:
        lines = ["split,client," + ",".join(classes) + ",total"]
        for split, counts in (("train", train_counts), ("test", test_counts)):
            for cid, row in enumerate(counts):
                lines.append(f"{split},{cid}," + ",".join(str(int(v)) for v in row) + f",{int(row.sum())}")
        atomic_write(self.path / "partition.csv", ("\n".join(lines) + "\n").encode())

    def reset_metrics(self) -> None:
        """A fresh run into an existing directory (e.g. a sweep re-running an interrupted cell)."""
        (self.path / "metrics.jsonl").unlink(missing_ok=True)

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "round":
                    self._tb.add_scalar(key, value, record["round"])
            self._tb.flush()

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        tmp = self.path / ".model.pt.tmp"
        torch.save(state_dict, tmp)
        os.replace(tmp, self.path / "model.pt")

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.path / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
