"""The reading boundary (fedsim.reading): every file fedsim reads is a regular file of bounded size and
nesting, and what is not is one line naming the file and the field, never a traceback, a hang or a
MemoryError. In process, through the CLI's own entry point; nothing here trains."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.config_file import parse_config
from fedsim.record.writer import RunDir
from tests.conftest import MODEL_SHA256, continued_run, small_config, write_config, written


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``fedsim ARGV``'s one error line (status 2, no traceback)."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedsim: error: "), (code, err[-2000:])
    return lines[0].removeprefix("fedsim: error: ")


def make_fifo(fifo: Path, seconds: float = 3.0) -> Path:
    """A FIFO at ``fifo``. A reader that waits on it for a writer (fedsim before its reading boundary) gets an
    empty file instead, so that the test fails rather than hangs the suite; one that never opens it costs nothing."""
    os.mkfifo(fifo)

    def write_nothing() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO until a reader has it open
                return
            except OSError:
                time.sleep(0.02)

    threading.Thread(target=write_nothing, daemon=True).start()
    return fifo


DEEP = "[" * 400 + "]" * 400  # 800 bytes: PyYAML's composer recursed once per bracket (RecursionError)


def test_deep_nesting_in_a_set_value_or_a_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, small_config(tmp_path))
    line = one_line(["run", str(cfg), "--set", f"train.lr={DEEP}"], capsys)
    assert line.startswith("--set train.lr: ") and "32" in line  # the key and the bound; wording: the corpus
    deep = tmp_path / "deep.yaml"
    deep.write_text(cfg.read_text() + f"extra: {DEEP}\n")
    assert one_line(["run", str(deep)], capsys).startswith(f"{deep}: ")
    keys = "model." + "x." * 40 + "y=1"  # a dotted key nests as deep as it has dots
    assert "32" in one_line(["run", str(cfg), "--set", keys], capsys)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("? [a, b]\n: 1\n", "line 1"),  # was a TypeError (unhashable)
        ("{? {a: 1}: 2}\n", "line 1"),
        ("train: &t {x: *t}\n", "line 1"),
        ("seed: " + "1" * 5000 + "\n", "(4300 digits)"),  # a ValueError, Python's words
        ("seed: !!int 0x\n", "base 16"),
    ],
)  # fmt: skip
def test_yaml_that_python_cannot_hold_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    """The file and where in it; the wording: tests/test_bad_inputs.py."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = one_line(["run", str(path)], capsys)
    assert line.startswith(f"{path}: ") and named in line, line


def test_a_config_that_is_not_a_regular_file_of_sane_size_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = make_fifo(tmp_path / "fifo.yaml")
    # the file and what it is; the wording: tests/test_bad_inputs.py
    assert one_line(["run", str(fifo)], capsys).startswith(f"config file {fifo}: a FIFO")
    assert one_line(["run", "/dev/zero"], capsys).startswith("config file /dev/zero: a character device")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:  # 50 MB on disk, none of it written: refused by its size, before a byte is read
        f.truncate(50_000_000)
    line = one_line(["run", str(huge)], capsys)
    assert line.startswith(f"config file {huge}: ") and "50,000,000" in line and "4,194,304" in line
    status = "/proc/self/status"  # says 0 bytes, then has some
    assert one_line(["run", status], capsys).startswith(f"config file {status}: a /proc or /sys file")


def test_a_data_root_that_would_hang_or_never_end_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = make_fifo(tmp_path / "data.npz")
    for root, kind in ((fifo, "a FIFO (named pipe)"), (Path("/dev/zero"), "a character device")):
        cfg = write_config(tmp_path, small_config(tmp_path, data={"root": str(root)}))
        line = one_line(["run", str(cfg)], capsys)
        assert line.startswith(f"data.root {root}: {kind}")  # the key, its value, what it is
    cfg = write_config(tmp_path, small_config(tmp_path, data={"root": "mnist\0.npz"}))
    line = one_line(["run", str(cfg)], capsys)
    assert line.startswith("data.root: ") and "'\\x00'" in line
    assert not (tmp_path / "runs").exists()


# --- summaries and metrics read back: validated against their schemas


