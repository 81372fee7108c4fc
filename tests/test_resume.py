"""Checkpoint and resume: a run killed with SIGKILL and resumed ends exactly where an uninterrupted
run ends; a NaN / inf stops a run, naming round and client, and keeps the last good checkpoint."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.app.cli import main
from fedsim.client.state import load_client_state, save_client_state
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import FedsimError, TrainingError
from fedsim.record.checkpoint import Checkpoint, resume_config
from fedsim.record.layout import CHECKPOINT, RECORD_VERSION
from fedsim.record.run import read_run
from fedsim.server.reporter import RoundReporter
from tests import strategy_rows
from tests.conftest import REPO, small_config, write_config
from tests.fault_lines import assert_said, fault_line

WALL_CLOCK = ("time_s", "rss_mb")  # facts about the machine, not results


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines]


def fedsim(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "fedsim.app.cli", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_round(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["round"] if lines else 0


def killed_at(tmp_path: Path, config: Path, kill_round: int) -> None:
    """``fedsim run config``, SIGKILLed by its own process when round ``kill_round`` is reported
    (tests/sigkill_at_round.py): at that round on any machine, where a watcher polling the run directory
    raced the run (killing a round late or after the run had ended, on a loaded or a fast machine)."""
    log = tmp_path / "killed.log"  # a file, not a pipe: nothing waits on Ray's processes that outlive the run
    with log.open("w") as out:
        cmd = [sys.executable, "-m", "tests.sigkill_at_round", str(kill_round), "run", str(config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"rc {proc.returncode}: {log.read_text()[-3000:]}"


def check_resume(tmp_path: Path, stateful: bool, every: int = 4, **sections: Any) -> None:
    """Run uninterrupted; run again with checkpoints, SIGKILL it mid-way, resume it: same metrics, same model.

    The uninterrupted run is inline on one thread whatever the engine (small_config's simulation section: left
    out, ``backend: auto`` would start a Ray pool on any machine of 2+ cores): every engine gives the same
    numbers, bit for bit (tests/test_engines.py), and inline saves starting Ray for it."""
    # killed at round 2*every-1 and resumed from round `every`: 10 rounds take the resumed run over a
    # checkpoint of its own (round 2*every) and on past it
    train = {"rounds": 10, **sections.pop("train", {})}
    base = small_config(tmp_path, train=train, **sections)
    inline = {**{k: v for k, v in base.items() if k != "engine"}, "simulation": small_config(tmp_path)["simulation"]}

    whole = run(parse_config({**inline, "output": {**base["output"], "run_dir": str(tmp_path / "whole")}}))
    expected = metrics(Path(whole["run_dir"]))

    killed_dir = tmp_path / "killed"
    cfg = {**base, "output": {**base["output"], "run_dir": str(killed_dir), "checkpoint_every": every}}
    # in the last round before the second checkpoint: the first one written, and a metrics line past it
    # (small_config evaluates every 2 rounds, and every >= 3), which the resumed run must drop
    killed_at(tmp_path, write_config(tmp_path, cfg), kill_round=2 * every - 1)
    assert not (killed_dir / "summary.json").exists()
    at = Checkpoint.load(killed_dir).round
    assert at == every
    assert last_round(killed_dir) > at
    assert len(read_run(killed_dir)["metrics"]) == len(metrics(killed_dir))  # progress.json's checksum holds
    saved = sorted((killed_dir / "client_state").glob("partition-*/round-*.bin"))
    if stateful:  # the clients trained so far, at this checkpoint and maybe the one before or after
        assert saved and all(int(f.stem.removeprefix("round-")) in (at - every, at, at + every) for f in saved)
    else:
        assert not saved  # stateless clients write nothing

    resumed = fedsim("run", "--resume", str(killed_dir))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == str(killed_dir)
    assert metrics(killed_dir) == expected
    assert [m["round"] for m in expected] == list(range(2, 11, 2))
    summary = json.loads((killed_dir / "summary.json").read_text())
    assert summary["resumed_from_round"] == at
    # the resumed run's manifest lists the lines it kept and wrote, not the killed run's past its checkpoint
    assert summary["files"]["metrics.jsonl"]["size"] == len((killed_dir / "metrics.jsonl").read_bytes())
    assert len(read_run(killed_dir)["metrics"]) == len(expected)
    assert summary["final_client_mean_acc"] == whole["final_client_mean_acc"]
    final, reference = torch.load(killed_dir / "model.pt"), torch.load(Path(whole["run_dir"]) / "model.pt")
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    assert not (killed_dir / "client_state").exists()  # a finished run cannot resume: no client state kept


def stopped_in(raw: dict[str, Any], stop_round: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``raw`` run in this process and stopped (Ctrl-C) as round ``stop_round`` reports, after every earlier
    round's metrics line and checkpoint; its run directory."""
    report = RoundReporter.round_done

    def stop(self: RoundReporter, server_round: int, arrays: ArrayRecord, *facts: Any) -> Any:
        if server_round == stop_round:
            raise KeyboardInterrupt
        return report(self, server_round, arrays, *facts)

    monkeypatch.setattr(RoundReporter, "round_done", stop)
    with pytest.raises(KeyboardInterrupt):
        run(parse_config(raw))
    monkeypatch.undo()
    return Path(raw["output"]["run_dir"])


