"""The checks of a run directory's files against each other and against the checksums the run recorded
(:mod:`fedsim.record.checksums`): numbers that are not the run's are one error naming the file and what to
do (:data:`RESTORE_HINT`, :data:`RESUME_HINT`), never a table or a figure."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.cadence import EvalCadence
from fedsim.config import RunConfig
from fedsim.config_file import read_yaml
from fedsim.errors import ConfigError, FedsimError, FedsimWarning
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.checksums import (
    CONFIG_CHECKSUM,
    METRICS_CHECKSUM,
    METRICS_LINES,
    PARTITION_CHECKSUM,
    SUMMARY_CHECKSUM,
    MetricsChecksum,
    config_checksum,
    partition_checksum,
    summary_checksum,
)  # fmt: skip
from fedsim.record.layout import CHECKPOINT, CONFIG, METRICS, PARTITION, PROGRESS, SUMMARY
from fedsim.record.reader import final_accuracies


class LostEvaluations(FedsimWarning):
    """A run's ``metrics.jsonl`` lacks lines between its first and its last (replaced under the running run):
    the rest is the run's, and read; the curve and the rounds to a target skip the rounds missing."""


RESTORE_HINT = "restore the whole run directory, or move it out of the directories given"
# a stopped run rewrites its metrics.jsonl from its checkpoint on resume (or its directory is restored)
RESUME_HINT = f"`fedsim run --resume` it from its {CHECKPOINT} (which rewrites the lines), or {RESTORE_HINT}"


def check_summary_checksum(path: Path, summary: dict[str, Any]) -> None:
    """``summary.json``'s own checksum (:func:`summary_checksum`) is that of its other fields."""
    if summary[SUMMARY_CHECKSUM] != summary_checksum(summary):
        raise FedsimError(
            f"{path}: summary.json is not the summary the run wrote ({SUMMARY_CHECKSUM} differs: a field edited after "
            f"the run): {RESTORE_HINT}"
        )


def check_summary(path: Path, cfg: RunConfig, summary: dict[str, Any]) -> None:
    """A finished run's ``summary.json`` is the one it wrote (:func:`summary_checksum`), of the run its
    ``config.yaml`` describes: the same rounds and the same :func:`config_checksum`. A config edited after the
    run (a seed, a learning rate) put the run's numbers under another config's label, or made two copies of a run
    two seeds."""
    if summary["rounds"] != cfg.train.rounds:
        raise FedsimError(
            f"{path}: summary.json says the run finished {summary['rounds']} rounds, its config.yaml's train.rounds "
            f"is {cfg.train.rounds}: {RESTORE_HINT}"
        )
    check_summary_checksum(path, summary)
    check_config(path, summary[CONFIG_CHECKSUM], SUMMARY, "finished with")


def check_config(path: Path, recorded: str, source: str, did: str) -> None:
    """The run's ``config.yaml`` is the config whose :func:`config_checksum` ``source`` (summary.json of a finished
    run, progress.json of one still running or stopped) recorded."""
    if recorded != config_checksum(read_yaml(path / CONFIG, "the run's config.yaml")):
        raise FedsimError(
            f"{path}: config.yaml is not the config the run {did} ({CONFIG_CHECKSUM} in {source} differs; edited "
            f"after the run, or another run's): {RESTORE_HINT}"
        )


def lines_of(count: int) -> str:
    """``count`` lines, in words."""
    return f"{count} line{'' if count == 1 else 's'}"