# a 4-round run evaluated every round: its last line is its final accuracy, its first its best
METRICS = [
    {"round": 1, "client_mean_acc": 0.6},
    {"round": 2, "client_mean_acc": 0.5},
    {"round": 3, "client_mean_acc": 0.55},
    {"round": 4, "client_mean_acc": 0.5, "global_acc": 0.55},
]
SUMMARY = {"rounds": 4, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.6, "final_global_acc": 0.55}


def finished_run(root: Path, name: str = "r", **sections: object) -> Path:
    """A run directory as a finished run of :data:`METRICS` leaves it (written by fedsim's writer, no training),
    as far as fedsim report reads it: ``sections`` change its config (``seed=1``), as ``small_config``'s do."""
    cfg = parse_config(small_config(root, name=name, train={"rounds": 4}, eval={"every": 1}, **sections))
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / ".fedsim").write_text("run\n")
    out = RunDir(run_dir)
    out.write_config(cfg)
    for line in METRICS:
        out.append_metrics(line)
    out.write_summary(SUMMARY)
    return run_dir


def rewrite_metrics(run_dir: Path, *lines: str) -> Path:
    """``run_dir``'s metrics.jsonl with its last ``len(lines)`` lines replaced by ``lines``; returns its path."""
    path = run_dir / "metrics.jsonl"
    kept = path.read_text().splitlines()[: len(METRICS) - len(lines)]
    path.write_text("".join(line + "\n" for line in [*kept, *lines]))
    return path


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("[]", ("the top level", "(got [])")),
        ("null", ("the top level", "(got None)")),
        ("{}", ("rounds", "3 more")),
        (
            '{"rounds": "one", "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.6, "final_global_acc": 0.5}',
            ("rounds", "(got 'one')"),
        ),
        (
            '{"rounds": 2, "final_client_mean_acc": 7, "best_client_mean_acc": 0.6, "final_global_acc": 0.5}',
            ("final_client_mean_acc", "1", "(got 7)"),
        ),
        ("[" * 300 + "]" * 300, ("line 1 column 202",)),
        ('{"rounds": 2', ("line 1 column 12",)),
        ('{"rounds": 2, "rounds": 3}', ("rounds",)),  # the last won
    ],
)  # fmt: skip
def test_report_on_a_summary_fedsim_did_not_write_names_the_file_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, named: tuple[str, ...]
) -> None:
    """The file, the field or place, the value; the wording: tests/test_bad_inputs.py."""
    run_dir = finished_run(tmp_path)
    (run_dir / "summary.json").write_text(content)
    line = one_line(["report", str(tmp_path)], capsys)
    assert line.startswith(f"summary {run_dir / 'summary.json'}: ") and all(n in line for n in named), line
    assert not (tmp_path / "results.md").exists()


def test_report_on_metrics_fedsim_did_not_write_names_the_line_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = finished_run(tmp_path)
    rewrite_metrics(run_dir, '{"round": 3, "client_mean_acc": "high"}', '{"round": 4, "client_mean_acc": 0.5}')
    line = one_line(["report", str(tmp_path)], capsys)  # the file, line, field and value; wording: the corpus
    assert line.startswith(f"metrics {run_dir / 'metrics.jsonl'}, line 3: ") and "client_mean_acc" in line
    assert "(got 'high')" in line
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # a run's lines name their round
    line = one_line(["report", str(tmp_path)], capsys)
    assert line.startswith(f"metrics {run_dir / 'metrics.jsonl'}, line 1: ") and "round" in line


