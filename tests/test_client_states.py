"""A resume continues the run's own client state or refuses: ``checkpoint.pt`` records the SHA-256 of each
partition's state file, and a resume whose ``client_state/`` lost files (deleted to free disk), holds another
run's, or holds only an older round's stops in one line before any training, naming the run directory, the
partition and the file (fedsim.server.client_states). Each of these resumed with exit 0 and ended with numbers
the run never computed (SCAFFOLD 0.742, 0.731, 0.681 for 0.784)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.app.cli import main
from fedsim.config_file import parse_config
from fedsim.digest import digest
from fedsim.engines.runner import run
from fedsim.record.checkpoint import CLIENT_STATE_RECORD, PAYLOAD, Checkpoint
from fedsim.record.layout import CHECKPOINT, CLIENT_STATE
from tests import strategy_rows
from tests.conftest import small_config
from tests.test_deploy import wait_no_processes
from tests.test_resume import metrics, stopped_in

# every strategy whose clients keep state across rounds (SCAFFOLD's c_i, FedBN's BN tensors and statistics)
STATEFUL = {name: strategy_rows.sections(name) for name in strategy_rows.ROWS if strategy_rows.keeps_client_state(name)}
ROUNDS, EVERY, STOP = 6, 2, 4  # checkpoints at rounds 2 and 4; stopped after round 4's


def config(tmp_path: Path, name: str, sections: dict[str, Any], **top: Any) -> dict[str, Any]:
    """small_config with every round evaluated: a metrics line past round 4 would show a round trained."""
    raw = small_config(tmp_path, **{**sections, "eval": {**sections.get("eval", {}), "every": 1}}, **top)
    raw["train"]["rounds"] = ROUNDS
    raw["output"].update(run_dir=str(tmp_path / name), checkpoint_every=EVERY)
    return raw


def stopped(raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Path:
    """``raw`` run and stopped (Ctrl-C) as round STOP + 1 reports, after round STOP's checkpoint."""
    run_dir = stopped_in(raw, STOP + 1, monkeypatch)
    assert Checkpoint.load(run_dir).round == STOP and [m["round"] for m in metrics(run_dir)] == list(range(1, STOP + 1))
    return run_dir


def state_file(run_dir: Path, pid: int, server_round: int = STOP) -> Path:
    return run_dir / CLIENT_STATE / f"partition-{pid}" / f"round-{server_round}.bin"


def resume(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["run", "--resume", str(run_dir)])
    return rc, capsys.readouterr().err


def refused(run_dir: Path, capsys: pytest.CaptureFixture[str], named: dict[int, str]) -> None:
    """Exit 2 and the one line that names the run, the checkpoint's round, and each partition of ``named`` with
    its state file (then what it names after the file), and no other; nothing trained, nothing finished. The
    wording: tests/test_bad_inputs.py."""
    rc, err = resume(run_dir, capsys)
    assert rc == 2 and err.startswith(f"fedsim: error: {run_dir}: ") and len(err.splitlines()) == 1, err
    assert re.search(rf"\bcheckpoint\.pt\b.*\bround {STOP}\b", err), err
    for pid, after in named.items():
        assert re.search(rf"\bpartition {pid}: {re.escape(str(state_file(run_dir, pid)))}\b[^;]*{after}", err), err
    assert [p for p in range(4) if f"partition {p}: " in err] == sorted(named), err
    assert [m["round"] for m in metrics(run_dir)] == list(range(1, STOP + 1))
    assert not (run_dir / "summary.json").exists()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("strategy", list(STATEFUL))
