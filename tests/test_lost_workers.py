"""A Ray worker lost mid-round is a client failure, under the Ray pool and Flower's runtime alike: its
process ended (SIGKILL from inside or outside, as the OOM killer sends) or it sent nothing within
``train.round_timeout_s``. Under ``fail`` the run stops in one line naming the round, the clients and the
cause, keeps its last checkpoint, and ``--resume`` finishes it to the uninterrupted run's numbers; under
``skip`` the round goes on without those clients, a fresh worker serves them from then on, and the run says
so. The worker ends where tests/plugins/dying_worker.py is told to, by an environment variable that Ray's
workers inherit, so the same config, resumed without it, is the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.reader import read_workers
from tests.conftest import REPO, small_config, write_config
from tests.fault_lines import assert_said, fault_line, said_lines
from tests.plugins.dying_worker import WORKER_END

WALL_CLOCK = ("time_s", "rss_mb")  # facts about the machine, not results
POOL = {"simulation": {"backend": "ray", "client_resources": {"num_cpus": 1}}}
FLOWER = {"engine": "flower", "simulation": {"client_resources": {"num_cpus": 1}}}
ENGINES = pytest.mark.parametrize("engine", [POOL, FLOWER], ids=["ray-pool", "flower"])


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines]


def lost_config(tmp_path: Path, engine: dict[str, Any], strategy: str, **train: Any) -> dict[str, Any]:
    """4 clients, 6 rounds, every round evaluated, on ``engine``; ``strategy`` is DyingFedAvg or DyingScaffold."""
    return small_config(
        tmp_path,
        strategy={"name": f"tests.plugins.dying_worker:{strategy}"},
        train={"rounds": 6, **train},
        eval={"every": 1},
        output={"run_dir": str(tmp_path / "run"), "checkpoint_every": 2},
        **engine,
    )


def fedsim(*args: str, worker_end: str | None = None) -> subprocess.Popen[str]:
    """``fedsim ARGS`` in a process of its own (its stderr is what a user sees), its workers told to end as
    ``worker_end`` says (tests/plugins/dying_worker.py)."""
    env = {k: v for k, v in os.environ.items() if k != WORKER_END}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))  # Ray's workers import the test plugin
    if worker_end is not None:
        env[WORKER_END] = worker_end
    cmd = [sys.executable, "-m", "fedsim.app.cli", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()  # its Ray processes end with it (fedsim.engines.ray_cluster)
        raise AssertionError(f"still running after 900 s: {proc.communicate()[1][-3000:]}") from None
    return proc.returncode, err


def killed_from_outside(tmp_path: Path, config: Path, at: str) -> tuple[int, str]:
    """``fedsim run config``, the worker running round:partition ``at`` SIGKILLed from outside as it begins it."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = fedsim("run", str(config), worker_end=f"{at}:hang:{pids}")
    pid_file = pids / f"{at.split(':')[1]}.pid"
    deadline = time.monotonic() + 600
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    return finished(proc)