NOT_A_METRIC = "a metric is a number or null, or a list or mapping of them"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('{"round": 3, "train_loss": "x"}', ("train_loss", "(got 'x')")),
        ('{"round": 3, "train_loss": true}', ("train_loss", "(got True)")),
        ('{"round": 3, "client_acc": [0.5, "x"]}', ("client_acc.1", "(got 'x')")),
        ('{"round": 3, "client_mean_acc": 0.4}', ("round: 3 ", "round 3")),
        ('{"round": 1, "client_mean_acc": 0.4}', ("round: 1 ", "round 3")),
        ('{"round": 0, "client_mean_acc": 0.4}', ("round", "(got 0)")),
        # lines the run could not have written: the report printed "rounds to 50%" 99999999999999991611392
        ('{"round": 99999999999999999999999, "client_mean_acc": 0.5}',
         ("round", "99999999999999999999999", "4 rounds")),
        ('{"round": 5, "client_mean_acc": 0.5}', ("round", "round 5", "4 rounds", "(got 5)")),
        ('{"round": 4, "time_s": -5}', ("time_s", "(got -5)")),
        ('{"round": 4, "rss_mb": -1.5}', ("rss_mb", "(got -1.5)")),
        ('{"round": 4, "client_acc": [0.5, 1.5]}', ("client_acc.1", "(got 1.5)")),
        ('{"round": 4, "round": 3}', ("(round: ",)),  # the last won
        ('{"round": 4, "failed_clients": {"2": [1], "2": [3]}}', ("(2: ",)),
    ],
)  # fmt: skip
def test_every_reader_of_metrics_refuses_a_line_fedsim_would_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, named: tuple[str, ...]
) -> None:
    """Text for a number, or a round repeated or out of order: report, plot and the API refuse the file
    in one line naming the line and the field (they drew and tabulated it before); fedsim's own lines read.
    The wording: tests/test_bad_inputs.py."""
    from fedsim.app.api import Run
    from fedsim.errors import FedsimError

    run_dir = finished_run(tmp_path)
    # its summary as a fedsim before checksums wrote it, upgraded over the lines rewritten here (which it then
    # vouches for): the lines rewritten below are read for their form
    summary = json.loads((run_dir / "summary.json").read_text())
    kept = {k: v for k, v in summary.items() if k not in ("files", "summary_sha256", "record_version")}
    (run_dir / "summary.json").write_text(json.dumps(kept))
    own = '{"round": 3, "client_acc": [0.5, null], "failed_clients": {"2": [1, 3]}, "isometry": {"fc": 1}}'
    metrics = rewrite_metrics(run_dir, own, json.dumps(METRICS[-1]))  # a line of another form fedsim writes
    assert main(["record", "upgrade", str(run_dir)]) == 0
    capsys.readouterr()
    assert len(Run(run_dir).metrics) == 4
    rewrite_metrics(run_dir, own, line)
    for said in (one_line(["report", str(tmp_path)], capsys), one_line(["plot", str(run_dir)], capsys)):
        assert said.startswith(f"metrics {metrics}, line 4: ") and all(n in said for n in named), said
    with pytest.raises(FedsimError, match=r"line 4\b"):
        _ = Run(run_dir).metrics
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".md", ".csv", ".png", ".pdf")]


def test_a_local_continuations_step_beyond_its_steps_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fedsim local's metrics end at its --steps (local.json): a step beyond it is no line it wrote."""
    local = continued_run(tmp_path / "run") / "local-0"
    local.mkdir()
    request = {"run_dir": "r", "client": 0, "steps": 40, "every": 10, "classes": [0], "lr": 0.1, "momentum": 0.0,
               "weight_decay": 0.0, "batch_size": 4, "augment": False, "model_sha256": MODEL_SHA256}  # fmt: skip
    (local / "local.json").write_text(json.dumps(request))
    line = '{"step": %d, "own_class_acc": 0.5, "other_class_acc": 0.1}\n'
    (local / "metrics.jsonl").write_text(line % 0 + line % 50)
    said = one_line(["plot", str(local), "--out", str(tmp_path / "plots")], capsys)
    assert said.startswith(f"metrics {local / 'metrics.jsonl'}, line 2: ") and "step" in said, said
    assert "40 steps" in said and "(got 50)" in said  # the bound and the value


