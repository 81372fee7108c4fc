"""The run directory: everything a run leaves behind, never half-written.

Layout: ``config.yaml`` (resolved), ``partition.csv`` (clients x classes, train and test),
``metrics.jsonl`` (one line per evaluation, flushed as written), ``summary.json``, ``model.pt``,
and ``tb/`` TensorBoard events when asked for; with ``output.checkpoint_every``, ``checkpoint.pt`` and
``client_state/`` (:mod:`fedsim.server.checkpoint`, :mod:`fedsim.client.state`). Every file is written
through :mod:`fedsim.files`: whole files to a temp file and renamed, never through a link.

One live run owns a run directory (:func:`claimed`): an exclusive lock that the operating system
releases when its process ends, however it ends, so a lock is never stale. A fresh run refuses a
directory that is not fedsim's (:mod:`fedsim.ownership`), one that holds a finished run or one it could
resume, and clears the leftovers of a run that was killed with nothing to resume; a link in it (to a file
or a directory elsewhere) stops the command before anything is written (:func:`fedsim.files.check_links`).
A write that fails (a full disk) is one error naming the file; it leaves no temp file, and what was written
before it stays.
What the run writes carries checksums of the rest: progress.json, each round, of the config, the partition and
the metrics lines so far (:class:`MetricsChecksum`); summary.json of the same, the model, and itself
(:func:`summary_checksum`).
:func:`fedsim.records.read_run` reads a run directory back (``fedsim report`` / ``fedsim plot``), finished or
still running, through this module's readers (:mod:`fedsim.reading` underneath: the config validated, the
summary and the metrics checked against their schemas, :class:`Summary`, :class:`MetricsRecord`) and checks
(:func:`check_summary`, :func:`check_metrics`, :func:`check_evaluations`, :func:`check_partition`);
:func:`read_progress` and :func:`read_error` read what a launcher polls while the ServerApp runs
(:class:`Progress`, ``error.txt``).
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError, from_json

from fedsim.config import RunConfig
from fedsim.config_file import read_yaml
from fedsim.data.fingerprint import DATA_FINGERPRINT
from fedsim.errors import DataError, FedsimError, FedsimWarning
from fedsim.files import append_file, check_links, open_file, remove, write_file
from fedsim.integrity import digest
from fedsim.ownership import MARKER, RESULTS, RESULTS_BESIDE, check_own, mark_own, unusable
from fedsim.reading import SUMMARY_BYTES, read_json, read_json_lines, read_text
from fedsim.server.sampling import EvalCadence

PROGRESS = "progress.json"
ERROR = "error.txt"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
MODEL_CHECKSUM = "model_sha256"  # summary.json: model.pt's checksum (fedsim.integrity)
CONFIG_CHECKSUM = "config_sha256"  # summary.json: config.yaml's checksum (config_checksum)
# summary.json, progress.json: partition.csv's checksum (partition_checksum)
PARTITION_CHECKSUM = "partition_sha256"
METRICS_CHECKSUM = "metrics_sha256"  # summary.json, progress.json: metrics.jsonl's lines' checksum (MetricsChecksum)
METRICS_LINES = "metrics_lines"  # summary.json, progress.json: how many lines of metrics.jsonl it covers
SUMMARY_CHECKSUM = "summary_sha256"  # summary.json: the checksum of its other fields (summary_checksum)
# summary.json's keys for fedsim, not for reading
CHECKSUMS = (MODEL_CHECKSUM, CONFIG_CHECKSUM, PARTITION_CHECKSUM, METRICS_CHECKSUM, METRICS_LINES, SUMMARY_CHECKSUM)
CLIENT_STATE = "client_state"  # the nodes' state files of a checkpoint, under the run directory (by default)
LOCK = ".lock"
# A launcher that holds a run directory for the ServerApp it starts (fedsim deploy) names it here
HELD_ENV = "FEDSIM_RUN_DIR_HELD"
# What a run leaves behind: what a fresh run clears from a killed run's directory
RUN_FILES = ("config.yaml", "partition.csv", "metrics.jsonl", SUMMARY, "model.pt", CHECKPOINT, PROGRESS, ERROR)
RUN_DIRS = ("tb", CLIENT_STATE, "deploy")
# What a fresh run writes before it records anything (a metrics line, a checkpoint): a run directory holding
# nothing else when its run fails is taken back (claimed)
BEFORE_RECORDS = ("config.yaml", "partition.csv", PROGRESS, "tb", LOCK, MARKER)
# What fedsim writes in a run directory itself (a tracker's library writes its own, wandb/ its own links)
RUN_ENTRIES = (LOCK, MARKER, *RUN_FILES, *RUN_DIRS)
# The files of a run's record: a directory holding any of them is a run directory to read back, whole
RECORD_FILES = ("config.yaml", "partition.csv", "metrics.jsonl", SUMMARY, CHECKPOINT, PROGRESS)
LOCAL_JSON = "local.json"  # what `fedsim local` ran, in RUN_DIR/local-<k>/ (fedsim.local)


def default_run_dir(cfg: RunConfig) -> Path:
    if cfg.output.run_dir:
        return Path(cfg.output.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output.dir) / f"{cfg.name}-{stamp}"


def torch_write(path: Path, value: Any, fsync: bool = False) -> None:
    """``torch.save(value)`` into ``path`` by :func:`fedsim.files.write_file` (``fsync``: synced before it is
    renamed, as checkpoints are): serialised in memory first, since torch's own writer turns a full disk into a
    RuntimeError at an arbitrary place in the file."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    write_file(path, buffer.getbuffer(), fsync=fsync)