def uninterrupted(tmp_path: Path, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's metrics with no worker lost, inline (every engine gives its numbers bit for bit)."""
    inline = {**raw, "engine": "local", "simulation": small_config(tmp_path)["simulation"]}
    inline["output"] = {**raw["output"], "run_dir": str(tmp_path / "whole"), "checkpoint_every": 0}
    return metrics(Path(run(parse_config(inline))["run_dir"]))


def stopped_in_round_3(err: str, run_dir: Path, clients: str, node: str) -> None:
    """``err`` is one line, that of a run stopped in round 3 by a lost worker of ``clients`` on ``node`` (regexes),
    and ``run_dir`` keeps the checkpoint of round 2 and no summary."""
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]  # one line, no traceback, nothing of Ray's or Flower's on stderr
    kept = fault_line("checkpoint kept", round=2, run_dir=".*")
    assert_said("worker died, run stopped", lines[0], round=3, clients=clients, node=node, error=r"Actor\w*Error",
                kept=kept)  # fmt: skip
    assert Checkpoint.load(run_dir).round == 2 and not (run_dir / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.long
@ENGINES
def test_fail_stops_in_one_line_keeps_the_checkpoint_and_resume_finishes_the_run(
    tmp_path: Path, engine: dict[str, Any]
) -> None:
    # SCAFFOLD: every client's c_i lives in its worker (the pool) or in Flower's node state, and the resume
    # must restore it from the checkpoint of round 2 to reach the uninterrupted run's numbers
    raw = lost_config(tmp_path, engine, "DyingScaffold")
    code, err = finished(fedsim("run", str(write_config(tmp_path, raw)), worker_end="3:1:exit"))
    assert code == 2, err[-3000:]
    run_dir = tmp_path / "run"
    stopped_in_round_3(err, run_dir, r"clients? [0-9, ]*\b1\b[0-9, ]*", r"(on node \S+ \(id \w+\) )?")

    code, err = finished(fedsim("run", "--resume", str(run_dir)))
    assert code == 0, err[-3000:]
    assert metrics(run_dir) == uninterrupted(tmp_path, raw)


@pytest.mark.slow
@pytest.mark.long
@ENGINES
def test_skip_goes_on_without_the_clients_of_a_killed_worker_and_a_new_worker_serves_them(
    tmp_path: Path, engine: dict[str, Any]
) -> None:
    raw = lost_config(tmp_path, engine, "DyingFedAvg", on_client_failure="skip")
    code, err = killed_from_outside(tmp_path, write_config(tmp_path, raw), at="3:1")
    assert code == 0, err[-3000:]
    lines = metrics(tmp_path / "run")
    assert [m["round"] for m in lines] == [1, 2, 3, 4, 5, 6]
    lost = lines[2]["failed_clients"]["3"]
    assert 1 in lost and len(lost) < 4  # the killed worker's clients, no others
    failed = {m["round"]: m["failed_clients"][str(m["round"])] for m in lines if "failed_clients" in m}
    # the pool replaces the worker before its next batch; Flower's pool gives the dead worker messages while Ray
    # replaces its process, which fail too (docs/checkpoints.md): on a loaded machine, into the next rounds
    after = [r for r in failed if r > 3]
    assert after == [] if engine is POOL else after == list(range(4, 4 + len(after))), failed
    assert 6 not in failed and all(acc is not None for acc in lines[-1]["client_acc"])  # a new worker serves them
    said = said_lines(err)
    skipped = "; ".join(f"round {r}: {', '.join(map(str, clients))}" for r, clients in failed.items())
    assert_said("rounds skipped", said[-1], rounds=skipped)
    if engine is POOL:  # its worker kept its clients' state, which a new worker starts without
        (replaced,) = said[:-1]
        assert_said("worker died, replaced", replaced, clients="[0-9, ]+", node=r"on node \S+ \(id \w+\) ",
                    error="ActorDiedError")  # fmt: skip
    else:  # Flower's workers keep no client state: the node's Context lives in the driver
        assert len(said) == 1
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.long
def test_a_pool_worker_silent_past_the_round_timeout_is_a_missing_reply_and_is_replaced(tmp_path: Path) -> None:
    raw = lost_config(tmp_path, POOL, "DyingFedAvg", on_client_failure="skip", round_timeout_s=30, rounds=4)
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.monotonic()
    code, err = finished(fedsim("run", str(write_config(tmp_path, raw)), worker_end=f"2:1:hang:{pids}"))
    assert code == 0, err[-3000:]
    assert time.monotonic() - started < 600  # the worker sleeps an hour: the wait was bounded
    lines = metrics(tmp_path / "run")
    assert 1 in lines[1]["failed_clients"]["2"] and all(a is not None for a in lines[2]["client_acc"])
    (replaced,) = [line for line in said_lines(err) if "sent no reply" in line]
    assert_said("worker silent, replaced", replaced, clients="[0-9, ]+", timeout=30)
    hung = int((pids / "1.pid").read_text())
    first, new = [w for w in read_workers(tmp_path / "run") if 1 in w["clients"]]
    assert (first["pid"], first["replaces"]) == (hung, None)
    assert_said("worker silent", new["replaces"], timeout=30)
    assert new["actor"] == first["actor"] and new["pid"] != hung
    deadline = time.monotonic() + 60
    while _alive(hung) and time.monotonic() < deadline:  # stopped, not left to sleep out its hour
        time.sleep(0.2)
    assert not _alive(hung)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def summary_written(proc: subprocess.Popen[str], run_dir: Path) -> None:
    """Wait until ``proc`` has written ``run_dir``'s summary.json (the run is recorded)."""
    deadline = time.monotonic() + 600
    while not (run_dir / "summary.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def ended_within(proc: subprocess.Popen[str], seconds: float, after: str) -> tuple[int, str]:
    """``proc``'s exit code and stderr; it fails the test if ``proc`` runs on ``seconds`` seconds ``after``."""
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"fedsim still running {seconds:g} s {after}: {proc.communicate()[1][-3000:]}") from None
    return proc.returncode, err


def hung_worker_run(tmp_path: Path, rounds: int, at: str) -> tuple[subprocess.Popen[str], Path]:
    """``fedsim run`` under Flower's runtime (skip, round_timeout_s 30), the worker of round:partition ``at``
    hanging for an hour as it begins it; the directory its pid is written to."""
    raw = lost_config(tmp_path, FLOWER, "DyingFedAvg", on_client_failure="skip", round_timeout_s=30, rounds=rounds)
    pids = tmp_path / "pids"
    pids.mkdir()
    return fedsim("run", str(write_config(tmp_path, raw)), worker_end=f"{at}:hang:{pids}"), pids


@pytest.mark.slow
@pytest.mark.long
def test_a_flower_worker_hung_in_the_last_round_does_not_keep_fedsim_run_alive(tmp_path: Path) -> None:
    proc, pids = hung_worker_run(tmp_path, rounds=3, at="3:1")
    summary_written(proc, tmp_path / "run")
    code, err = ended_within(proc, 60, "after summary.json was written (a hung Ray worker held it)")
    assert code == 0, err[-3000:]
    lines = metrics(tmp_path / "run")
    assert [m["round"] for m in lines] == [1, 2, 3] and 1 in lines[2]["failed_clients"]["3"]
    assert not _alive(int((pids / "1.pid").read_text()))  # stopped with its Ray, not left to sleep out its hour
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_ends_a_flower_run_whose_worker_hangs(tmp_path: Path) -> None:
    proc, pids = hung_worker_run(tmp_path, rounds=3, at="2:1")
    deadline = time.monotonic() + 600
    while not (pids / "1.pid").exists() or not (pids / "1.pid").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    code, err = ended_within(proc, 60, "after SIGTERM")
    assert code == 143, err[-3000:]
    assert err.splitlines()[-1].startswith("fedsim: "), err[-3000:]
    assert "Traceback" not in err