SCAFFOLD = {"strategy": {"name": "scaffold"}, "train": {"clients_per_round": 2}}
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    # every strategy with state on the server or the clients (tests/strategy_rows.py); two clients a round: the
    # state of clients sampled at different rounds, some not at all before the checkpoint
    **{name: {**strategy_rows.sections(name), "train": {"clients_per_round": 2}} for name in strategy_rows.stateful()},
    # client 1 fails from round 2 on and is skipped: a checkpoint at round 3 or 9 holds the failures
    # that the next metrics line (4, 10) lists
    "skipped-failures": {
        "strategy": {"name": "tests.plugins.flaky_client:Flaky", "fail_partition": 1, "fail_from": 2},
        "train": {"on_client_failure": "skip"},
        "every": 3,
    },
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path: Path, case: str) -> None:
    stateful = case in strategy_rows.ROWS and strategy_rows.keeps_client_state(case)
    check_resume(tmp_path, stateful=stateful, **CASES[case])
    if case == "skipped-failures":
        lines = metrics(tmp_path / "killed")
        assert [m["failed_clients"] for m in lines[:2]] == [{"2": [1]}, {"3": [1], "4": [1]}]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(
    "engine",
    [
        {"simulation": {"backend": "ray", "client_resources": {"num_cpus": 1}}},  # c_i in the actors' Contexts
        {"engine": "flower", "simulation": {"client_resources": {"num_cpus": 1}}},  # ... in Flower's node states
    ],
    ids=["ray-pool", "flower"],
)
def test_resume_restores_client_state_under_other_engines(tmp_path: Path, engine: dict[str, Any]) -> None:
    check_resume(tmp_path, stateful=True, **SCAFFOLD, **engine)


@pytest.mark.usefixtures("one_thread")
def test_resume_before_the_first_metrics_line_keeps_the_initial_diagnostics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = small_config(tmp_path, train={"rounds": 6}, eval={"every": 3}, diagnostics={"grad_norms": True})
    expected = metrics(
        Path(run(parse_config({**raw, "output": {**raw["output"], "run_dir": str(tmp_path / "w")}}))["run_dir"])
    )
    raw["output"].update(run_dir=str(tmp_path / "stopped"), checkpoint_every=2)
    run_dir = stopped_in(raw, 3, monkeypatch)  # after round 2's checkpoint, before any metrics line
    assert Checkpoint.load(run_dir).round == 2 and not metrics(run_dir)
    run(resume_config(run_dir), resume=True)
    assert metrics(run_dir) == expected and "init_grad_norms" in expected[0]