def test_runs_of_one_config_and_seed_are_refused_not_counted_as_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copied run directory, or a seed run twice, is one sample: the report read "seeds 2, 12.28 ± 0.00" for
    two copies, and "seeds 5" for four seed-0 runs and a seed-1000 one. Report and plot's mean over seeds refuse
    it, naming both directories; distinct seeds are counted."""
    import csv

    run_dir = finished_run(tmp_path / "runs")
    finished_run(tmp_path / "runs", "seed1", seed=1)
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]
    copy = finished_run(tmp_path / "runs", "r-copy", simulation={"threads": 3})  # name and threads aside, r again
    said = one_line(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep2")], capsys)
    assert said.startswith(f"{run_dir} and {copy} ") and "seed 0" in said, said  # both directories, the seed
    argv = ["plot", str(tmp_path / "runs"), "--mean-over-seeds", "--out", str(tmp_path / "plots")]
    assert one_line(argv, capsys) == said
    assert not (tmp_path / "rep2" / "results.md").exists()


def test_a_run_named_twice_is_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same run directory given again by another spelling (absolute, a symlink, the directory above it):
    plot drew it twice, and with --mean-over-seeds refused it as two copies of seed 0 to move apart."""
    from fedsim.app.plots import find_runs

    run_dir = finished_run(tmp_path / "runs")
    (tmp_path / "link").symlink_to(run_dir)
    named = [str(run_dir), str(tmp_path / "runs"), str(tmp_path / "link"), f"{tmp_path}/runs/../runs/r"]
    assert find_runs(named) == [run_dir]
    assert main(["plot", *named, "--mean-over-seeds", "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "accuracy.png").is_file()
    capsys.readouterr()


def test_report_names_the_runs_it_leaves_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run without summary.json (running, stopped, failed) is not in the table: said on stderr, as plot says
    what it skips; the mean over the seeds that did finish was shown with one seed fewer and no word. So is one
    without fedsim's mark (.fedsim), as a run directory cloned from a repository is (results/full-budget's)."""
    import csv
    import shutil

    finished_run(tmp_path / "runs")
    stopped = finished_run(tmp_path / "runs", "seed1", seed=1)
    (stopped / "summary.json").unlink()
    cloned = tmp_path / "runs" / "seed1-cloned"
    shutil.copytree(stopped, cloned)
    (cloned / ".fedsim").unlink()
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    assert capsys.readouterr().err == "".join(
        f"fedsim: skipped {run}: not finished (no summary.json)\n" for run in (stopped, cloned)
    )
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["1"]


def test_report_into_a_directory_it_cannot_write_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only directory (as root, chmod does not stop a write: the refusal is simulated at open, where
    fedsim.files makes a file in the directory it opened)."""
    finished_run(tmp_path)
    real_open = os.open

    def read_only(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        where = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) if dir_fd is not None else Path(path).parent
        if flags & os.O_CREAT and where == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", read_only)
    said = one_line(["report", str(tmp_path)], capsys)  # a folder of runs becomes fedsim's results: marked first
    assert f"{tmp_path} " in said and ".fedsim" in said and said.endswith(": Permission denied"), said
    assert not [p.name for p in tmp_path.iterdir() if p.name != "r"]  # no results, no temp file
    monkeypatch.undo()
    (tmp_path / ".fedsim").write_text("results\n")
    monkeypatch.setattr(os, "open", read_only)
    said = one_line(["report", str(tmp_path)], capsys)
    assert f"{tmp_path / 'results.csv'}: Permission denied" in said, said  # the file and the system's reason
    assert not [p.name for p in tmp_path.iterdir() if p.name not in ("r", ".fedsim")]


def test_a_model_or_checkpoint_that_is_a_fifo_is_refused_unread(tmp_path: Path) -> None:
    """torch.load waited on a FIFO forever (fedsim local on a run whose model.pt is one; a checkpoint)."""
    from fedsim.errors import FedsimError
    from fedsim.record.reader import read_torch

    with pytest.raises(FedsimError, match=r"model .*fifo\.pt: .*FIFO"):
        read_torch(make_fifo(tmp_path / "fifo.pt"), "model")
    with pytest.raises(FileNotFoundError):  # a missing file stays for its caller to name the run
        read_torch(tmp_path / "missing.pt", "model")


def test_resume_through_a_symlink_loop_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert "--resume" in one_line(["run", "--resume", str(tmp_path / "a")], capsys)


# --- files a launcher polls while the ServerApp writes them (fedsim deploy; the compose project's submit service)


class Shown:
    """A progress display that keeps what it was shown."""

    def __init__(self) -> None:
        self.rounds: list[tuple[int, float | None, float | None]] = []

    def update(self, server_round: int, loss: float | None, acc: float | None) -> None:
        self.rounds.append((server_round, loss, acc))


def test_fedsim_deploy_polls_without_hanging_on_or_trusting_a_file_fedsim_did_not_write(tmp_path: Path) -> None:
    """progress.json is shown when it is what the ServerApp writes and skipped otherwise (missing, a FIFO, a
    foreign file: it was a TypeError traceback); summary.json and error.txt end the run, and either one that is
    not what fedsim writes is one error naming it (json.loads waited on a FIFO, read a huge file whole)."""
    from fedsim.deploy.launcher import _show, ended
    from fedsim.errors import FedsimError

    shown = Shown()
    progress = tmp_path / "progress.json"
    _show(tmp_path, shown)  # before the first round
    make_fifo(progress)
    _show(tmp_path, shown)
    progress.unlink()
    for foreign in ('{"round": "two", "loss": 1.0, "acc": 0.5}', "[2]", '{"round": 2'):
        progress.write_text(foreign)
        _show(tmp_path, shown)
    assert shown.rounds == []
    progress.write_text(written(round=2, loss=0.5, acc=None))
    _show(tmp_path, shown)
    assert shown.rounds == [(2, 0.5, None)]

    assert ended(tmp_path) is None  # still running
    error = make_fifo(tmp_path / "error.txt")
    with pytest.raises(FedsimError, match=r"^the ServerApp's error .*error\.txt: .*FIFO"):
        ended(tmp_path)
    error.unlink()
    error.write_text("training diverged at round 3")
    with pytest.raises(FedsimError, match=r"^training diverged at round 3$"):
        ended(tmp_path)
    summary = make_fifo(tmp_path / "summary.json")  # the summary comes first: the run finished
    with pytest.raises(FedsimError, match=r"^summary .*summary\.json: .*FIFO"):
        ended(tmp_path)
    summary.unlink()
    with open(summary, "wb") as f:
        f.truncate(50_000_000)
    with pytest.raises(FedsimError, match=r"summary\.json: .*50,000,000.*16,777,216"):
        ended(tmp_path)
    final = {"rounds": 2, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.6, "final_global_acc": 0.55,
             "wall_time_s": 3.0, "summary_sha256": "0" * 64}  # fmt: skip
    summary.write_text(written(**final))
    assert ended(tmp_path) == json.loads(written(**final))


def test_the_submit_service_polls_without_hanging_on_or_trusting_a_file_fedsim_did_not_write(tmp_path: Path) -> None:
    """The compose project's submit service prints each round from progress.json and metrics.jsonl and the
    summary at the end: a FIFO or a foreign file there is skipped while the run goes (it was a TypeError
    traceback in the polling thread) and named at the end."""
    from fedsim.deploy.submit import RoundPrinter

    lines: list[str] = []
    printer = RoundPrinter(tmp_path, 3, lines.append)
    progress, metrics = tmp_path / "progress.json", tmp_path / "metrics.jsonl"
    make_fifo(progress)
    printer.poll()
    progress.unlink()
    progress.write_text('{"round": "two", "loss": null, "acc": null}')
    printer.poll()
    assert lines == []
    progress.write_text(written(round=2, loss=None, acc=None))
    make_fifo(metrics)
    printer.poll()
    assert lines == ["round 2/3: train loss -"]  # the round, without the scores it cannot read
    metrics.unlink()
    metrics.write_text('{"round": 3, "client_mean_acc": null, "global_acc": 0.4, "time_s": 6.0}\n')
    progress.write_text(written(round=3, loss=0.5, acc=None))
    printer.poll()
    assert lines[-1] == "round 3/3: train loss 0.5000, client-mean acc -, global acc 0.4000, 6.0 s"
    summary = make_fifo(tmp_path / "summary.json")
    printer.summary()
    assert lines[-1].startswith(f"summary: summary {summary}: ") and "FIFO" in lines[-1]
    summary.unlink()
    summary.write_text('{"rounds": 3}')
    printer.summary()
    assert lines[-1].startswith(f"summary: summary {summary}: ") and "final_client_mean_acc" in lines[-1]
    assert "2 more" in lines[-1]
    assert len(lines) == 4
