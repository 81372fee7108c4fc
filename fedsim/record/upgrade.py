"""The one way an older run record becomes one this fedsim reads (``fedsim record upgrade DIR``): the
checksums its summary.json or progress.json records are checked once against its files, the ones it lacks
(a fedsim before them wrote it) computed from them, and the file rewritten of
:data:`fedsim.record.layout.RECORD_VERSION`; the run directory is then read back whole
(:func:`fedsim.record.run.read_run`), and left as it was if that fails. Readers take only the current version
(:func:`fedsim.record.reader.check_version`), so this module is the only place an older record is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.cadence import EvalCadence
from fedsim.config_file import read_run_config, read_yaml
from fedsim.errors import FedsimError
from fedsim.files import write_file
from fedsim.reading import read_bytes, read_json
from fedsim.record.checksums import (
    CONFIG_CHECKSUM,
    METRICS_LINES,
    PARTITION_CHECKSUM,
    SUMMARY_CHECKSUM,
    MetricsChecksum,
    config_checksum,
    partition_checksum,
    summary_checksum,
)  # fmt: skip
from fedsim.record.claim import locked
from fedsim.record.layout import CONFIG, PARTITION, PROGRESS, RECORD_VERSION, SUMMARY, VERSION_KEY
from fedsim.record.paths import check_run_links, resolved
from fedsim.record.reader import read_metrics, read_partition
from fedsim.record.run import read_run
from fedsim.record.schemas import Versioned
from fedsim.record.verify import check_config, check_metrics, check_partition, check_summary_checksum
from fedsim.record.writer import record_json


def upgrade_run(run_dir: str | Path) -> str:
    """Bring the run record in ``run_dir`` to this fedsim's version, once its recorded checksums are its files';
    returns what was done, in words. A live run's directory (locked) is refused, as is one a newer fedsim wrote."""
    path = resolved(Path(run_dir), "fedsim record upgrade")
    if not (path / CONFIG).is_file():
        raise FedsimError(f"{path}: not a run directory (no {CONFIG})")
    check_run_links(path)
    name = SUMMARY if (path / SUMMARY).is_file() else PROGRESS if (path / PROGRESS).is_file() else None
    if name is None:
        return f"{path}: nothing to upgrade (no {SUMMARY} or {PROGRESS}; a resume writes its progress anew)"
    with locked(path, "fedsim record upgrade", "run"):
        file = path / name
        record = read_json(file, Versioned, name.removesuffix(".json"))
        version = record.get(VERSION_KEY) or 0
        if version == RECORD_VERSION:
            return f"{path}: already of record version {RECORD_VERSION}"
        if version > RECORD_VERSION:
            raise FedsimError(f"{file}: of record version {version}, newer than this fedsim's ({RECORD_VERSION})")
        before = read_bytes(file, name, 1 << 24, FedsimError)
        upgraded = _upgraded(path, name, record)
        write_file(file, record_json(name, upgraded))
        try:
            read_run(path)
        except FedsimError:
            write_file(file, before)  # as it was: the record disagrees with itself beyond its checksums
            raise
    return f"{path}: {name} upgraded from record version {version} to {RECORD_VERSION}"


def _upgraded(path: Path, name: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (``name``, of an older version) checked against the files by what checksums it has, with
    those it lacks computed from them and this version's stamp."""
    cfg = read_run_config(path / CONFIG, read_back=True)
    metrics = read_metrics(path, last=cfg.train.rounds, cadence=EvalCadence(cfg.eval.every, cfg.train.rounds))
    partition = read_partition(path) if (path / PARTITION).is_file() else None
    if name == SUMMARY and record.get(SUMMARY_CHECKSUM) is not None:
        check_summary_checksum(path, record)
    if record.get(CONFIG_CHECKSUM) is not None:
        check_config(path, record[CONFIG_CHECKSUM], name, "ran")
    if record.get(METRICS_LINES) is not None:
        check_metrics(path, record, name, metrics)
    if partition is not None and record.get(PARTITION_CHECKSUM) is not None:
        check_partition(path, cfg, record, name, *partition)
    if record.get(METRICS_LINES) is not None:
        covered = metrics[: record[METRICS_LINES]]
    elif name == SUMMARY:
        covered = metrics
    else:  # the lines up to its round: one more is the round after, which the run wrote before its progress
        covered = [line for line in metrics if line["round"] <= record["round"]]
    upgraded = {k: v for k, v in record.items() if k != SUMMARY_CHECKSUM}
    upgraded.update({
        VERSION_KEY: RECORD_VERSION,
        CONFIG_CHECKSUM: config_checksum(read_yaml(path / CONFIG, "the run's config.yaml")),
        PARTITION_CHECKSUM: partition_checksum(*partition) if partition is not None else None,
        **MetricsChecksum(covered).record(),
    })  # fmt: skip
    if name == SUMMARY:
        upgraded[SUMMARY_CHECKSUM] = summary_checksum(upgraded)
    return upgraded