def test_client_state_files_keep_what_the_checkpoints_need(tmp_path: Path) -> None:
    def state(value: float) -> RecordDict:
        return RecordDict({"s": ArrayRecord({"x": torch.full((2,), value)}), "c": ConfigRecord({"n": int(value)})})

    d = tmp_path / "partition-0"
    assert save_client_state(RecordDict(), d, 4, keep=0) == ""  # a node with no state writes nothing
    assert not d.exists()
    save_client_state(state(4), d, 4, keep=0)
    sha8 = save_client_state(state(8), d, 8, keep=4)  # if round 8's checkpoint never lands, a resume needs round 4
    assert sorted(p.name for p in d.iterdir()) == ["round-4.bin", "round-8.bin"]
    save_client_state(state(16), d, 16, keep=12)  # the checkpoint of 12 needs round 8's state, not round 4's
    assert sorted(p.name for p in d.iterdir()) == ["round-16.bin", "round-8.bin"]
    loaded = load_client_state(d, 12)
    assert np.array_equal(loaded.state["s"]["x"].numpy(), [8.0, 8.0]) and loaded.state["c"]["n"] == 8
    # what the checkpoint records of the file written is what a resume reads back: its SHA-256, of its bytes
    assert (
        (loaded.round, loaded.sha256) == (8, sha8) == (8, hashlib.sha256((d / "round-8.bin").read_bytes()).hexdigest())
    )
    assert load_client_state(d, 16).state["c"]["n"] == 16
    empty = load_client_state(d, 7)  # nothing saved by round 7: the node starts empty
    assert (len(empty.state), empty.round, empty.sha256) == (0, 0, "")


def test_a_client_that_cannot_save_its_state_stops_the_run_before_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*args: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr("fedsim.client.state.save_client_state", disk_full)
    raw = small_config(tmp_path, output={"run_dir": str(tmp_path / "r"), "checkpoint_every": 2})
    # every client of the round failed alike: named together in the one line
    failed = r"round 2: clients could not save their state: clients 0, 1, 2, 3: OSError: No space"
    with pytest.raises(FedsimError, match=failed):
        run(parse_config(raw))
    assert not (tmp_path / "r" / CHECKPOINT).exists()  # never a checkpoint without its clients' state


@pytest.mark.parametrize("where", ["loss", "weights"])
def test_nan_stops_the_run_naming_round_and_client_and_keeps_the_checkpoint(tmp_path: Path, where: str) -> None:
    strategy = {"name": "tests.plugins.diverging:Diverging", "round": 7, "client": 2, "where": where}
    raw = small_config(tmp_path, strategy=strategy, train={"rounds": 10}, output={"checkpoint_every": 3})
    raw["output"]["run_dir"] = str(tmp_path / "diverged")
    with pytest.raises(TrainingError) as err:
        run(parse_config(raw))
    message = str(err.value)
    assert "round 7" in message and "client 2" in message
    assert ("training loss is inf" if where == "loss" else "non-finite weights in classifier.weight") in message
    run_dir = tmp_path / "diverged"
    assert re.search(fault_line("checkpoint kept", round=6, run_dir=re.escape(str(run_dir))), message), message
    checkpoint = Checkpoint.load(run_dir)
    assert checkpoint.round == 6
    assert all(np.isfinite(a.numpy()).all() for a in checkpoint.arrays.values())
    assert [m["round"] for m in metrics(run_dir)] == [2, 4, 6]
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize(("round_", "so_far"), [(1, "nothing kept"), (3, "metrics kept")])
def test_nan_stop_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], round_: int, so_far: str
) -> None:
    """The message says where the run stands as it is on disk: in round 1 (evaluated every 2) no metrics yet. One
    line, as every error is (what is kept on disk was a second line)."""
    strategy = {"name": "tests.plugins.diverging:Diverging", "round": round_, "client": 0}
    raw = small_config(tmp_path, strategy=strategy, output={"run_dir": str(tmp_path / "d")})
    assert main(["run", str(write_config(tmp_path, raw))]) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    kept = fault_line("no checkpoint kept", kept=fault_line(so_far, run_dir=re.escape(str(tmp_path / "d"))))
    assert_said("diverged", err[:-1], round=round_, cause=fault_line("training loss", client=0, loss="inf"), kept=kept)
    assert (tmp_path / "d").exists() == (tmp_path / "d" / "metrics.jsonl").exists() == (round_ == 3)


