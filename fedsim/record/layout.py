"""What a run directory holds: one table (:data:`LAYOUT`), a row per entry, saying what it holds and how the
record treats it. The rest of :mod:`fedsim.record` asks this table (what a fresh run clears, what a resume
clears, what trackers get, what makes a directory a run's, what the checksums cover) instead of listing names
of its own: a new file is a row here, its writer call and its test."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.ownership import MARKER

CONFIG = "config.yaml"
PARTITION = "partition.csv"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
MODEL = "model.pt"
CHECKPOINT = "checkpoint.pt"
PROGRESS = "progress.json"
ERROR = "error.txt"
WORKERS = "workers.jsonl"
TENSORBOARD = "tb"
CLIENT_STATE = "client_state"  # the nodes' state files of a checkpoint, under the run directory (by default)
DEPLOY = "deploy"
LOCK = ".lock"
LOCAL_JSON = "local.json"  # what `fedsim local` ran, in RUN_DIR/local-<k>/ (fedsim.app.local), not a run's entry
# The version of what a run directory records (its files and their checksums), which summary.json,
# progress.json and checkpoint.pt say under VERSION_KEY: readers take only this one; `fedsim record upgrade`
# brings an older record to it (fedsim.record.upgrade). 1: checksums of values, of five kinds; 2: one manifest
# of every file's size and SHA-256 (fedsim.record.manifest)
RECORD_VERSION = 2
VERSION_KEY = "record_version"
# A launcher that holds a run directory for the ServerApp it starts (fedsim deploy) names it here
HELD_ENV = "FEDSIM_RUN_DIR_HELD"


@dataclass(frozen=True)
class Entry:
    """One entry of a run directory."""

    name: str
    holds: str  # what it holds, and the schema or writer that says how
    directory: bool = False
    # listed in the manifest (size and SHA-256) of progress.json while the run goes and of summary.json at its end
    checksummed: bool = False
    final: bool = False  # written after the run's last progress.json, so listed by summary.json only
    fresh_clears: bool = True  # removed by a fresh run from the directory of a killed run it replaces
    resume_clears: bool = False  # removed by a resume: the stopped server's, which a launcher would show
    tracked: bool = False  # handed to trackers when the run closes
    resumed: bool = False  # what a resume continues from
    early: bool = False  # written before the run records anything: a failed run holding only these is taken back
    record: bool = False  # a directory holding this file is a run's record, read back whole
    # may be left out of a record kept or shared (large, and no reader of the numbers needs it): a record without
    # it is read with a warning; one present is checked as any file of the manifest
    left_out: bool = False


LAYOUT = (
    Entry(CONFIG, "the resolved config (RunConfig as YAML)", checksummed=True, tracked=True, resumed=True,
          early=True, record=True),
    Entry(PARTITION, "clients x classes counts, train and test (CSV; read_partition)", checksummed=True,
          tracked=True, early=True, record=True),
    Entry(METRICS, "a line per evaluation (JSON lines; RoundRecord)", checksummed=True, resumed=True, record=True),
    Entry(SUMMARY, "the finished run's numbers, the manifest and its own checksum (JSON; Summary)", tracked=True,
          record=True),
    Entry(MODEL, "the final global model (a torch state dict)", checksummed=True, final=True, left_out=True),
    Entry(CHECKPOINT, "the server's side after a round, with its payload's size and SHA-256 (torch; Checkpoint)",
          resumed=True, record=True),
    Entry(PROGRESS, "the latest round and the checksums so far (JSON; Progress)", resume_clears=True, early=True,
          record=True),
    Entry(ERROR, "why the ServerApp stopped (text)", resume_clears=True),
    Entry(WORKERS, "a line per worker of the Ray pool, its clients and where Ray placed it as the worker saw it "
          "(JSON lines; WorkerRecord)", early=True),
    Entry(TENSORBOARD, "TensorBoard's event files", directory=True, early=True),
    Entry(CLIENT_STATE, "the nodes' state files of the last checkpoint, which records each one's size and SHA-256 "
          "(fedsim.client.state)", directory=True, resumed=True),
    Entry(DEPLOY, "fedsim deploy's files for the run", directory=True),
    Entry(LOCK, "the live run's lock (claimed)", fresh_clears=False, early=True),
    Entry(MARKER, "fedsim's mark on its directories (fedsim.ownership)", fresh_clears=False, early=True),
)  # fmt: skip

ENTRIES = tuple(entry.name for entry in LAYOUT)  # what fedsim writes in a run directory itself
FRESH_CLEARS = tuple(entry.name for entry in LAYOUT if entry.fresh_clears)
RESUME_CLEARS = tuple(entry.name for entry in LAYOUT if entry.resume_clears)
EARLY = tuple(entry.name for entry in LAYOUT if entry.early)
RECORD_FILES = tuple(entry.name for entry in LAYOUT if entry.record)
TRACKED = tuple(entry.name for entry in LAYOUT if entry.tracked)
MANIFEST = tuple(entry.name for entry in LAYOUT if entry.checksummed)
LEFT_OUT = tuple(entry.name for entry in LAYOUT if entry.left_out)
FINAL = tuple(entry.name for entry in LAYOUT if entry.final)
