"""The one way an older run record becomes one this fedsim reads (``fedsim record upgrade DIR``): the
checksums its summary.json or progress.json and its checkpoint.pt record are checked once against its files
(:mod:`fedsim.record.legacy`), then the files are listed by size and SHA-256 (:mod:`fedsim.record.manifest`)
and the record rewritten of :data:`fedsim.record.layout.RECORD_VERSION`, with each ``fedsim local``
continuation's local.json; the run directory is then read back whole (:func:`fedsim.record.run.read_run`), and
every file left as it was if that fails. Readers take only the current version
(:func:`fedsim.record.reader.check_version`), so this module is the only place an older record is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedsim.cadence import EvalCadence
from fedsim.config_file import read_run_config
from fedsim.digest import digest
from fedsim.errors import FedsimError
from fedsim.files import write_file
from fedsim.reading import SUMMARY_BYTES, read_bytes, read_json
from fedsim.record.checkpoint import WHAT, checkpoint_bytes
from fedsim.record.claim import locked
from fedsim.record.layout import (
    CHECKPOINT,
    CONFIG,
    LOCAL_JSON,
    METRICS,
    MODEL,
    PARTITION,
    PROGRESS,
    RECORD_VERSION,
    SUMMARY,
    VERSION_KEY,
)
from fedsim.record.legacy import KEYS, MODEL_SHA256, check_checkpoint, check_legacy
from fedsim.record.manifest import FILES, SHA256, SUMMARY_CHECKSUM, entry_of, summary_checksum
from fedsim.record.paths import check_run_links, resolved
from fedsim.record.reader import TORCH_BYTES, load_torch, metrics_bytes, read_metrics, read_partition, read_torch_bytes
from fedsim.record.run import read_run
from fedsim.record.schemas import Versioned
from fedsim.record.writer import record_json


def upgrade_run(run_dir: str | Path) -> str:
    """Bring the run record in ``run_dir`` to this fedsim's version, once its recorded checksums are its files';
    returns what was done, in words. A live run's directory (locked) is refused, as is one a newer fedsim wrote."""
    path = resolved(Path(run_dir), "fedsim record upgrade")
    if not (path / CONFIG).is_file():
        raise FedsimError(f"{path}: not a run directory (no {CONFIG})")
    check_run_links(path)
    name = SUMMARY if (path / SUMMARY).is_file() else PROGRESS if (path / PROGRESS).is_file() else None
    if name is None and not (path / CHECKPOINT).is_file():
        return f"{path}: nothing to upgrade (no {SUMMARY}, {PROGRESS} or {CHECKPOINT})"
    with locked(path, "fedsim record upgrade", "run"):
        rewritten: dict[Path, bytes] = {}
        if name is not None:  # none: a resume removed the stopped run's progress.json; it writes its own
            record = read_json(path / name, Versioned, name.removesuffix(".json"))
            version = record.get(VERSION_KEY) or 0
            if version > RECORD_VERSION:
                raise FedsimError(f"{path / name}: of record version {version}, newer than this fedsim's "
                                  f"({RECORD_VERSION})")  # fmt: skip
            if version < RECORD_VERSION:
                rewritten = _upgraded(path, name, record)
        if (path / CHECKPOINT).is_file() and (checkpoint := _checkpoint(path / CHECKPOINT)) is not None:
            rewritten[path / CHECKPOINT] = checkpoint
        if not rewritten:
            return f"{path}: already of record version {RECORD_VERSION}"
        before = {f: read_bytes(f, f.name, TORCH_BYTES, FedsimError) for f in rewritten}
        for f, data in rewritten.items():
            write_file(f, data, fsync=f.name == CHECKPOINT)
        try:
            read_run(path)
        except BaseException:
            for f, data in before.items():  # as it was: the record disagrees with itself beyond its checksums
                write_file(f, data)
            raise
    return f"{path}: {', '.join(f.name for f in rewritten)} upgraded to record version {RECORD_VERSION}"


def _upgraded(path: Path, name: str, record: dict[str, Any]) -> dict[Path, bytes]:
    """The files of the run (``name``, of an older version, and checkpoint.pt and local.json files where there
    are) as this version writes them, once the older checksums are the files'."""
    cfg = read_run_config(path / CONFIG, read_back=True)
    data = metrics_bytes(path)
    metrics = read_metrics(path, last=cfg.train.rounds, cadence=EvalCadence(cfg.eval.every, cfg.train.rounds),
                           data=data)  # fmt: skip
    partition = read_partition(path) if (path / PARTITION).is_file() else None
    model = (path / MODEL).is_file() and name == SUMMARY
    model_bytes = read_torch_bytes(path / MODEL, "model") if model else b""
    state = load_torch(path / MODEL, model_bytes, "model") if model else None
    covered = check_legacy(path, name, record, metrics, partition, state)
    files = {CONFIG: entry_of(read_bytes(path / CONFIG, CONFIG, SUMMARY_BYTES, FedsimError)),
             METRICS: entry_of(data if name == SUMMARY else _lines_prefix(data, len(covered)))}  # fmt: skip
    if partition is not None:
        files[PARTITION] = entry_of(read_bytes(path / PARTITION, PARTITION, SUMMARY_BYTES, FedsimError))
    if model:
        files[MODEL] = entry_of(model_bytes)
    upgraded = {k: v for k, v in record.items() if k not in KEYS}
    upgraded.update({VERSION_KEY: RECORD_VERSION, FILES: files})
    if name == SUMMARY:
        upgraded[SUMMARY_CHECKSUM] = summary_checksum(upgraded)
    rewritten = {path / name: record_json(name, upgraded)}
    if state is not None:
        rewritten.update(_continuations(path, digest(state), files[MODEL][SHA256]))
    return rewritten


def _lines_prefix(data: bytes, count: int) -> bytes:
    """The bytes of metrics.jsonl (``data``) up to the end of its ``count``-th line (blank lines skipped, as
    its reader skips them), as the file holds them."""
    end = 0
    for line in data.splitlines(keepends=True):
        if count == 0:
            break
        end += len(line)
        count -= bool(line.strip())
    return data[:end]


def _checkpoint(file: Path) -> bytes | None:
    """checkpoint.pt of an older version, checked, as this version writes it (its fields as they were); None
    if it is of this version."""
    outer = load_torch(file, read_torch_bytes(file, WHAT), WHAT)
    if not isinstance(outer, dict):
        raise FedsimError(f"{file}: not a {WHAT} (a {type(outer).__name__}, not a mapping)")
    version = outer.get(VERSION_KEY) or 0
    if type(version) is not int:
        raise FedsimError(f"{file}: {VERSION_KEY} {version!r} is not a record version fedsim writes (a whole number)")
    if version > RECORD_VERSION:
        raise FedsimError(f"{file}: of record version {version}, newer than this fedsim's ({RECORD_VERSION})")
    if version == RECORD_VERSION:
        return None
    return checkpoint_bytes(check_checkpoint(file, outer))


def _continuations(path: Path, old: str, new: str) -> dict[Path, bytes]:
    """Each ``fedsim local`` continuation's local.json in the run directory that continued the model whose
    version-1 checksum is ``old``, naming it by its SHA-256 ``new``; one of another model (or none) is left as
    it is, and refused when read."""
    rewritten = {}
    for local in sorted(path.glob(f"local-*/{LOCAL_JSON}")):
        request = json.loads(read_bytes(local, LOCAL_JSON, SUMMARY_BYTES, FedsimError))
        if request.get(MODEL_SHA256) == old:
            rewritten[local] = (json.dumps({**request, MODEL_SHA256: new}, indent=2) + "\n").encode()
    return rewritten