def test_a_global_model_that_evaluates_to_nan_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Weight decay of 1e30 and one local step: every weight finite (about 5e28) and the training loss too
    (taken before the step), but the global model's forward pass overflows. That is a diverged run, not a
    finished one: one line, exit 2, no metrics line and no summary."""
    run_dir = tmp_path / "r"
    overrides = ["train.rounds=1", "train.local_steps=1", "train.weight_decay=1e30", "output.progress=false",
                 "simulation.backend=inline", "simulation.threads=1", f"output.run_dir={run_dir}"]  # fmt: skip
    assert main(["run", str(REPO / "configs" / "quickstart.yaml"), "--set", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err  # one line, no traceback
    cause = fault_line("evaluation", where=r"clients 0, 1, 2, 3, 4 \(and 5 more\) and on the whole test set",
                       largest=r"[0-9.e+]+")  # fmt: skip
    kept = fault_line("no checkpoint kept", kept=fault_line("nothing kept", run_dir=re.escape(str(run_dir))))
    assert_said("diverged", err[:-1], round=1, cause=cause, kept=kept)
    assert metrics(run_dir) == [] and not (run_dir / "summary.json").exists() and not (run_dir / "model.pt").exists()


@pytest.mark.slow
def test_a_server_step_that_overflows_stops_the_run_in_one_line(tmp_path: Path) -> None:
    """FedYogi with η = 1e30: its step overflows (Δ², η·m/√v) and the next round's losses are NaN. numpy's
    RuntimeWarnings about the overflow printed six lines before fedsim's one. A real process: pytest keeps
    warnings off stderr."""
    raw = small_config(tmp_path, strategy={"name": "fedyogi", "eta": 1e30}, output={"run_dir": str(tmp_path / "d")})
    res = subprocess.run([sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, raw))], cwd=REPO,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert_said("diverged", res.stderr[:-1], round=2, cause=fault_line("training loss", client=0, loss=".+"), kept=".+")


def test_resume_refuses_what_it_cannot_continue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def error(*argv: str) -> str:
        assert main(["run", *argv]) == 2
        return capsys.readouterr().err

    # each one line names the directory, file or option; its wording: tests/test_bad_inputs.py
    assert f"{tmp_path}: " in (err := error("--resume", str(tmp_path))) and "config.yaml" in err
    assert "--resume RUN_DIR" in error()

    raw = small_config(tmp_path, output={"run_dir": str(tmp_path / "done"), "checkpoint_every": 2})
    path = write_config(tmp_path, raw)
    assert main(["run", str(path)]) == 0
    done = tmp_path / "done"
    assert "--resume RUN_DIR" in (err := error(str(path), "--resume", str(done))) and "--set" in err
    assert f"{done}: " in (err := error("--resume", str(done))) and "summary.json" in err

    (done / "summary.json").unlink()  # as if killed after its last checkpoint
    config = done / "config.yaml"
    original = config.read_text()
    config.write_text(original.replace("lr: 0.05", "lr: 0.1"))
    assert "train.lr: 0.05 -> 0.1" in error("--resume", str(done))  # the field, and its two values
    config.write_text(original)
    saved = (done / CHECKPOINT).read_bytes()
    (done / CHECKPOINT).write_bytes(saved[: len(saved) // 2])
    assert "checkpoint.pt" in error("--resume", str(done))
    # 256 bytes flipped in the middle: inside a tensor's data, which torch.load reads without complaint
    middle = len(saved) // 2
    (done / CHECKPOINT).write_bytes(saved[:middle] + bytes(b ^ 0xFF for b in saved[middle : middle + 256])
                                    + saved[middle + 256 :])  # fmt: skip
    changed = error("--resume", str(done))
    assert "checkpoint.pt" in changed and "sha256" in changed
    unversioned = torch.load(io.BytesIO(saved), weights_only=True)
    del unversioned["record_version"]  # as an older fedsim wrote it, or anything else
    torch.save(unversioned, done / CHECKPOINT)
    older = error("--resume", str(done))
    assert older.startswith("fedsim: error: ") and "checkpoint.pt" in older and f"({RECORD_VERSION})" in older
    assert f"`fedsim record upgrade {done}`" in older  # the command to run
    (done / CHECKPOINT).write_bytes(saved)
    before = metrics(done)
    assert main(["run", "--resume", str(done)]) == 0  # its checkpoint is the last round: it only finishes
    assert metrics(done) == before and json.loads((done / "summary.json").read_text())["resumed_from_round"] == 4

    (done / "summary.json").unlink()
    (done / CHECKPOINT).unlink()
    message = error("--resume", str(done))
    assert "checkpoint.pt" in message and "output.checkpoint_every" in message