def check_fresh(path: Path, field: str = "output.run_dir", kind: str = "run") -> None:
    """Refuse to start afresh in a directory that is not fedsim's ``kind`` (:func:`fedsim.ownership.check_own`)
    or that holds a finished run or one that could resume."""
    if (path / SUMMARY).is_file():
        raise FedsimError(
            f"output.run_dir {path} holds a finished run ({SUMMARY}); give this run another output.run_dir, "
            "or delete that directory to redo it"
        )
    if (path / CHECKPOINT).is_file():
        raise FedsimError(
            f"output.run_dir {path} holds an unfinished run with a checkpoint: continue it with "
            f"`fedsim run --resume {path}`, or delete that directory to start over"
        )
    check_own(path, kind, field)


def make_dir(path: Path, field: str = "output.run_dir") -> None:
    """``path`` as a directory fedsim can make entries in, or an error naming the config field and the part of
    ``path`` at fault (a file, a symlink loop, a directory where nothing can be made)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise (unusable(path, field) or FedsimError(f"{field}: cannot create {path}: {err.strerror}")) from err
    try:  # a directory made and removed: what access(2) cannot tell (/proc says writable; a read-only mount)
        os.rmdir(tempfile.mkdtemp(prefix=".fedsim-probe-", dir=path))
    except OSError as err:
        raise FedsimError(f"{field}: cannot create anything in {path}: {err.strerror}") from err


def make_results_dir(path: Path, field: str, names: Iterable[str]) -> None:
    """``path`` as a directory for ``fedsim report``'s and ``fedsim plot``'s files (``names``), which replace
    their own there: a new one or fedsim's (:func:`fedsim.ownership.check_own`), else an error naming ``field``
    (the option that chooses another); one of those files that is a link there is refused before any is
    written (:func:`fedsim.files.check_links`)."""
    check_own(path, RESULTS, field, RESULTS_BESIDE)
    check_links(path, [MARKER, *names])
    make_dir(path, field)
    mark_own(path, RESULTS)


def runs_root(path: str | Path, arg: str) -> Path:
    """``path`` as a directory to read runs from, or an error naming the argument ``arg`` that gave it."""
    path = Path(path)
    if not path.is_dir():
        missing = "" if path.exists() else " (nothing is there)"
        raise FedsimError(
            f"{arg} {path} is not a directory{missing}: give a run directory or a directory holding run directories"
        )
    return path


def resolved(path: Path, field: str) -> Path:
    """``path`` made absolute, symlinks followed; a symlink loop is an error naming the link at fault."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: Python 3.11's pathlib on a loop
        raise (unusable(path, field) or FedsimError(f"{field}: {path}: {err}")) from err


def check_run_links(path: Path, entries: Iterable[str] = ()) -> None:
    """Refuse a link among what fedsim writes in the run directory ``path`` (:data:`RUN_ENTRIES`, and
    ``entries`` of another kind of directory of fedsim's), or below those that are directories: before it
    writes there, so that the link stops it before anything is written (:func:`fedsim.files.check_links`)."""
    check_links(path, [*RUN_ENTRIES, *entries])


