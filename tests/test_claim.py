"""One live run owns a run directory (fedsim/record/claim.py): the lock, the refusals of a fresh run, the leftovers
cleared, and what a fresh run that recorded nothing takes back. Directories that are not fedsim's:
tests/test_ownership.py; two real processes racing for one directory: tests/test_exclusive.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.errors import FedsimError
from fedsim.record.claim import check_fresh, claimed, locked, metrics_so_far, take_back
from tests.fault_lines import assert_said


def test_a_fresh_run_refuses_a_finished_run_or_one_it_could_resume(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(FedsimError, match=r"summary\.json"):  # the wording: the corpus (run-dir-finished)
        check_fresh(tmp_path)
    (tmp_path / "summary.json").unlink()
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    with pytest.raises(FedsimError, match=rf"fedsim run --resume {tmp_path}"):  # the command that continues it
        check_fresh(tmp_path)


def test_a_fresh_claim_clears_a_killed_runs_leftovers_and_marks_the_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with claimed(run_dir):
        (run_dir / "metrics.jsonl").write_text("{}\n")  # the run records something
        (run_dir / "progress.json").write_text("{}")
    (run_dir / "error.txt").write_text("killed")
    with claimed(run_dir):  # a killed run with nothing to resume: its files go, the mark stays
        assert sorted(p.name for p in run_dir.iterdir()) == [".fedsim", ".lock"]


def test_a_resumed_claim_clears_only_the_stopped_servers_progress_and_error(tmp_path: Path) -> None:
    with claimed(tmp_path / "run"):
        pass
    run_dir = tmp_path / "run"
    for name in ("checkpoint.pt", "metrics.jsonl", "progress.json", "error.txt"):
        (run_dir / name).write_text("x")
    with claimed(run_dir, resume=True):
        assert sorted(p.name for p in run_dir.iterdir()) == [".fedsim", ".lock", "checkpoint.pt", "metrics.jsonl"]


def test_a_fresh_run_that_fails_having_recorded_nothing_leaves_the_directory_as_it_found_it(tmp_path: Path) -> None:
    made = tmp_path / "made"
    with pytest.raises(RuntimeError), claimed(made):
        (made / "config.yaml").write_text("x")
        raise RuntimeError("data not found")
    assert not made.exists()  # it made it: gone
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(RuntimeError), claimed(given):
        raise RuntimeError("data not found")
    assert given.is_dir() and not list(given.iterdir())  # the user's: kept, empty as it was
    with pytest.raises(RuntimeError), claimed(given):
        (given / "metrics.jsonl").write_text("{}\n")  # something recorded: every file stays
        raise RuntimeError("diverged")
    assert (given / "metrics.jsonl").is_file()


def test_take_back_keeps_a_mark_that_was_there_before(tmp_path: Path) -> None:
    (tmp_path / ".fedsim").write_text("run")
    (tmp_path / "config.yaml").write_text("x")
    take_back(tmp_path, marked=True, made=False)
    assert [p.name for p in tmp_path.iterdir()] == [".fedsim"]


def test_a_directory_locked_by_another_live_process_is_refused_naming_its_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from fedsim.record.claim import locked\n"
         f"with locked(Path({str(tmp_path)!r})):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(FedsimError, match=rf"in use by another fedsim run \(pid {holder.pid}, since "):
            with locked(tmp_path):
                pass
    finally:
        holder.communicate("", timeout=60)
    with locked(tmp_path):  # released with its process
        assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()}, since ")


def test_where_the_metrics_are_says_only_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x")
    where = re.escape(str(tmp_path))
    assert_said("nothing kept", metrics_so_far(tmp_path), run_dir=where)
    (tmp_path / "model.pt").write_bytes(b"x")
    assert_said("no metrics kept", metrics_so_far(tmp_path), run_dir=where)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert_said("metrics kept", metrics_so_far(tmp_path), run_dir=where)