def check_metrics(path: Path, recorded: dict[str, Any], source: str, metrics: list[dict[str, Any]]) -> None:
    """A run's ``metrics.jsonl`` holds the lines the run wrote, as ``source`` records them (:class:`MetricsChecksum`):
    all of them after summary.json; after progress.json, the lines it
    covers and at most the one line of the round after its own, which a run stopped between writing the two
    wrote last. A line of another run spliced in, or one edited, added or lost, put numbers on a curve that the
    run never measured."""
    sha256, count = recorded[METRICS_CHECKSUM], recorded[METRICS_LINES]
    if source == SUMMARY and not metrics:  # none: check_evaluations says it
        return
    extra = metrics[count:]
    hint = RESUME_HINT if source == PROGRESS and (path / CHECKPOINT).is_file() else RESTORE_HINT
    if source == SUMMARY and len(metrics) != count:
        raise FedsimError(
            f"{path}: metrics.jsonl has {lines_of(len(metrics))} where the run wrote {count} ({METRICS_LINES} in "
            f"{source}; lines lost or added after the run): {RESTORE_HINT}"
        )
    if len(metrics) < count or len(extra) > 1 or (extra and extra[0]["round"] != recorded["round"] + 1):
        raise FedsimError(
            f"{path}: metrics.jsonl has {lines_of(len(metrics))} (to round {metrics[-1]['round'] if metrics else 0}) "
            f"where the run had written {count} by round {recorded['round']} ({METRICS_LINES} and round in "
            f"{source}; lines lost or added since): {hint}"
        )
    if MetricsChecksum(metrics[:count]).sha256 != sha256:
        raise FedsimError(
            f"{path}: metrics.jsonl's lines are not the ones the run wrote ({METRICS_CHECKSUM} in {source} differs; "
            f"edited after the run, or another run's): {hint}"
        )


def check_evaluations(
    path: Path, cadence: EvalCadence, summary: dict[str, Any] | None, metrics: list[dict[str, Any]]
) -> None:
    """A run's ``metrics.jsonl`` (each line at a round the run evaluated, :func:`read_metrics`) holds every
    evaluation of the rounds run so far. A finished run (``summary``) evaluated its last round (``cadence``):
    lines missing at the end (a truncated file, a partial copy) are an error, since a report showed the summary's
    final numbers beside a curve and a rounds-to-target of fewer rounds; so are summary numbers its lines do not
    give (:func:`final_accuracies`). Lines missing before the last are a warning (:class:`LostEvaluations`)."""
    rounds = [line["round"] for line in metrics]
    if summary is not None:
        if not rounds:
            raise FedsimError(
                f"{path}: a finished run of {summary['rounds']} rounds (summary.json) whose metrics.jsonl is "
                f"empty or missing: {RESTORE_HINT}"
            )
        if rounds[-1] != cadence.num_rounds:
            raise FedsimError(
                f"{path}: metrics.jsonl ends at round {rounds[-1]} but the run finished {cadence.num_rounds} rounds "
                f"(summary.json), the last of which it evaluates: {RESTORE_HINT}"
            )
        for key, value in final_accuracies(metrics).items():
            if summary[key] != value:
                raise FedsimError(
                    f"{path}: summary.json's {key} is {summary[key]}, its metrics.jsonl's {value}: one of them was "
                    f"edited or is another run's; {RESTORE_HINT}"
                )
    evaluated = [r for r in range(1, rounds[-1] + 1) if cadence.is_eval_round(r)] if rounds else []
    if lost := sorted(set(evaluated) - set(rounds)):
        shown = ", ".join(map(str, lost[:5])) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        warnings.warn(
            f"{path / METRICS} has no line for round{'s' if len(lost) > 1 else ''} {shown} of the rounds "
            f"the run evaluated (eval.every: {cadence.every}): its curve and rounds to a target skip them",
            LostEvaluations,
            stacklevel=2,
        )


def check_partition(
    path: Path, cfg: RunConfig, recorded: dict[str, Any] | None, source: str, classes: list[str],
    counts: dict[str, np.ndarray],
) -> None:  # fmt: skip
    """A run's ``partition.csv`` is its own: a row per client of its config in each split and, where ``source``
    (the summary of a finished run, the progress of one not finished: ``recorded``; None while a resume's checkpoint
    vouches for the run) records one, the same :func:`partition_checksum`. Another run's table (another seed, beta
    or dataset) drew a label distribution the run never trained on."""
    file = path / PARTITION
    shapes = {split: len(c) for split, c in counts.items()}
    if sorted(shapes) != ["test", "train"] or set(shapes.values()) != {cfg.train.num_clients}:
        raise FedsimError(
            f"{file}: rows per split {shapes}, where the run's config.yaml has {cfg.train.num_clients} clients "
            f"(train.num_clients) in each of train and test: {RESTORE_HINT}"
        )
    if recorded is not None and recorded.get(PARTITION_CHECKSUM) != partition_checksum(classes, counts):
        raise FedsimError(
            f"{path}: partition.csv is not the partition the run trained on ({PARTITION_CHECKSUM} in {source} "
            f"differs; edited after the run, or another run's): {RESTORE_HINT}"
        )


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
