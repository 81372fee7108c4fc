"""The one upgrade path of a run record (fedsim.record.upgrade, ``fedsim record upgrade``): readers refuse an
older record in one line naming the command; the command checks the older record's checksums once, stamps it of
this version with every checksum, keeps its numbers, and leaves a record it cannot vouch for as it was."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import FedsimError
from fedsim.record.claim import locked
from fedsim.record.layout import RECORD_VERSION
from fedsim.record.run import read_run
from fedsim.record.upgrade import upgrade_run
from tests.conftest import small_config

# what a summary of record version 1 and 2 holds that a fedsim before record versions did not write
CHECKSUMS = ("config_sha256", "partition_sha256", "metrics_sha256", "metrics_lines", "summary_sha256", "files")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 3 rounds, evaluated every round."""
    root = tmp_path_factory.mktemp("upgrade")
    run_dir = root / "run"
    run(parse_config(small_config(root, train={"rounds": 3}, eval={"every": 1}, output={"run_dir": str(run_dir)})))
    return run_dir


def older(finished: Path, tmp_path: Path) -> Path:
    """A copy of ``finished`` whose summary.json a fedsim before record versions and checksums wrote."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in summary.items() if k not in (*CHECKSUMS, "record_version")}))
    return run_dir


def test_a_run_records_this_version(finished: Path) -> None:
    assert json.loads((finished / "summary.json").read_text())["record_version"] == RECORD_VERSION
    assert upgrade_run(finished) == f"{finished}: already of record version {RECORD_VERSION}"


def test_an_older_record_is_refused_naming_the_upgrade_then_read_as_it_was(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = older(finished, tmp_path)
    assert main(["report", str(run_dir), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err  # the file, the two versions and the command; the wording: tests/test_bad_inputs.py
    assert err.startswith(f"fedsim: error: {run_dir / 'summary.json'}: ") and err.count("\n") == 1, err
    assert "version 0" in err and f"({RECORD_VERSION})" in err and f"`fedsim record upgrade {run_dir}`" in err
    assert main(["record", "upgrade", str(tmp_path)]) == 0  # a directory holding runs: each upgraded
    assert capsys.readouterr().out == f"{run_dir}: summary.json upgraded to record version {RECORD_VERSION}\n"
    summary = json.loads((run_dir / "summary.json").read_text())
    own = json.loads((finished / "summary.json").read_text())
    assert summary == own  # every checksum the run recorded, its numbers untouched
    assert read_run(run_dir)["summary"] == own


def test_an_older_record_that_its_files_disagree_with_is_left_as_it_was(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    path = run_dir / "summary.json"
    summary = {k: v for k, v in json.loads(path.read_text()).items() if k != "record_version"}
    path.write_text(json.dumps({**summary, "final_client_mean_acc": 0.99}))  # edited after the run
    before = path.read_bytes()
    with pytest.raises(FedsimError, match=r"summary\.json\b.*\bsummary_sha256\b"):
        upgrade_run(run_dir)
    assert path.read_bytes() == before
    older_run = older(finished, tmp_path / "older")
    lines = (older_run / "metrics.jsonl").read_text().splitlines()
    (older_run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # its last evaluation lost
    before = (older_run / "summary.json").read_bytes()
    with pytest.raises(FedsimError, match=r"metrics\.jsonl\b.*\b2\b.*\b3\b"):
        upgrade_run(older_run)
    assert (older_run / "summary.json").read_bytes() == before  # read back whole failed: as it was


def test_a_newer_record_and_a_live_runs_are_refused(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    path = run_dir / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "record_version": RECORD_VERSION + 1}))
    with pytest.raises(FedsimError, match=rf"summary\.json\b.*\b{RECORD_VERSION + 1}\b"):
        upgrade_run(run_dir)
    with pytest.raises(FedsimError, match=rf"summary\.json\b.*\b{RECORD_VERSION + 1}\b"):
        read_run(run_dir)
    live = older(finished, tmp_path / "live")
    with locked(live), pytest.raises(FedsimError, match=re.escape(str(live))):
        upgrade_run(live)


@pytest.mark.slow
def test_a_stopped_run_of_an_older_fedsim_resumes_without_an_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume replaces the stopped run's progress.json (of an older record, here) with its own: `fedsim run
    --resume` goes on from the checkpoint, and the finished run is of this version."""
    from fedsim.record.checkpoint import resume_config
    from tests.test_resume import stopped_in

    run_dir = tmp_path / "run"
    raw = small_config(tmp_path, train={"rounds": 4}, eval={"every": 1},
                       output={"run_dir": str(run_dir), "checkpoint_every": 2})  # fmt: skip
    stopped_in(raw, 3, monkeypatch)
    progress = json.loads((run_dir / "progress.json").read_text())
    (run_dir / "progress.json").write_text(json.dumps({k: v for k, v in progress.items() if k != "record_version"}))
    with pytest.raises(FedsimError, match="upgrade it with `fedsim record upgrade"):
        read_run(run_dir)
    run(resume_config(run_dir), resume=True)
    assert read_run(run_dir)["summary"]["record_version"] == RECORD_VERSION


def test_an_older_stopped_runs_lines_are_listed_as_the_file_holds_them(finished: Path, tmp_path: Path) -> None:
    """A stopped run of a fedsim before record versions whose metrics.jsonl has CRLF line endings and a blank
    line (read as the same lines): the manifest lists the file's own bytes up to its round's last line, and
    the run reads back with its numbers."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "summary.json").unlink()
    (run_dir / "model.pt").unlink(missing_ok=True)
    (run_dir / "progress.json").write_text(json.dumps({"round": 2, "loss": 1.0, "acc": 0.5}))
    text = "".join(json.dumps(line) + "\r\n" + ("\n" if line["round"] == 1 else "") for line in lines)
    (run_dir / "metrics.jsonl").write_text(text, newline="")
    assert upgrade_run(run_dir) == f"{run_dir}: progress.json upgraded to record version {RECORD_VERSION}"
    listed = json.loads((run_dir / "progress.json").read_text())["files"]["metrics.jsonl"]
    assert listed["size"] == len(text.encode()) - len(json.dumps(lines[2]) + "\r\n")  # rounds 1 and 2's lines
    assert read_run(run_dir)["metrics"] == lines  # round 3's line: the one past progress.json
