"""fedsim writes only what is its own (fedsim.ownership): a directory it did not make and that is not empty
is never written into; a path it cannot use is one line naming the part at fault; a write that fails
leaves no temp file and keeps what was written before it."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.errors import FedsimError
from fedsim.record.writer import RunDir
from tests.conftest import disk_full_at, small_config, write_config

USERS = {"config.yaml": "my own config\n", "metrics.jsonl": "my own metrics\n", "model.pt": "my own model\n"}


def run_with(tmp_path: Path, capsys: pytest.CaptureFixture[str], **output: str) -> tuple[int, str]:
    cfg = small_config(tmp_path, train={"rounds": 1, "local_steps": 1}, eval={"every": 1})
    cfg["output"].update(output)
    code = main(["run", str(write_config(tmp_path, cfg))])
    return code, capsys.readouterr().err


def test_a_directory_fedsim_did_not_make_is_never_written_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name, text in USERS.items():
        (theirs / name).write_text(text)
    code, err = run_with(tmp_path, capsys, run_dir=str(theirs))  # the field, the directory, the marker it lacks
    assert code == 2 and err.startswith(f"fedsim: error: output.run_dir {theirs} ") and err.count("\n") == 1, err
    assert ".fedsim" in err, err  # the wording: tests/test_bad_inputs.py
    assert {p.name: p.read_text() for p in theirs.iterdir()} == USERS  # nothing added, nothing changed


def test_an_empty_directory_becomes_fedsims_and_its_runs_are_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run_with(tmp_path, capsys, run_dir=str(empty))
    assert code == 0, err
    assert (empty / ".fedsim").read_text() == "run\n" and (empty / "summary.json").is_file()
    (empty / "summary.json").unlink()  # a killed run's leftovers, in fedsim's own directory: cleared, not refused
    assert run_with(tmp_path, capsys, run_dir=str(empty))[0] == 0
    # a directory fedsim made as something else is not a run's
    (empty / ".fedsim").write_text("compose project\n")
    (empty / "summary.json").unlink()
    code, err = run_with(tmp_path, capsys, run_dir=str(empty))
    assert code == 2 and err.startswith(f"fedsim: error: output.run_dir {empty} ") and "compose project" in err, err


def test_paths_fedsim_cannot_use_are_one_line_naming_the_part_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The field, the part of the path at fault and the system's reason (the wording: tests/test_bad_inputs.py)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for output, named in (
        ({"run_dir": str(loop)}, ("output.run_dir", f"{loop}: Too many levels of symbolic links")),
        ({"dir": str(loop / "sub")}, ("output.dir", f"{loop}: Too many levels of symbolic links")),
        ({"dir": "/proc"}, ("output.dir", "/proc", "No such file or directory")),
        ({"run_dir": "r\0"}, ("output.run_dir", "'\\x00'", "(got 'r\\x00')")),
    ):
        code, err = run_with(tmp_path, capsys, **output)
        assert code == 2 and err.startswith(f"fedsim: error: {named[0]}") and err.count("\n") == 1, err
        assert all(n in err for n in named[1:]), err


@pytest.mark.parametrize("full_at", ["model.pt", "summary.json"])  # torch's file; fedsim's own JSON
def test_a_full_disk_is_one_line_leaving_no_temp_file_and_keeping_what_was_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, full_at: str
) -> None:
    disk_full_at(monkeypatch, full_at)
    run_dir = tmp_path / "r"
    code, err = run_with(tmp_path, capsys, run_dir=str(run_dir))  # the file and the system's reason
    assert code == 2 and err.startswith("fedsim: error: ") and err.count("\n") == 1, err
    assert f"{run_dir / full_at}: No space left on device" in err, err
    assert not list(run_dir.glob(".*.tmp")) and not (run_dir / full_at).exists()
    assert [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1]
    kept = {"config.yaml", "partition.csv", "metrics.jsonl"} | ({"model.pt"} if full_at == "summary.json" else set())
    assert all((run_dir / name).is_file() for name in kept)


def test_a_metrics_line_that_does_not_fit_leaves_the_lines_before_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = RunDir(tmp_path)
    out.append_metrics({"round": 1, "client_mean_acc": 0.5})
    real_write = os.write

    def full_after_ten_bytes(fd: int, data: bytes) -> int:
        if len(data) > 10:
            return real_write(fd, bytes(data)[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_after_ten_bytes)
    with pytest.raises(FedsimError, match=r"metrics\.jsonl: No space left on device\b"):
        out.append_metrics({"round": 2, "client_mean_acc": 0.6})
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 1, "client_mean_acc": 0.5}\n'


WRITES = {"report": ["results.csv", "results.md", "accuracy.png"], "plot": ["accuracy.png", "label_distribution.png"]}


def refused_out(capsys: pytest.CaptureFixture[str], start: str, named: str) -> bool:
    """Whether the command said one line beginning ``start`` and naming ``named`` (the wording:
    tests/test_bad_inputs.py)."""
    err = capsys.readouterr().err
    return err.startswith(f"fedsim: error: {start}") and named in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["report", "plot"])
@pytest.mark.slow
def test_report_and_plot_write_only_into_directories_of_fedsims_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    runs = tmp_path / "runs"
    assert run_with(tmp_path, capsys, run_dir=str(runs / "a"))[0] == 0
    capsys.readouterr()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    users = {name: f"my own {name}\n" for name in WRITES[command]}
    for name, text in users.items():
        (theirs / name).write_text(text)
    assert main([command, str(runs / "a"), "--out", str(theirs)]) == 2
    assert refused_out(capsys, f"--out {theirs} ", ".fedsim")  # the option, the directory, the marker it lacks
    monkeypatch.chdir(theirs)  # fedsim plot's default for several runs: the current directory
    assert main([command, str(runs / "a"), *([str(runs / "a")] if command == "plot" else ["--out", "."])]) == 2
    assert refused_out(capsys, "--out . ", ".fedsim")
    assert main([command, str(runs / "a"), "--out", str(theirs / WRITES[command][0])]) == 2
    assert refused_out(capsys, f"--out: {theirs / WRITES[command][0]} ", "a file")
    assert {p.name: p.read_text() for p in theirs.iterdir()} == users  # nothing added, nothing changed

    # a new directory becomes fedsim's; its files are replaced by the next report or plot
    out = tmp_path / "new" / "out"
    assert main([command, str(runs / "a"), "--out", str(out)]) == 0
    assert (out / ".fedsim").read_text() == "results\n" and sorted(p.name for p in out.iterdir()) == sorted(
        [".fedsim", *WRITES[command]]
    )
    (out / WRITES[command][0]).write_bytes(b"stale")
    assert main([command, str(runs / "a"), "--out", str(out)]) == 0
    assert (out / WRITES[command][0]).read_bytes() != b"stale" and (out / WRITES[command][0]).stat().st_size > 50
    # beside the run, in its own directory (the default for one), and in a folder of nothing but runs
    assert main([command, str(runs / "a")]) == 0 and (runs / "a" / WRITES[command][0]).is_file()
    assert (runs / "a" / ".fedsim").read_text() == "run\n"
    assert main([command, str(runs), "--out", str(runs)]) == 0 and (runs / ".fedsim").read_text() == "results\n"
    assert main([command, str(runs), "--out", str(runs)]) == 0  # its own results now
    (runs / ".fedsim").write_text("compose project\n")
    capsys.readouterr()
    assert main([command, str(runs), "--out", str(runs)]) == 2
    assert refused_out(capsys, f"--out {runs} ", "compose project")
