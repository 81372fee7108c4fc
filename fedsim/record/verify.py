"""The checks of a run directory's files against each other and against the manifest the run recorded
(:mod:`fedsim.record.manifest`): numbers that are not the run's are one error naming the file and what to
do (:data:`RESTORE_HINT`, :data:`RESUME_HINT`), never a table or a figure."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.cadence import EvalCadence
from fedsim.config import RunConfig
from fedsim.errors import ConfigError, FedsimError, FedsimWarning
from fedsim.reading import SUMMARY_BYTES, read_bytes
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.layout import CHECKPOINT, FINAL, LEFT_OUT, MANIFEST, METRICS, PARTITION, PROGRESS
from fedsim.record.manifest import FILES, SUMMARY_CHECKSUM, check_entry, summary_checksum
from fedsim.record.reader import TORCH_BYTES, final_accuracies
from fedsim.record.writer import json_line


class LostEvaluations(FedsimWarning):
    """A run's ``metrics.jsonl`` lacks lines between its first and its last (replaced under the running run):
    the rest is the run's, and read; the curve and the rounds to a target skip the rounds missing."""


class LeftOut(FedsimWarning):
    """A finished run's ``model.pt`` is not in its directory (a record kept or shared without its models): the
    numbers are read without it, its size and SHA-256 still recorded, so a copy put back is checked."""


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
    ``config.yaml`` describes (the same rounds; the file itself is in the manifest, :func:`check_files`)."""
    if summary["rounds"] != cfg.train.rounds:
        raise FedsimError(
            f"{path}: summary.json says the run finished {summary['rounds']} rounds, its config.yaml's train.rounds "
            f"is {cfg.train.rounds}: {RESTORE_HINT}"
        )
    check_summary_checksum(path, summary)


def lines_of(count: int) -> str:
    """``count`` lines, in words."""
    return f"{count} line{'' if count == 1 else 's'}"


def check_files(path: Path, record: dict[str, Any], source: str, metrics: bytes) -> None:
    """Every file of the manifest (:data:`fedsim.record.layout.MANIFEST`) in the run directory is the one
    ``source`` (summary.json of a finished run, progress.json of one still running or stopped: ``record``) lists,
    by size and SHA-256, and every one it lists is there; one progress.json does not list that the run writes
    after it (:data:`fedsim.record.layout.FINAL`) is not read before summary.json lists it. ``metrics``:
    metrics.jsonl's bytes, as parsed. A live run's metrics.jsonl may hold one line more than its progress.json
    lists, of the round after its own, which a run stopped between writing the two wrote last. A config edited
    after the run (a seed, a learning rate) put the run's numbers under another config's label; another run's
    partition or lines, numbers on a curve the run never measured."""
    files = record[FILES]
    hint = RESUME_HINT if source == PROGRESS and (path / CHECKPOINT).is_file() else RESTORE_HINT
    for name in MANIFEST:
        file = path / name
        if name not in files:
            if file.exists() and not (name == METRICS and not metrics) and not (source == PROGRESS and name in FINAL):
                raise FedsimError(
                    f"{file}: not a file the run wrote ({source} lists no {name}: added after the run, or another "
                    f"run's): {hint}"
                )
            continue
        if name == METRICS:
            data = metrics
        elif not file.exists():
            if name in LEFT_OUT and not file.is_symlink():  # a link whose target is gone is no model left out
                why = f"{file}: not in the run directory, where {source} lists it (a record kept without it?)"
                warnings.warn(LeftOut(f"{why}: the numbers are read without it"), stacklevel=2)
                continue
            raise FedsimError(f"{file}: missing, where {source} lists the file the run wrote: {hint}")
        else:
            data = read_bytes(file, f"the run's {name}", TORCH_BYTES if name.endswith(".pt") else SUMMARY_BYTES,
                              FedsimError)  # fmt: skip
        tail = (lambda more: _next_round(more, record["round"])) if source == PROGRESS and name == METRICS else None
        check_entry(file, data, files[name], f"{source}'s {FILES}", hint, tail)


def _next_round(more: bytes, last: int) -> bool:
    """``more`` (metrics.jsonl past what progress.json of round ``last`` lists) is the one line of the round after."""
    if more.count(b"\n") != 1 or not more.endswith(b"\n"):
        return False
    try:
        line = json.loads(more)
    except ValueError:  # a blank line, or not JSON
        return False
    return isinstance(line, dict) and line.get("round") == last + 1


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


def check_partition(path: Path, cfg: RunConfig, counts: dict[str, np.ndarray]) -> None:
    """A run's ``partition.csv`` has a row per client of its config in each split (its bytes are in the
    manifest, :func:`check_files`)."""
    file = path / PARTITION
    shapes = {split: len(c) for split, c in counts.items()}
    if sorted(shapes) != ["test", "train"] or set(shapes.values()) != {cfg.train.num_clients}:
        raise FedsimError(
            f"{file}: rows per split {shapes}, where the run's config.yaml has {cfg.train.num_clients} clients "
            f"(train.num_clients) in each of train and test: {RESTORE_HINT}"
        )


def check_against_checkpoint(path: Path, cfg: RunConfig, metrics: bytes) -> None:
    """An unfinished run without progress.json (a resume removed the stopped run's, and stopped before writing its
    own, or has not written it yet): its checkpoint (checksummed) vouches instead. ``config.yaml`` trains as the
    checkpoint's config does, and ``metrics.jsonl`` (``metrics``: its bytes) begins with the lines the checkpoint
    holds, which the resume keeps; those after them are the stopped run's, up to its next checkpoint."""
    try:
        kept = Checkpoint.load(path, cfg).metrics
    except ConfigError as err:  # config.yaml edited since: said of this run
        raise FedsimError(f"{path}: {err}") from err
    if not metrics.startswith(b"".join(json_line(line) for line in kept)):
        raise FedsimError(
            f"{path}: {METRICS} does not begin with the {lines_of(len(kept))} its {CHECKPOINT} holds (edited or "
            f"lost after the run, or another run's): {RESUME_HINT}"
        )
