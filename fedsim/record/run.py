"""A run directory read back whole (``fedsim report``, ``fedsim plot``, :class:`fedsim.app.api.Run`): every file
read (:mod:`fedsim.record.reader`) and checked against the others and the checksums the run recorded
(:mod:`fedsim.record.verify`), finished or still running, into one :class:`RunRecord`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from fedsim.cadence import EvalCadence
from fedsim.config import flatten
from fedsim.config_file import read_run_config
from fedsim.errors import FedsimError
from fedsim.record.layout import CHECKPOINT, CONFIG, PARTITION, PROGRESS, RECORD_FILES, SUMMARY
from fedsim.record.reader import metrics_bytes, read_metrics, read_partition, read_progress, read_summary
from fedsim.record.verify import (
    RESTORE_HINT,
    check_against_checkpoint,
    check_evaluations,
    check_files,
    check_partition,
    check_summary,
)  # fmt: skip


class RunRecord(TypedDict):
    """A run directory as :func:`read_run` returns it."""

    dir: Path
    config: dict[str, Any]  # flattened (fedsim.config.flatten)
    summary: dict[str, Any] | None  # None while the run is unfinished
    metrics: list[dict[str, Any]]
    partition: tuple[list[str], dict[str, np.ndarray]] | None  # None without partition.csv


# a live run moves on while it is read: its progress.json and metrics.jsonl are read again until they are of one
# round (a few tries, each a few milliseconds; the last read is checked as it is)
_READS = 5


def read_run(path: str | Path) -> RunRecord:
    """A run directory read back: ``dir``, ``config`` (flattened), ``summary`` (None while running), ``metrics``,
    ``partition`` (:func:`fedsim.record.reader.read_partition`; None without ``partition.csv``).

    A file that is not what fedsim writes (edited, truncated, another program's), or one that disagrees with
    the others (:func:`fedsim.record.verify.check_summary`, :func:`~fedsim.record.verify.check_metrics`,
    :func:`~fedsim.record.verify.check_evaluations`, :func:`~fedsim.record.verify.check_partition`, and for a run whose
    progress.json a resume removed, :func:`check_against_checkpoint`), is an error naming it; so is a directory
    holding a run's files without its ``config.yaml``."""
    path = Path(path)
    if not (path / CONFIG).exists():
        held = [name for name in RECORD_FILES if (path / name).exists()]
        if not held:
            why = "no config.yaml" if path.is_dir() else "no such directory"
            raise FedsimError(f"{path}: not a run directory ({why})")
        raise FedsimError(f"{path}: a run directory ({', '.join(held)}) without its config.yaml, which says what the "
                          f"run was: {RESTORE_HINT}")  # fmt: skip
    cfg = read_run_config(path / CONFIG, read_back=True)
    cadence = EvalCadence(cfg.eval.every, cfg.train.rounds)
    summary = read_summary(path) if (path / SUMMARY).exists() else None
    progress, data = (None, metrics_bytes(path)) if summary is not None else _progress_and_metrics(path)
    # each file read first: one that is not what fedsim writes is named by its reader, one that is but is not
    # the run's by the manifest
    metrics = read_metrics(path, last=cfg.train.rounds, cadence=cadence, data=data)
    partition = read_partition(path) if (path / PARTITION).exists() else None
    if summary is not None:
        check_summary(path, cfg, summary)
        check_files(path, summary, SUMMARY, data)
    elif progress is not None:
        check_files(path, progress, PROGRESS, data)
    elif (path / CHECKPOINT).exists():  # a resume under way, or one that stopped before its first round
        check_against_checkpoint(path, cfg, data)
    check_evaluations(path, cadence, summary, metrics)
    if partition is not None:
        check_partition(path, cfg, partition[1])
    return {
        "dir": path,
        "config": flatten(cfg.model_dump(mode="json")),
        "summary": summary,
        "metrics": metrics,
        "partition": partition,
    }


def _progress_and_metrics(path: Path) -> tuple[dict[str, Any] | None, bytes]:
    """An unfinished run's progress.json and metrics.jsonl's bytes, read of one round (:data:`_READS`)."""
    for _ in range(_READS):
        progress = read_progress(path) if (path / PROGRESS).exists() else None
        metrics = metrics_bytes(path)
        again = read_progress(path) if (path / PROGRESS).exists() else None
        if again == progress:
            break
    return progress, metrics
