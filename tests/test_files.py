"""fedsim never writes, truncates or deletes through a link it did not make (fedsim.files): a symbolic link, or a
file's second name (a hard link), inside a run, sweep, compose project or ``fedsim local`` directory stops the
command with exit status 2 and one line naming it, before anything is written: the link's target keeps its
bytes and times, and so does everything in the directory. Each case runs the ``fedsim`` command as a user would,
in a process of its own."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedsim.app.cli import main
from fedsim.errors import WriteError
from fedsim.files import open_file
from tests.conftest import REPO, small_config, write_config
from tests.fault_lines import assert_said
from tests.test_resume import killed_at

QUICKSTART = REPO / "configs" / "quickstart.yaml"
OWN = b"the user's own file\n"


def fedsim(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fedsim.app.cli", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def snapshot(root: Path) -> dict[str, Any]:
    """Every entry below ``root`` (links not followed): its kind, its modification time, and its bytes (a file) or
    where it points (a link); and ``root``'s own time, which an entry made and removed again changes."""
    found: dict[str, Any] = {".": os.lstat(root).st_mtime_ns}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            info = os.lstat(path)
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
            content = os.readlink(path) if stat.S_ISLNK(info.st_mode) else content
            found[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), info.st_mtime_ns, content)
    return found


def refused(args: list[str], directory: Path, link: Path, target: Path | None) -> None:
    """``fedsim args`` stopped with exit status 2 and one line naming the link (and, for a symbolic one, its
    target), and nothing in ``directory`` or in the user's (``target``'s, the second name's) changed."""
    user = directory.parent / "user"
    before = snapshot(directory), snapshot(user)
    proc = fedsim(*args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("fedsim: error: "), proc.stderr[-3000:]
    line = proc.stderr.strip().removeprefix("fedsim: error: ")
    path = re.escape(str(link))
    if target is not None:
        assert_said("symbolic link among fedsim's files", line, path=path, target=re.escape(str(target)))
    else:
        assert_said("hard link among fedsim's files", line, path=path, names=2)
    assert (snapshot(directory), snapshot(user)) == before


def copied(run: Path, tmp_path: Path) -> Path:
    """A copy of the run directory ``run`` in ``tmp_path``, beside an empty directory of the user's."""
    (tmp_path / "user").mkdir()
    return Path(shutil.copytree(run, tmp_path / "run", symlinks=True))


def moved(entry: Path, user: Path) -> Path:
    """``entry`` moved into the user's directory and a symbolic link to it put in its place; returns where it is."""
    target = user / entry.name
    shutil.move(entry, target)
    entry.symlink_to(target)
    return target


def own_file(entry: Path, user: Path) -> Path:
    """``entry`` (removed if there) a symbolic link to a file of the user's."""
    target = user / "own.txt"
    target.write_bytes(OWN)
    entry.unlink(missing_ok=True)
    entry.symlink_to(target)
    return target


def own_dir(entry: Path, user: Path) -> Path:
    """``entry`` a symbolic link to an empty directory of the user's."""
    target = user / "folder"
    target.mkdir()
    entry.symlink_to(target)
    return target


def hard_link(entry: Path, user: Path) -> None:
    """The user's second name for ``entry``."""
    os.link(entry, user / f"second-{entry.name}")


def own_file_hard_linked(entry: Path, user: Path) -> None:
    """``entry`` replaced by a second name of a file of the user's."""
    (user / "own.txt").write_bytes(OWN)
    entry.unlink()
    os.link(user / "own.txt", entry)


Plant = Callable[[Path, Path], Path | None]  # the entry, the user's directory -> the link's target (None: a hard link)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with client state (SCAFFOLD) and TensorBoard's tb/, killed in round 2 after round 1's checkpoint."""
    root = tmp_path_factory.mktemp("stopped")
    raw = small_config(root, strategy={"name": "scaffold"}, train={"rounds": 2}, eval={"every": 1})
    raw["output"].update(run_dir=str(root / "run"), checkpoint_every=1, trackers=["tensorboard"])
    killed_at(root, write_config(root, raw), kill_round=2)
    assert (root / "run" / "client_state" / "partition-0" / "round-1.bin").is_file() and (root / "run" / "tb").is_dir()
    return root / "run"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    raw = small_config(root, train={"rounds": 1})
    raw["output"].update(run_dir=str(root / "run"))
    assert main(["run", str(write_config(root, raw))]) == 0
    return root / "run"


IN_A_STOPPED_RUN: dict[str, tuple[str, Plant]] = {
    "lock": (".lock", own_file),  # the red team's: overwritten with "pid N, since ..."
    "client-state": ("client_state", moved),  # the red team's: round files written there and older ones deleted
    "partition-folder": ("client_state/partition-0", moved),
    "round-file": ("client_state/partition-0/round-1.bin", moved),
    "metrics": ("metrics.jsonl", moved),
    "checkpoint": ("checkpoint.pt", moved),
    "model": ("model.pt", own_file),
    "summary": ("summary.json", own_file),
    "progress": ("progress.json", moved),
    "tb": ("tb", moved),
    "metrics-hard-link": ("metrics.jsonl", hard_link),
    "lock-hard-link": (".lock", own_file_hard_linked),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", IN_A_STOPPED_RUN)
def test_a_link_in_a_stopped_run_stops_its_resume(stopped: Path, tmp_path: Path, case: str) -> None:
    run_dir = copied(stopped, tmp_path)
    entry, plant = IN_A_STOPPED_RUN[case]
    target = plant(run_dir / entry, tmp_path / "user")
    refused(["run", "--resume", str(run_dir)], run_dir, run_dir / entry, target)


@pytest.mark.slow
def test_links_that_fedsim_does_not_write_through_are_left_alone(stopped: Path, tmp_path: Path) -> None:
    """A tracker library's own links (wandb's ``wandb/latest-run``) and a user's own link beside the run's files are
    not fedsim's to refuse: the resume finishes, and they are as they were."""
    run_dir = copied(stopped, tmp_path)
    (run_dir / "wandb" / "run-1").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to("run-1")
    (tmp_path / "user" / "notes.md").write_bytes(OWN)
    (run_dir / "notes.md").symlink_to(tmp_path / "user" / "notes.md")
    proc = fedsim("run", "--resume", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.readlink(run_dir / "wandb" / "latest-run") == "run-1" and (run_dir / "notes.md").read_bytes() == OWN


@pytest.mark.slow
def test_a_link_among_a_killed_runs_leftovers_stops_a_fresh_run(stopped: Path, tmp_path: Path) -> None:
    """A run killed with nothing to resume is cleared by a fresh run in its directory: never through a link."""
    run_dir = copied(stopped, tmp_path)
    (run_dir / "checkpoint.pt").unlink()
    target = moved(run_dir / "client_state", tmp_path / "user")
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["output"]["run_dir"] = str(run_dir)
    refused(["run", str(write_config(tmp_path, raw))], run_dir, run_dir / "client_state", target)


@pytest.mark.slow
def test_a_sweep_cell_that_is_a_link_stops_the_sweep(tmp_path: Path) -> None:
    base = write_config(tmp_path, small_config(tmp_path, train={"rounds": 1}))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, "name": "s", "output": str(tmp_path), "grid": {"seed": [0]}}))
    out = tmp_path / "s"
    out.mkdir()
    (out / ".fedsim").write_text("sweep\n")  # as a sweep that ran here before marked it
    (tmp_path / "user").mkdir()
    target = own_dir(out / "seed=0", tmp_path / "user")
    refused(["sweep", str(sweep)], out, out / "seed=0", target)


