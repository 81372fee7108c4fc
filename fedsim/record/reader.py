"""A run directory's files read back, each once it is what fedsim writes (:mod:`fedsim.reading` underneath:
its size bounded, its schema checked, :mod:`fedsim.record.schemas`): a truncated or foreign file is one line
naming it. Checking them against each other is :mod:`fedsim.record.verify`'s."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.cadence import EvalCadence
from fedsim.errors import FedsimError
from fedsim.reading import GIB, METRICS_BYTES, SUMMARY_BYTES, parse_json_lines, read_bytes, read_json, read_text
from fedsim.record.layout import ERROR, METRICS, PARTITION, PROGRESS, RECORD_VERSION, SUMMARY, VERSION_KEY, WORKERS
from fedsim.record.schemas import Progress, RoundRecord, StepRecord, Summary, WorkerRecord

TORCH_BYTES = 64 * GIB  # a checkpoint or model fedsim wrote: far above any the paper's models make


def read_torch_bytes(path: Path, what: str) -> bytes:
    """The bytes of a torch file fedsim wrote (``what`` it should be), for :func:`load_torch` once they are
    checked; a FIFO or a device is refused unread. A missing file stays FileNotFoundError: its callers say
    which run lacks it."""
    if not path.exists():
        raise FileNotFoundError(path)
    return read_bytes(path, what, TORCH_BYTES, FedsimError)


def read_torch(path: Path, what: str) -> Any:
    """:func:`load_torch` of the file at ``path`` (:func:`read_torch_bytes`)."""
    return load_torch(path, read_torch_bytes(path, what), what)


def load_torch(path: Path, data: bytes, what: str) -> Any:
    """``torch.load`` of ``data`` (tensors and plain types only), read from ``path``; bytes that are not a torch
    file (truncated, foreign) are one line naming it and ``what`` it should be, not a pickle traceback."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (whatever torch's readers raise on bytes that are not theirs)
        first = (str(err).strip().splitlines() or [""])[0]
        raise FedsimError(f"{path}: not a readable {what} ({type(err).__name__}: {first})") from err


def final_accuracies(metrics: list[dict[str, Any]]) -> dict[str, float | None]:
    """What ``summary.json`` records of a run's ``metrics.jsonl``: the last and the best client-mean accuracy, and
    the global accuracy of the last line (the run's last round, which it always evaluates); with personalised
    evaluation, the last and the best of its client-mean too."""
    accs = [m["client_mean_acc"] for m in metrics if m.get("client_mean_acc") is not None]
    final = {
        "final_client_mean_acc": accs[-1] if accs else None,
        "best_client_mean_acc": max(accs) if accs else None,
        "final_global_acc": metrics[-1].get("global_acc") if metrics else None,
    }
    if any("personal_acc" in m for m in metrics):  # eval.personal on: the personalised models' client-mean too
        personal = [m["personal_acc"] for m in metrics if m.get("personal_acc") is not None]
        final["final_personal_acc"] = personal[-1] if personal else None
        final["best_personal_acc"] = max(personal) if personal else None
    return final


def metrics_bytes(run_dir: str | Path) -> bytes:
    """``metrics.jsonl``'s bytes (none before the first evaluation), for :func:`read_metrics` and the manifest's
    check of the same bytes."""
    path = Path(run_dir) / METRICS
    return read_bytes(path, "metrics", METRICS_BYTES, FedsimError) if path.exists() else b""


def read_metrics(
    run_dir: str | Path, index: str = "round", last: int | None = None, cadence: EvalCadence | None = None,
    data: bytes | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every line of ``metrics.jsonl`` so far (``data``: its bytes as read by :func:`metrics_bytes`); each names
    its ``index`` (``round`` in a run, ``step`` in a ``fedsim local`` continuation), strictly increasing line by
    line, at most ``last`` (the run's ``train.rounds``, the continuation's steps) where that is known, and a round
    the run evaluates where its ``cadence`` is given."""
    path = Path(run_dir) / METRICS
    schema = RoundRecord if index == "round" else StepRecord
    return parse_json_lines(
        metrics_bytes(run_dir) if data is None else data, path, schema, "metrics", increasing=index,
        context={"last": last, "cadence": cadence},
    )  # fmt: skip


def read_workers(run_dir: str | Path) -> list[dict[str, Any]]:
    """``workers.jsonl``: every worker of the Ray pool, each where it ran (:class:`WorkerRecord`), in the order
    they reported it; none for a run without the pool."""
    path = Path(run_dir) / WORKERS
    data = read_bytes(path, "workers", METRICS_BYTES, FedsimError) if path.exists() else b""
    return parse_json_lines(data, path, WorkerRecord, "workers")


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a finished run, as written, once it is what fedsim writes (:class:`Summary`) of this
    record version (:func:`check_version`)."""
    path = Path(run_dir) / SUMMARY
    return check_version(path, read_json(path, Summary, "summary"))


def read_progress(run_dir: str | Path) -> dict[str, Any]:
    """``progress.json``, as written, once it is what fedsim writes (:class:`Progress`) of this record version
    (:func:`check_version`); a launcher polls it while the ServerApp runs, and skips a poll that finds it
    missing."""
    path = Path(run_dir) / PROGRESS
    return check_version(path, read_json(path, Progress, "progress"))


def check_version(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (read from ``path``) once it is of this fedsim's record version
    (:data:`fedsim.record.layout.RECORD_VERSION`); another is refused, naming the command that upgrades an older
    one."""
    version = record.get(VERSION_KEY)
    if version == RECORD_VERSION and type(version) is int:
        return record
    if version is not None and type(version) is not int:
        raise FedsimError(f"{path}: {VERSION_KEY} {version!r} is not a record version fedsim writes (a whole number)")
    if version is None or version < RECORD_VERSION:
        raise FedsimError(
            f"{path}: a run record of version {version or 0}, older than this fedsim's ({RECORD_VERSION}): upgrade "
            f"it with `fedsim record upgrade {path.parent}`"
        )
    raise FedsimError(f"{path}: a run record of version {version}, newer than this fedsim's ({RECORD_VERSION}): "
                      "read it with the fedsim that wrote it")  # fmt: skip


def read_error(run_dir: str | Path) -> str:
    """``error.txt``: why the ServerApp stopped (:meth:`RunDir.write_error`)."""
    return read_text(Path(run_dir) / ERROR, "the ServerApp's error", SUMMARY_BYTES, FedsimError)


def read_partition(path: str | Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """``partition.csv`` read back: the class names and, per split, the clients x classes counts."""
    file = Path(path) / PARTITION
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