@pytest.mark.slow
def test_resume_refuses_client_state_missing_another_runs_or_another_rounds(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sections = STATEFUL[strategy]
    whole = run(parse_config({**config(tmp_path, "whole", sections), "output": small_config(tmp_path)["output"]}))
    expected = metrics(Path(whole["run_dir"]))
    part = stopped(config(tmp_path, "part", sections), monkeypatch)
    other = stopped(config(tmp_path, "other", sections, seed=1), monkeypatch)  # another run at the same round
    partitions = range(4)  # every client trains every round: each has state at round 4 (and round 2's, kept)
    assert sorted(p.relative_to(part).as_posix() for p in (part / CLIENT_STATE).rglob("*.bin")) == sorted(
        state_file(part, pid, r).relative_to(part).as_posix() for pid in partitions for r in (2, STOP)
    )
    runs = {case: tmp_path / case for case in ("intact", "missing", "foreign", "stale")}
    for path in runs.values():
        shutil.copytree(part, path)

    shutil.rmtree(runs["missing"] / CLIENT_STATE)  # deleted to free disk, or not copied along with the run
    refused(runs["missing"], capsys, dict.fromkeys(partitions, ""))

    shutil.rmtree(runs["foreign"] / CLIENT_STATE)
    shutil.copytree(other / CLIENT_STATE, runs["foreign"] / CLIENT_STATE)
    refused(runs["foreign"], capsys, dict.fromkeys(partitions, ""))

    for pid in partitions:
        state_file(runs["stale"], pid).unlink()  # round 2's files are left
    refused(runs["stale"], capsys, dict.fromkeys(partitions, r"\bround-2\.bin\b"))  # the other round's file named

    for case in ("intact", "missing"):  # the refused run resumes once its own files are back
        if case == "missing":
            shutil.copytree(part / CLIENT_STATE, runs[case] / CLIENT_STATE)
        assert resume(runs[case], capsys)[0] == 0
        assert metrics(runs[case]) == expected
        assert json.loads((runs[case] / "summary.json").read_text())["resumed_from_round"] == STOP


def as_version_1(run_dir: Path, *dropped: str) -> None:
    """``checkpoint.pt`` as record version 1 wrote it (its fields and their digest, no record version), without
    the fields ``dropped`` (as a fedsim before them wrote it)."""
    outer = torch.load(run_dir / CHECKPOINT, weights_only=True)
    payload = torch.load(io.BytesIO(outer[PAYLOAD].numpy().tobytes()), weights_only=True)
    for key in dropped:
        del payload[key]
    buffer = io.BytesIO()
    torch.save({**payload, "sha256": digest(payload)}, buffer)
    (run_dir / CHECKPOINT).write_bytes(buffer.getvalue())


@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
def test_an_older_checkpoint_is_upgraded_and_resumes_and_one_without_the_record_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An older checkpoint is refused by a resume, naming the upgrade; upgraded, it resumes to the
    uninterrupted run's numbers (SCAFFOLD: its clients' state checked against the record it kept). One without
    the record of its clients' state cannot be checked against anything: the upgrade refuses it, not trusted."""
    scaffold = config(tmp_path, "scaffold", STATEFUL["scaffold"])
    expected = metrics(Path(run(parse_config({**scaffold, "output": small_config(tmp_path)["output"]}))["run_dir"]))
    older = stopped(scaffold, monkeypatch)
    as_version_1(older)
    rc, err = resume(older, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(r"checkpoint\.pt\b.*\bversion 0\b", err), err
    assert "fedsim record upgrade" in err, err  # the file, its version and the command (wording: the corpus)
    assert main(["record", "upgrade", str(older)]) == 0 and "checkpoint.pt upgraded" in capsys.readouterr().out
    assert Checkpoint.load(older).round == STOP and len(Checkpoint.load(older).client_state) == 4
    assert resume(older, capsys)[0] == 0 and metrics(older) == expected

    unrecorded = stopped(config(tmp_path, "unrecorded", STATEFUL["scaffold"]), monkeypatch)
    as_version_1(unrecorded, CLIENT_STATE_RECORD)
    before = (unrecorded / CHECKPOINT).read_bytes()
    assert main(["record", "upgrade", str(unrecorded)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {unrecorded / CHECKPOINT}: ") and "client_state" in err, err
    assert len(err.splitlines()) == 1, err  # the file and the record it lacks (wording: the corpus)
    assert (unrecorded / CHECKPOINT).read_bytes() == before  # left as it was


@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
def test_partitions_without_state_at_the_checkpoint_resume_empty_whatever_files_lie_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One client of four a round: a partition the checkpoint recorded no state for starts empty, as it
    would have in the uninterrupted run, even with another run's file under its name (never read)."""
    raw = config(tmp_path, "part", {**STATEFUL["scaffold"], "train": {"clients_per_round": 1}})
    expected = metrics(Path(run(parse_config({**raw, "output": small_config(tmp_path)["output"]}))["run_dir"]))
    part = stopped(raw, monkeypatch)
    record = Checkpoint.load(part).client_state
    assert record is not None and 0 < len(record) < 4, record  # some partitions not sampled by round 4
    other = stopped(config(tmp_path, "other", STATEFUL["scaffold"], seed=1), monkeypatch)  # every partition has state
    for pid in set(range(4)) - set(record):
        shutil.copytree(other / CLIENT_STATE / f"partition-{pid}", part / CLIENT_STATE / f"partition-{pid}")
    assert resume(part, capsys)[0] == 0
    assert metrics(part) == expected


@pytest.mark.slow
def test_deploy_resume_refuses_missing_client_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check under a SuperLink: new SuperNode processes load the state, the ServerApp refuses it."""
    part = stopped(config(tmp_path, "part", {**STATEFUL["scaffold"], "train": {"num_clients": 2}}), monkeypatch)
    state_file(part, 1).unlink()
    state_file(part, 1, 2).unlink()
    res = subprocess.run([sys.executable, "-m", "fedsim.app.cli", "deploy", "--resume", str(part)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.startswith("fedsim: error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith(f"fedsim: error: {part}: ") and re.search(rf"\bround {STOP}\b", lines[0]), lines[0]
    assert f"partition 1: {state_file(part, 1)}" in lines[0] and "partition 0" not in lines[0]  # wording: the corpus
    assert [m["round"] for m in metrics(part)] == list(range(1, STOP + 1))
    assert wait_no_processes(part, timeout=60) == []  # no SuperLink or SuperNode outlives the refusal