@pytest.mark.slow
def test_a_link_in_a_compose_project_stops_fedsim_compose(tmp_path: Path) -> None:
    out = tmp_path / "project"
    assert main(["compose", str(QUICKSTART), "--out", str(out)]) == 0
    (tmp_path / "user").mkdir()
    target = moved(out / "compose.yaml", tmp_path / "user")
    refused(["compose", str(QUICKSTART), "--out", str(out)], out, out / "compose.yaml", target)


@pytest.mark.slow
def test_a_continuation_directory_that_is_a_link_stops_fedsim_local(finished: Path, tmp_path: Path) -> None:
    run_dir = copied(finished, tmp_path)
    target = own_dir(run_dir / "local-0", tmp_path / "user")
    refused(["local", str(run_dir), "--client", "0", "--steps", "2"], run_dir, run_dir / "local-0", target)


@pytest.mark.slow
def test_a_report_file_that_is_a_link_stops_fedsim_report(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / ".fedsim").write_text("results\n")  # as an earlier report marked it
    (tmp_path / "user").mkdir()
    target = own_file(out / "results.md", tmp_path / "user")
    refused(["report", str(finished.parent), "--out", str(out)], out, out / "results.md", target)


def test_a_link_under_a_supernodes_state_dir_is_refused_as_the_node_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SuperNode's ``state-dir`` is the user's; the run's folder and the partition folders in it are fedsim's."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedsim import wire

    for name in ("_run_id", "_node_id", "_task_id"):  # as a Grid sets them in the sender's process
        monkeypatch.setattr(TaskIdentity, name, 1)
    from fedsim.client.state import state_query
    from fedsim.errors import LinkError

    state_dir, user = tmp_path / "state-dir", tmp_path / "user"
    (state_dir / "run-key").mkdir(parents=True)
    user.mkdir()
    node = {wire.PARTITION_ID: 0, wire.STATE_DIR: str(state_dir)}
    context = Context(1, 1, node, RecordDict({"s": ArrayRecord({"x": torch.ones(2)})}), {})
    ask = {wire.STATE_ROUND: 2, wire.STATE_KEEP: 1, wire.STATE_DIR: "unused", wire.RUN_KEY: "run-key"}
    save = Message(RecordDict({wire.CONFIG: ConfigRecord(ask)}), dst_node_id=1, message_type=wire.SAVE_STATE)
    for entry in ["run-key", "run-key/partition-0"]:
        if entry == "run-key":
            (state_dir / entry).rmdir()
        target = own_dir(state_dir / entry, user)
        before = snapshot(user)
        with pytest.raises(LinkError) as err:
            state_query(save, context)
        path, to = re.escape(str(state_dir / entry)), re.escape(str(target))
        assert_said("symbolic link among fedsim's files", str(err.value), path=path, target=to)
        assert snapshot(user) == before
        (state_dir / entry).unlink()
        target.rmdir()
        (state_dir / "run-key").mkdir(exist_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", [".lock", "progress.json", "client_state/partition-0/round-1.bin"])
def test_a_fifo_among_a_stopped_runs_files_stops_its_resume_in_one_line(
    stopped: Path, tmp_path: Path, entry: str
) -> None:
    """Another writer of the filesystem: a FIFO (named pipe) among what fedsim writes in a run directory is
    refused in one line naming it before anything is written, as a link is (at a stopped run's ``.lock``, the
    resume's ftruncate of it failed, EINVAL; a deploy's log opened to append waited for a reader)."""
    run_dir = copied(stopped, tmp_path)
    (run_dir / entry).unlink()
    os.mkfifo(run_dir / entry)
    before = snapshot(run_dir)
    proc = fedsim("run", "--resume", str(run_dir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("fedsim: error: "), proc.stderr
    line = proc.stderr.strip().removeprefix("fedsim: error: ")
    path = re.escape(str(run_dir / entry))
    assert_said("not a file among fedsim's files", line, path=path, kind=r"a FIFO \(named pipe\)")
    assert snapshot(run_dir) == before


def test_a_fifo_in_place_of_a_log_is_refused_not_waited_on(tmp_path: Path) -> None:
    """fedsim.files.open_file, as ``fedsim deploy`` opens its processes' logs to append to: a FIFO there, which
    nobody reads, is one error naming it at once (opening it to write waited for a reader forever)."""
    os.mkfifo(tmp_path / "superlink.log")
    with pytest.raises(WriteError) as err:
        open_file(tmp_path / "superlink.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    path = re.escape(str(tmp_path / "superlink.log"))
    assert_said("not a file among fedsim's files", str(err.value), path=path, kind=r"a FIFO \(named pipe\)")