@contextmanager
def claimed(
    path: Path,
    resume: bool = False,
    field: str = "output.run_dir",
    owner: str = "run",
    made: bool = False,
    entries: Iterable[str] = (),
) -> Iterator[None]:
    """Own ``path`` for one ``owner`` (a run, a sweep) while the block runs: a fresh run (``resume`` false)
    also clears the leftovers of a killed run there, a resumed one the stopped server's ``progress.json`` and
    ``error.txt``; a directory another live one owns is an error naming its pid. ``field``: the config field
    or argument that named ``path``, for messages. Only a directory that is fedsim's ``owner`` is claimed
    (:mod:`fedsim.ownership`), and marked so; except a run resumed, whose checkpoint (checksummed,
    :mod:`fedsim.integrity`) shows it is fedsim's, marked or not. A link among what fedsim writes there
    (:func:`check_run_links`, with the ``entries`` of another ``owner``) is refused before anything is written
    (``path`` itself, the user's, is followed once). A fresh run that fails before it records anything takes
    back what it wrote (:func:`take_back`); the directory too if the run made it (``made``: by its caller, or
    here)."""
    path = resolved(path, field)
    if not resume:
        check_fresh(path, field, owner)
    elif owner != "run":
        check_own(path, owner, field)
    check_run_links(path, entries)
    made = made or not path.exists()
    make_dir(path, field)
    marked = (path / MARKER).is_file()
    if not (resume and owner == "run"):
        mark_own(path, owner)
    if os.environ.get(HELD_ENV) == str(path):  # the launcher that started this process owns it for us
        yield
        return
    fd = open_file(path / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise FedsimError(
                f"{field} {path} is in use by another fedsim {owner} ({holder}); wait for it to end, or give "
                f"this {owner} another {field}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        if not resume:
            check_fresh(path, field, owner)  # again, now that nobody else can write here
            for name in (*RUN_FILES, *RUN_DIRS):
                remove(path / name)
        else:  # not this run's: a launcher that polls them would show the old round, or stop at the old error
            for name in (PROGRESS, ERROR):
                remove(path / name)
        try:
            yield
        except BaseException:
            if not resume and owner == "run":  # while the lock is held: no other run is writing here
                take_back(path, marked, made)
            raise
    finally:
        os.close(fd)  # releases the lock


def records_nothing(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds nothing but what a fresh run writes before it records anything."""
    with os.scandir(run_dir) as entries:
        return all(entry.name in BEFORE_RECORDS for entry in entries)


def take_back(run_dir: Path, marked: bool, made: bool) -> None:
    """A fresh run's directory, when its run failed having recorded nothing (:func:`records_nothing`), as the run
    found it: its files, its lock and its mark (unless ``marked`` before) removed, and the directory itself if the
    run ``made`` it. Anything else there (a log the error names, an error.txt) keeps every file where it is. A
    removal that fails leaves the rest: the run's own error is the one reported."""
    try:
        if not records_nothing(run_dir):
            return
        with os.scandir(run_dir) as entries:
            names = [e.name for e in entries if not (marked and e.name == MARKER)]
        for name in names:
            remove(run_dir / name, run_dir)
        if made:
            run_dir.rmdir()  # fails if another run has claimed it since: it stays, theirs
    except (OSError, FedsimError):  # a removal refused or failed: the run's own error is the one reported
        return


def _metrics_line(record: dict[str, Any]) -> bytes:
    """A metrics record (JSON-safe: :func:`json_safe` applied, or read back from the file) as its line."""
    return (json.dumps(record, allow_nan=False) + "\n").encode()


class MetricsChecksum:
    """A SHA-256 chained over metrics.jsonl's lines, each as read back (:func:`fedsim.integrity.digest` of its
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


class RunDir:
    """A run's directory as the run writes it. ``trackers`` (:func:`fedsim.trackers.open_trackers` for the
    directory once made) get what it gets: its config, every metrics line, and at :meth:`close` its files."""

    def __init__(self, path: str | Path, trackers: Callable[[Path], Any] | None = None) -> None:
        self.path = Path(path)
        make_dir(self.path)
        self.trackers = trackers(self.path) if trackers is not None else None
        self.config_sha256: str | None = None  # write_config's
        self.partition_sha256: str | None = None  # write_partition's
        self.metrics_checksum = MetricsChecksum()  # of the lines of metrics.jsonl written so far

    def write_config(self, cfg: RunConfig) -> None:
        tree = config_tree(cfg)
        write_file(self.path / "config.yaml", yaml.safe_dump(tree, sort_keys=False).encode())
        self.config_sha256 = config_checksum(tree)  # what progress.json ties the rounds so far to
        if self.trackers is not None:
            self.trackers.log_config(flatten(tree))

    def write_partition(self, train_counts: np.ndarray, test_counts: np.ndarray, classes: list[str]) -> None:
        """Write ``partition.csv``, and keep its :func:`partition_checksum` for progress.json and the summary."""
        lines = ["split,client," + ",".join(classes) + ",total"]
        for split, counts in (("train", train_counts), ("test", test_counts)):
            for cid, row in enumerate(counts):
                lines.append(f"{split},{cid}," + ",".join(str(int(v)) for v in row) + f",{int(row.sum())}")
        write_file(self.path / "partition.csv", ("\n".join(lines) + "\n").encode())
        self.partition_sha256 = partition_checksum(classes, {"train": train_counts, "test": test_counts})

    def restore_metrics(self, records: list[dict[str, Any]]) -> None:
        """A resumed run: the lines up to its checkpoint, dropping any the killed run wrote after it; the next
        progress.json covers them (the resume removed the killed run's, :func:`claimed`, and until then its
        checkpoint vouches for the lines: :func:`fedsim.records.check_against_checkpoint`)."""
        lines = [_metrics_line(r) for r in records]
        write_file(self.path / "metrics.jsonl", b"".join(lines))
        self.metrics_checksum = MetricsChecksum(from_json(line) for line in lines)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One line more, on disk before it counts in the metrics checksum progress.json and summary.json record."""
        record = json_safe(record)
        data = _metrics_line(record)
        append_file(self.path / "metrics.jsonl", data)  # no half line: the lines before it stay readable
        self.metrics_checksum.add(from_json(data))
        if self.trackers is not None:
            self.trackers.log_metrics(record)

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> str:
        """Write ``model.pt`` (a plain state dict, for ``torch.load``); returns its checksum, which the
        summary records (``model_sha256``) and ``fedsim local`` checks."""
        torch_write(self.path / "model.pt", state_dict)
        return digest(state_dict)

    def write_progress(self, server_round: int, loss: float | None, acc: float | None) -> None:
        """The latest round, for whoever shows progress from outside the ServerApp (``fedsim deploy``), and the
        checksums of the config it runs (:meth:`write_config`) and of the metrics lines so far: an unfinished
        run's config.yaml and metrics.jsonl are checked by them."""
        progress = json_safe({"round": server_round, "loss": loss, "acc": acc, **self._checksums()})
        write_file(self.path / PROGRESS, json.dumps(progress, allow_nan=False).encode())

    def _checksums(self) -> dict[str, Any]:
        """What progress.json and summary.json record of the run's files so far: config, partition, metrics."""
        return {CONFIG_CHECKSUM: self.config_sha256, PARTITION_CHECKSUM: self.partition_sha256,
                **self.metrics_checksum.record()}  # fmt: skip

    def write_error(self, message: str) -> None:
        """Why the run stopped, for a launcher that cannot see the ServerApp's exception."""
        write_file(self.path / ERROR, message.encode())

    def write_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` with the checksums of the run's config, partition and metrics lines, and its own;
        returns it as written."""
        summary = json_safe({**summary, **self._checksums()})
        summary[SUMMARY_CHECKSUM] = summary_checksum(summary)
        write_file(self.path / SUMMARY, (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode())
        return summary

    def close(self) -> None:
        """The trackers get the run's files and are closed (once, however the run ended)."""
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


class Written(BaseModel):
    """Base of the schemas of the JSON files fedsim writes, as strictly as it writes them: a number is never
    text, and JSON has no NaN; fields a schema does not name are kept."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _numeric(value: Any) -> bool:
    if isinstance(value, list):
        return all(_numeric(v) for v in value)
    if isinstance(value, dict):
        return all(_numeric(v) for v in value.values())
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _metric(value: Any) -> Any:
    if not _numeric(value):
        raise PydanticCustomError("metric", "a metric is a number or null, or a list or mapping of them")
    return value


# every metric fedsim writes (a loss, per-class accuracies, failed clients by round): numbers, null where
# nothing was measured, never text or a boolean, which a table or figure would show as if measured
Metric = Annotated[Any, AfterValidator(_metric)]


class MetricsRecord(Written):
    """A line of ``metrics.jsonl``: the fields that ``fedsim report`` and ``fedsim plot`` read, and any other
    metric, kept as written once it is numbers (:data:`Metric`)."""

    __pydantic_extra__: dict[str, Metric] = Field(init=False)

    client_mean_acc: float | None = Field(None, ge=0, le=1)
    global_acc: float | None = Field(None, ge=0, le=1)
    own_class_acc: float | None = Field(None, ge=0, le=1)
    other_class_acc: float | None = Field(None, ge=0, le=1)
    feature_erank: float | None = None
    feature_norm_mean: float | None = None
    feature_sv: list[float | None] | None = None
    time_s: float | None = Field(None, ge=0)  # time since the run started
    rss_mb: float | None = Field(None, ge=0)
    client_acc: list[Annotated[float, Field(ge=0, le=1)] | None] | None = None


def _within(index: str, value: int, info: ValidationInfo) -> int:
    """``value`` of the ``index`` field, once it is at most ``info.context["last"]`` (the run's rounds, a
    continuation's steps) and, where ``info.context["cadence"]`` is given, a round it evaluates: a line beyond
    the run, or at a round it did not evaluate (an edit, a line of another run), is one it could not have written."""
    context = info.context or {}
    last, cadence = context.get("last"), context.get("cadence")
    if last is not None and value > last:
        raise PydanticCustomError(
            "beyond_the_run", "{index} {value} is beyond the run's {last} {index}s",
            {"index": index, "value": value, "last": last},
        )  # fmt: skip
    if cadence is not None and not cadence.is_eval_round(value):
        raise PydanticCustomError(
            "not_evaluated", "round {value} is not one the run evaluated (eval.every: {every}, and its last, {last})",
            {"value": value, "every": cadence.every, "last": cadence.num_rounds},
        )  # fmt: skip
    return value


class RoundRecord(MetricsRecord):
    round: int = Field(ge=1)

    @field_validator("round")
    @classmethod
    def _within_rounds(cls, value: int, info: ValidationInfo) -> int:
        return _within("round", value, info)


class StepRecord(MetricsRecord):
    step: int = Field(ge=0)

    @field_validator("step")
    @classmethod
    def _within_steps(cls, value: int, info: ValidationInfo) -> int:
        return _within("step", value, info)


class Progress(Written):
    """``progress.json`` (:meth:`RunDir.write_progress`): the latest round, its training loss and client-mean
    accuracy (None: not evaluated that round)."""

    round: int = Field(ge=0)
    loss: float | None
    acc: float | None = Field(ge=0, le=1)
    config_sha256: str | None = None  # absent from the progress files of a fedsim before it (config_checksum)
    partition_sha256: str | None = None  # absent from the files of a fedsim before it (partition_checksum)
    metrics_sha256: str | None = None  # absent from the files of a fedsim before it (MetricsChecksum)
    metrics_lines: int | None = Field(None, ge=0)


class Summary(Written):
    """``summary.json``: the fields that ``fedsim report`` and ``fedsim plot`` read (others kept)."""

    rounds: int = Field(ge=1)
    final_client_mean_acc: float | None = Field(ge=0, le=1)
    best_client_mean_acc: float | None = Field(ge=0, le=1)
    final_global_acc: float | None = Field(ge=0, le=1)
    config_sha256: str | None = None  # absent from the summaries of a fedsim before it (config_checksum)
    partition_sha256: str | None = None  # absent from the summaries of a fedsim before it (partition_checksum)
    data_sha256: str | None = None  # absent from the summaries of a fedsim before it (fedsim.data.fingerprint)
    metrics_sha256: str | None = None  # absent from the summaries of a fedsim before it (MetricsChecksum)
    metrics_lines: int | None = Field(None, ge=1)
    summary_sha256: str | None = None  # absent from the summaries of a fedsim before it (summary_checksum)


def final_accuracies(metrics: list[dict[str, Any]]) -> dict[str, float | None]:
    """What ``summary.json`` records of a run's ``metrics.jsonl``: the last and the best client-mean accuracy, and
    the global accuracy of the last line (the run's last round, which it always evaluates)."""
    accs = [m["client_mean_acc"] for m in metrics if m.get("client_mean_acc") is not None]
    return {
        "final_client_mean_acc": accs[-1] if accs else None,
        "best_client_mean_acc": max(accs) if accs else None,
        "final_global_acc": metrics[-1].get("global_acc") if metrics else None,
    }


def read_metrics(
    run_dir: str | Path, index: str = "round", last: int | None = None, cadence: EvalCadence | None = None
) -> list[dict[str, Any]]:
    """Every line of ``metrics.jsonl`` so far (none before the first evaluation); each names its ``index``
    (``round`` in a run, ``step`` in a ``fedsim local`` continuation), strictly increasing line by line, at
    most ``last`` (the run's ``train.rounds``, the continuation's steps) where that is known, and a round the
    run evaluates where its ``cadence`` is given."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    schema = RoundRecord if index == "round" else StepRecord
    return read_json_lines(path, schema, "metrics", increasing=index, context={"last": last, "cadence": cadence})


def metrics_so_far(run_dir: Path) -> str:
    """Where a stopped run's metrics are, for the message saying why it stopped: only what is there (a run
    stopped before its first evaluation wrote none, and one that recorded nothing leaves nothing: :func:`claimed`)."""
    if (run_dir / "metrics.jsonl").is_file():
        return f"the metrics so far are in {run_dir}"
    if records_nothing(run_dir):
        return f"nothing was recorded yet, and what the run wrote in {run_dir} is removed"
    return f"no metrics were written yet (the run directory is {run_dir})"


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a finished run, as written, once it is what fedsim writes (:class:`Summary`)."""
    return read_json(Path(run_dir) / SUMMARY, Summary, "summary")


def read_progress(run_dir: str | Path) -> dict[str, Any]:
    """``progress.json``, as written, once it is what fedsim writes (:class:`Progress`); a launcher polls it
    while the ServerApp runs, and skips a poll that finds it missing."""
    return read_json(Path(run_dir) / PROGRESS, Progress, "progress")


def read_error(run_dir: str | Path) -> str:
    """``error.txt``: why the ServerApp stopped (:meth:`RunDir.write_error`)."""
    return read_text(Path(run_dir) / ERROR, "the ServerApp's error", SUMMARY_BYTES, FedsimError)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON has no NaN or inf (readers would choke)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


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


class LostEvaluations(FedsimWarning):
    """A run's ``metrics.jsonl`` lacks lines between its first and its last (replaced under the running run):
    the rest is the run's, and read; the curve and the rounds to a target skip the rounds missing."""


RESTORE_HINT = "restore the whole run directory, or move it out of the directories given"
# a stopped run rewrites its metrics.jsonl from its checkpoint on resume (or its directory is restored)
RESUME_HINT = f"`fedsim run --resume` it from its {CHECKPOINT} (which rewrites the lines), or {RESTORE_HINT}"


def holds_a_run(path: Path) -> bool:
    """``path`` holds a run's record (:data:`RECORD_FILES`; a ``fedsim local`` continuation's metrics.jsonl is not
    one), marked as fedsim's or not: a run directory cloned from a repository has no mark."""
    return not (path / LOCAL_JSON).exists() and any((path / name).is_file() for name in RECORD_FILES)


def directories_under(root: Path) -> Iterator[Path]:
    """``root`` and every directory below it, symlinks to directories followed (runs gathered into a folder by
    link; Python 3.11's ``Path.rglob`` passes them over), each real directory once, as first reached in name
    order: one reached twice is one, and a link back up is no loop."""
    seen: set[str] = set()
    for top, subdirs, _files in os.walk(root, followlinks=True):
        subdirs.sort()
        real = os.path.realpath(top)
        if real in seen:
            subdirs.clear()
            continue
        seen.add(real)
        yield Path(top)


def run_dirs(root: Path) -> list[Path]:
    """``root`` if it holds a run, else every directory below it that does (:func:`directories_under`), in order:
    each to be read whole (:func:`fedsim.records.read_run`) or refused, never passed over for a file it lacks."""
    if holds_a_run(root):
        return [root]
    return [path for path in directories_under(root) if holds_a_run(path)]


def config_tree(cfg: RunConfig) -> dict[str, Any]:
    """The sections of ``cfg`` as a run directory's config.yaml holds them."""
    return cfg.model_dump(mode="json")


def config_checksum(tree: dict[str, Any]) -> str:
    """The checksum (:func:`fedsim.integrity.digest`) of what a config's sections ``tree`` (as config.yaml holds
    them) say a run learns: its keys but :data:`NOT_LEARNING`'s, which a resumed run may change (its directory
    moved) and reports ignore. Of the file's own keys (:func:`config_tree` where the run writes it), not of a
    validated config's: a later fedsim that adds a key (with its default) still finds an earlier run's
    config.yaml unchanged."""
    flat = flatten(tree)
    return digest({key: value for key, value in flat.items() if not key.startswith(NOT_LEARNING)})


def check_summary(path: Path, cfg: RunConfig, summary: dict[str, Any]) -> None:
    """A finished run's ``summary.json`` is the one it wrote (:func:`summary_checksum`, where it records one: a
    fedsim since it did), of the run its ``config.yaml`` describes: the same rounds and, where the summary
    records one, the same :func:`config_checksum`. A config edited after the
    run (a seed, a learning rate) put the run's numbers under another config's label, or made two copies of a run
    two seeds."""
    if summary["rounds"] != cfg.train.rounds:
        raise FedsimError(
            f"{path}: summary.json says the run finished {summary['rounds']} rounds, its config.yaml's train.rounds "
            f"is {cfg.train.rounds}: {RESTORE_HINT}"
        )
    recorded = summary.get(SUMMARY_CHECKSUM)
    if recorded is not None and recorded != summary_checksum(summary):
        raise FedsimError(
            f"{path}: summary.json is not the summary the run wrote ({SUMMARY_CHECKSUM} differs: a field edited after "
            f"the run): {RESTORE_HINT}"
        )
    check_config(path, summary.get(CONFIG_CHECKSUM), SUMMARY, "finished with")


def summary_checksum(summary: dict[str, Any]) -> str:
    """The checksum (:func:`fedsim.integrity.digest`) of a summary's fields but its own (``summary_sha256``), as
    JSON holds them: every number a report or ``fedsim.open_run`` shows (wall time, speed) is the run's."""
    return digest(json.loads(json.dumps({k: v for k, v in summary.items() if k != SUMMARY_CHECKSUM})))


def check_config(path: Path, recorded: str | None, source: str, did: str) -> None:
    """The run's ``config.yaml`` is the config whose :func:`config_checksum` ``source`` (summary.json of a finished
    run, progress.json of one still running or stopped) recorded, where it records one (a fedsim since it did)."""
    if recorded is not None and recorded != config_checksum(read_yaml(path / "config.yaml", "the run's config.yaml")):
        raise FedsimError(
            f"{path}: config.yaml is not the config the run {did} ({CONFIG_CHECKSUM} in {source} differs; edited "
            f"after the run, or another run's): {RESTORE_HINT}"
        )


def lines_of(count: int) -> str:
    """``count`` lines, in words."""
    return f"{count} line{'' if count == 1 else 's'}"


def check_metrics(path: Path, recorded: dict[str, Any], source: str, metrics: list[dict[str, Any]]) -> None:
    """A run's ``metrics.jsonl`` holds the lines the run wrote, as ``source`` records them (:class:`MetricsChecksum`,
    where it does: a fedsim since it did): all of them after summary.json; after progress.json, the lines it
    covers and at most the one line of the round after its own, which a run stopped between writing the two
    wrote last. A line of another run spliced in, or one edited, added or lost, put numbers on a curve that the
    run never measured."""
    sha256, count = recorded.get(METRICS_CHECKSUM), recorded.get(METRICS_LINES)
    if sha256 is None or count is None or (source == SUMMARY and not metrics):  # none: check_evaluations says it
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
            f"{path / 'metrics.jsonl'} has no line for round{'s' if len(lost) > 1 else ''} {shown} of the rounds "
            f"the run evaluated (eval.every: {cadence.every}): its curve and rounds to a target skip them",
            LostEvaluations,
            stacklevel=2,
        )


def partition_checksum(classes: list[str], counts: dict[str, np.ndarray]) -> str:
    """The checksum (:func:`fedsim.integrity.digest`) of a partition table: its class names and, per split, the
    clients x classes counts (of what the table says, not of its bytes)."""
    return digest({"classes": list(classes), **{split: c.tolist() for split, c in counts.items()}})


def check_partition(
    path: Path, cfg: RunConfig, recorded: dict[str, Any] | None, source: str, classes: list[str],
    counts: dict[str, np.ndarray],
) -> None:  # fmt: skip
    """A run's ``partition.csv`` is its own: a row per client of its config in each split and, where ``source``
    (the summary of a finished run, the progress of one not finished: ``recorded``) records one (a fedsim since it
    did), the same :func:`partition_checksum`. Another run's table (another seed, beta or dataset) drew a label
    distribution the run never trained on."""
    file = path / "partition.csv"
    shapes = {split: len(c) for split, c in counts.items()}
    if sorted(shapes) != ["test", "train"] or set(shapes.values()) != {cfg.train.num_clients}:
        raise FedsimError(
            f"{file}: rows per split {shapes}, where the run's config.yaml has {cfg.train.num_clients} clients "
            f"(train.num_clients) in each of train and test: {RESTORE_HINT}"
        )
    sha256 = (recorded or {}).get(PARTITION_CHECKSUM)
    if sha256 is not None and sha256 != partition_checksum(classes, counts):
        raise FedsimError(
            f"{path}: partition.csv is not the partition the run trained on ({PARTITION_CHECKSUM} in {source} "
            f"differs; edited after the run, or another run's): {RESTORE_HINT}"
        )


# Config keys that do not change what a run learns: reports, sweeps and resume ignore them
NOT_LEARNING = ("name", "output.", "simulation.", "diagnostics.", "deploy.")
_IGNORED = ("seed", *NOT_LEARNING)  # reports also average over seeds
_NOT_LEARNING_NAMES = [key.rstrip(".") for key in NOT_LEARNING]


def varying_keys(runs: list[dict[str, Any]]) -> list[str]:
    """Flattened config keys whose value differs between runs.

    Not ``name``, ``seed``, nor the ``output``, ``simulation`` and ``diagnostics`` sections: they
    do not change what a run learns (seeds are what ``fedsim report`` averages over).
    """
    keys = sorted({k for r in runs for k in r["config"]})
    return [k for k in keys if not k.startswith(_IGNORED) and len({json.dumps(r["config"].get(k)) for r in runs}) > 1]


def short_keys(keys: list[str], taken: tuple[str, ...] = ()) -> list[str]:
    """Labels for config ``keys``: a key's last part, or its plugin's for a name (``model.norm.name`` -> norm),
    with as many parts before it as tell it apart from the other keys' labels and from ``taken`` (the other
    columns of a table): ``train.rounds`` beside a ``rounds`` column, ``model.norm.eps`` beside ``strategy.eps``."""
    parts = [key.split(".") for key in keys]
    parts = [p[:-1] if p[-1] == "name" and len(p) > 1 else p for p in parts]  # strategy.name -> strategy
    used = [1] * len(parts)
    while True:
        labels = [".".join(p[-n:]) for p, n in zip(parts, used, strict=True)]
        counts = Counter([*labels, *taken])
        clashing = [i for i, label in enumerate(labels) if counts[label] > 1 and used[i] < len(parts[i])]
        if not clashing:
            return labels
        for i in clashing:
            used[i] += 1


def seed_groups(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by the config values they differ in (:func:`varying_keys`), seeds pooled: the rows of
    ``fedsim report`` and the bands of ``fedsim plot --mean-over-seeds``. Keyed by a label naming those
    values (``strategy=fedavg, norm=ln``; a key a run does not set is left out), in the runs' order.

    A group's runs have distinct seeds: two runs of one config and seed (a copied run directory, a run made
    twice) are one sample, and counted as two they would make the seed count and the std a lie, so they are
    an error naming both directories. They trained on one dataset: finished runs whose summaries record other
    data fingerprints (``data_sha256``; the file at ``data.root`` replaced between seeds) are an error naming
    two of them, since their mean would be over two datasets under one label; a summary without one (a fedsim
    before data fingerprints) is not compared."""
    keys = varying_keys(runs)
    groups: dict[str, list[dict[str, Any]]] = {}
    seeds: dict[tuple[str, str], dict[str, Any]] = {}
    data: dict[str, dict[str, Any]] = {}  # a group's first run that records its data's fingerprint
    for run in runs:
        values = [(label, run["config"].get(k)) for label, k in zip(short_keys(keys), keys, strict=True)]
        label = ", ".join(f"{k}={v}" for k, v in values if v is not None) or "runs"
        seed = run["config"].get("seed")
        first = seeds.setdefault((label, json.dumps(seed)), run)
        if first is not run:
            raise FedsimError(
                f"{first['dir']} and {run['dir']} are both seed {seed} of one config ({', '.join(_NOT_LEARNING_NAMES)} "
                "aside): runs are averaged over distinct seeds; move one of them out of the directories given"
            )
        if (fingerprint := (run["summary"] or {}).get(DATA_FINGERPRINT)) is not None:
            other = data.setdefault(label, run)["summary"][DATA_FINGERPRINT]
            if other != fingerprint:
                raise DataError(
                    f"{data[label]['dir']} and {run['dir']} are seeds of one config trained on other data "
                    f"({DATA_FINGERPRINT} {other[:16]}... and {fingerprint[:16]}... in their summary.json: "
                    "data.root held other data): runs are averaged over one dataset; move the runs of the other data "
                    "out of the directories given"
                )
        groups.setdefault(label, []).append(run)
    return groups


def read_partition(path: str | Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """``partition.csv`` read back: the class names and, per split, the clients x classes counts."""
    file = Path(path) / "partition.csv"
    text = read_text(file, "the partition table", SUMMARY_BYTES, FedsimError)
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
        classes = rows[0][2:-1]
        counts: dict[str, list[list[int]]] = {}
        for split, _client, *cells in rows[1:]:
            counts.setdefault(split, []).append([int(v) for v in cells[:-1]])
        return classes, {split: np.array(c, dtype=np.int64) for split, c in counts.items()}
    except (csv.Error, IndexError, ValueError) as err:
        raise FedsimError(f"{file}: not the partition table fedsim writes ({type(err).__name__}: {err})") from err
