"""A run directory read back whole (``fedsim report``, ``fedsim plot``, :class:`fedsim.api.Run`): every file
read through :mod:`fedsim.rundir`'s readers and checked against the others (:mod:`fedsim.rundir`'s checks) and,
while the run is unfinished and has no progress.json, against its checkpoint
(:mod:`fedsim.server.checkpoint`): numbers that are not the run's are one error naming the file, never a table
or a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.config import RunConfig
from fedsim.config_file import read_run_config
from fedsim.errors import ConfigError, FedsimError
from fedsim.rundir import (
    CHECKPOINT,
    CONFIG_CHECKSUM,
    PROGRESS,
    RECORD_FILES,
    RESTORE_HINT,
    RESUME_HINT,
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

# a live run moves on while it is read: its progress.json and metrics.jsonl are read again until they are of one
# round (a few tries, each a few milliseconds; the last read is checked as it is)
_READS = 5


def read_run(path: str | Path) -> dict[str, Any]:
    """A run directory read back: ``dir``, ``config`` (flattened), ``summary`` (None while running), ``metrics``,
    ``partition`` (:func:`fedsim.rundir.read_partition`; None without ``partition.csv``).

    A file that is not what fedsim writes (edited, truncated, another program's), or one that disagrees with
    the others (:func:`fedsim.rundir.check_summary`, :func:`~fedsim.rundir.check_metrics`,
    :func:`~fedsim.rundir.check_evaluations`, :func:`~fedsim.rundir.check_partition`, and for a run whose
    progress.json a resume removed, :func:`check_against_checkpoint`), is an error naming it; so is a directory
    holding a run's files without its ``config.yaml``."""
    path = Path(path)
    if not (path / "config.yaml").exists():
        held = [name for name in RECORD_FILES if (path / name).exists()]
        raise FedsimError(f"{path}: a run directory ({', '.join(held)}) without its config.yaml, which says what the "
                          f"run was: {RESTORE_HINT}")  # fmt: skip
    cfg = read_run_config(path / "config.yaml", read_back=True)
    cadence = EvalCadence(cfg.eval.every, cfg.train.rounds)
    summary = read_summary(path) if (path / SUMMARY).exists() else None
    if summary is not None:
        check_summary(path, cfg, summary)
        progress, metrics = None, read_metrics(path, last=cfg.train.rounds, cadence=cadence)
        check_metrics(path, summary, SUMMARY, metrics)
    else:
        progress, metrics = _progress_and_metrics(path, cfg.train.rounds, cadence)
        if progress is not None:
            check_config(path, progress.get(CONFIG_CHECKSUM), PROGRESS, "ran")
            check_metrics(path, progress, PROGRESS, metrics)
        elif (path / CHECKPOINT).exists():  # a resume under way, or one that stopped before its first round
            check_against_checkpoint(path, cfg, metrics)
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


def _progress_and_metrics(
    path: Path, rounds: int, cadence: EvalCadence
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """An unfinished run's progress.json and metrics.jsonl, read of one round (:data:`_READS`)."""
    for _ in range(_READS):
        progress = read_progress(path) if (path / PROGRESS).exists() else None
        metrics = read_metrics(path, last=rounds, cadence=cadence)
        again = read_progress(path) if (path / PROGRESS).exists() else None
        if again == progress:
            break
    return progress, metrics


def check_against_checkpoint(path: Path, cfg: RunConfig, metrics: list[dict[str, Any]]) -> None:
    """An unfinished run without progress.json (a resume removed the stopped run's, and stopped before writing its
    own, or has not written it yet): its checkpoint (checksummed) vouches instead. ``config.yaml`` trains as the
    checkpoint's config does, and ``metrics.jsonl`` begins with the lines the checkpoint holds, which the resume
    keeps; those after them are the stopped run's, up to its next checkpoint."""
    try:
        kept = Checkpoint.load(path, cfg).metrics
    except ConfigError as err:  # config.yaml edited since: said of this run
        raise FedsimError(f"{path}: {err}") from err
    if MetricsChecksum(metrics[: len(kept)]).sha256 != MetricsChecksum(kept).sha256:
        raise FedsimError(
            f"{path}: metrics.jsonl does not begin with the {lines_of(len(kept))} its {CHECKPOINT} holds (edited or "
            f"lost after the run, or another run's): {RESUME_HINT}"
        )
