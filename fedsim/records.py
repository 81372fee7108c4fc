"""A run directory read back whole (``fedsim report``, ``fedsim plot``, :class:`fedsim.api.Run`): every file
read through :mod:`fedsim.rundir`'s readers and checked against the others (:mod:`fedsim.rundir`'s checks) and,
while the run is unfinished and nothing else records its lines, against its checkpoint
(:mod:`fedsim.server.checkpoint`): numbers that are not the run's are one error naming the file, never a table
or a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.config import read_run_config
from fedsim.errors import FedsimError
from fedsim.rundir import (
    CHECKPOINT,
    CONFIG_CHECKSUM,
    METRICS_CHECKSUM,
    PROGRESS,
    RECORD_FILES,
    RESTORE,
    RESUME,
    SUMMARY,
    MetricsChecksum,
    check_config,
    check_evaluations,
    check_metrics,
    check_partition,
    check_summary,
    flatten,
    lines_of,
    read_metrics,
    read_partition,
    read_progress,
    read_summary,
)  # fmt: skip
from fedsim.server.checkpoint import Checkpoint
from fedsim.server.sampling import EvalCadence


def read_run(path: str | Path) -> dict[str, Any]:
    """A run directory read back: ``dir``, ``config`` (flattened), ``summary`` (None while running), ``metrics``,
    ``partition`` (:func:`read_partition`; None without ``partition.csv``).

    A file that is not what fedsim writes (edited, truncated, another program's), or one that disagrees with
    the others (:func:`check_summary`, :func:`check_metrics`, :func:`check_evaluations`,
    :func:`check_partition`; :func:`check_checkpoint_metrics`), is an error naming it; so is a directory holding
    a run's files without its ``config.yaml``."""
    path = Path(path)
    if not (path / "config.yaml").exists():
        held = [name for name in RECORD_FILES if (path / name).exists()]
        raise FedsimError(f"{path}: a run directory ({', '.join(held)}) without its config.yaml, which says what the "
                          f"run was: {RESTORE}")  # fmt: skip
    cfg = read_run_config(path / "config.yaml", read_back=True)
    summary = read_summary(path) if (path / SUMMARY).exists() else None
    progress = read_progress(path) if summary is None and (path / PROGRESS).exists() else None
    if summary is not None:
        check_summary(path, cfg, summary)
    elif progress is not None:
        check_config(path, progress.get(CONFIG_CHECKSUM), PROGRESS, "ran")
    cadence = EvalCadence(cfg.eval.every, cfg.train.rounds)
    metrics = read_metrics(path, last=cfg.train.rounds, cadence=cadence)
    if summary is not None:
        check_metrics(path, summary, SUMMARY, metrics)
    elif progress is not None and progress.get(METRICS_CHECKSUM) is not None:
        check_metrics(path, progress, PROGRESS, metrics)
    elif (path / CHECKPOINT).exists():  # a resume under way, or one that stopped before its first round
        check_checkpoint_metrics(path, metrics)
    check_evaluations(path, cadence, summary, metrics)
    partition = read_partition(path) if (path / "partition.csv").exists() else None
    if partition is not None:
        check_partition(path, cfg, summary or progress, SUMMARY if summary is not None else PROGRESS, *partition)
    return {
        "dir": path,
        "config": flatten(cfg.model_dump(mode="json")),
        "summary": summary,
        "metrics": metrics,
        "partition": partition,
    }


def check_checkpoint_metrics(path: Path, metrics: list[dict[str, Any]]) -> None:
    """An unfinished run without a progress.json that records its lines (a resume removed the stopped run's, and
    stopped before writing its own): ``metrics.jsonl`` begins with the lines its checkpoint holds (checksummed
    with it), the lines the resume keeps; those after them are the stopped run's, up to its next checkpoint."""
    kept = Checkpoint.load(path).metrics
    if MetricsChecksum(metrics[: len(kept)]).sha256 != MetricsChecksum(kept).sha256:
        raise FedsimError(
            f"{path}: metrics.jsonl does not begin with the {lines_of(len(kept))} its {CHECKPOINT} holds (edited or "
            f"lost after the run, or another run's): {RESUME}"
        )
