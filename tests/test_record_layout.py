"""The run directory's layout table (fedsim.record.layout): the one list of what a run directory holds, from
which what a fresh run clears, what a resume clears, what trackers get and what makes a directory a run's are
read."""

from __future__ import annotations

from fedsim.ownership import MARKER
from fedsim.record.layout import (
    CHECKPOINT,
    CONFIG,
    EARLY,
    ENTRIES,
    ERROR,
    FRESH_CLEARS,
    LAYOUT,
    LOCK,
    METRICS,
    PARTITION,
    PROGRESS,
    RECORD_FILES,
    RESUME_CLEARS,
    SUMMARY,
    TRACKED,
    WORKERS,
)  # fmt: skip


def test_every_entry_is_named_once() -> None:
    assert len(set(ENTRIES)) == len(ENTRIES) == len(LAYOUT)


def test_a_fresh_run_clears_all_but_the_lock_and_the_mark() -> None:
    assert set(FRESH_CLEARS) == set(ENTRIES) - {LOCK, MARKER}


def test_a_resume_clears_what_the_stopped_server_said_of_itself() -> None:
    assert set(RESUME_CLEARS) == {PROGRESS, ERROR}


def test_trackers_get_the_config_the_partition_and_the_summary() -> None:
    assert TRACKED == (CONFIG, PARTITION, SUMMARY)


def test_a_run_directory_is_one_holding_a_record_file_and_only_files_are() -> None:
    assert set(RECORD_FILES) == {CONFIG, PARTITION, METRICS, SUMMARY, CHECKPOINT, PROGRESS}
    assert not any(entry.directory for entry in LAYOUT if entry.record)


def test_what_a_run_writes_before_it_records_anything_records_nothing() -> None:
    # a failed run holding only these is taken back (fedsim.record.claim.take_back): none is a metric or a model
    assert set(EARLY) == {CONFIG, PARTITION, PROGRESS, WORKERS, "tb", LOCK, MARKER}
