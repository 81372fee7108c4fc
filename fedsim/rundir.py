"""The run directory: everything a run leaves behind, never half-written.

Layout: ``config.yaml`` (resolved), ``partition.csv`` (clients x classes, train and test),
``metrics.jsonl`` (one line per evaluation, flushed as written), ``summary.json``, ``model.pt``,
and ``tb/`` TensorBoard events when asked for; with ``output.checkpoint_every``, ``checkpoint.pt`` and
``client_state/`` (:mod:`fedsim.server.checkpoint`, :mod:`fedsim.client.state`). Whole files are
written to a temp file and renamed.
:func:`read_run` and :func:`read_partition` read a run directory back (``fedsim report`` /
``fedsim plot``), finished or still running.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fedsim.config import RunConfig

PROGRESS = "progress.json"
ERROR = "error.txt"
LOCAL_JSON = "local.json"  # what `fedsim local` ran, in RUN_DIR/local-<k>/ (fedsim.local)


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

    def restore_metrics(self, records: list[dict[str, Any]]) -> None:
        """A resumed run: the lines up to its checkpoint, dropping any the killed run wrote after it."""
        atomic_write(self.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())

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
        return read_metrics(self.path)

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        tmp = self.path / ".model.pt.tmp"
        torch.save(state_dict, tmp)
        os.replace(tmp, self.path / "model.pt")

    def write_progress(self, server_round: int, loss: float | None, acc: float | None) -> None:
        """The latest round, for whoever shows progress from outside the ServerApp (``fedsim deploy``)."""
        atomic_write(self.path / PROGRESS, json.dumps({"round": server_round, "loss": loss, "acc": acc}).encode())

    def write_error(self, message: str) -> None:
        """Why the run stopped, for a launcher that cannot see the ServerApp's exception."""
        atomic_write(self.path / ERROR, message.encode())

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.path / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every line of ``metrics.jsonl`` so far (none before the first evaluation)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"model.norm": "ln", ...}`` (empty sections kept as leaves)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def read_run(path: str | Path) -> dict[str, Any]:
    """A run directory read back: ``dir``, ``config`` (flattened), ``summary`` (None while running), ``metrics``."""
    path = Path(path)
    config_path, summary_path = path / "config.yaml", path / "summary.json"
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    return {
        "dir": path,
        "config": flatten(config or {}),
        "summary": json.loads(summary_path.read_text()) if summary_path.exists() else None,
        "metrics": read_metrics(path),
    }


# Config keys that do not change what a run learns: reports, sweeps and resume ignore them
NOT_LEARNING = ("name", "output.", "simulation.", "diagnostics.", "deploy.")
_IGNORED = ("seed", *NOT_LEARNING)  # reports also average over seeds


def varying_keys(runs: list[dict[str, Any]]) -> list[str]:
    """Flattened config keys whose value differs between runs.

    Not ``name``, ``seed``, nor the ``output``, ``simulation`` and ``diagnostics`` sections: they
    do not change what a run learns (seeds are what ``fedsim report`` averages over).
    """
    keys = sorted({k for r in runs for k in r["config"]})
    return [
        k for k in keys
        if not k.startswith(_IGNORED) and len({json.dumps(r["config"].get(k)) for r in runs}) > 1
    ]


def short_key(key: str) -> str:
    """A config key's label: its last part, or the plugin's for a name (``model.norm.name`` -> norm)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]  # strategy.name -> strategy


def seed_groups(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by the config values they differ in (:func:`varying_keys`), seeds pooled: the rows of
    ``fedsim report`` and the bands of ``fedsim plot --mean-over-seeds``. Keyed by a label naming those
    values (``strategy=fedavg, norm=ln``; a key a run does not set is left out), in the runs' order."""
    keys = varying_keys(runs)
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        values = [(short_key(k), run["config"].get(k)) for k in keys]
        label = ", ".join(f"{k}={v}" for k, v in values if v is not None) or "runs"
        groups.setdefault(label, []).append(run)
    return groups


def read_partition(path: str | Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """``partition.csv`` read back: the class names and, per split, the clients x classes counts."""
    with open(Path(path) / "partition.csv", newline="") as f:
        rows = list(csv.reader(f))
    classes = rows[0][2:-1]
    counts: dict[str, list[list[int]]] = {}
    for split, _client, *cells in rows[1:]:
        counts.setdefault(split, []).append([int(v) for v in cells[:-1]])
    return classes, {split: np.array(c, dtype=np.int64) for split, c in counts.items()}
