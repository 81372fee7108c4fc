"""The ``register`` and ``submit`` services' program (:mod:`fedsim.deploy.submit`) against a stand-in
``flwr`` CLI on PATH: what it shows while the SuperLink is away, when it gives up, its exit status
for a failed run, a second registration, rounds and summary in its log, and SIGTERM as PID 1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, written

# A stand-in for the flwr CLI: answers from $FAKE_FLWR (a JSON file: command -> reply) and logs each call
FAKE_FLWR = """\
#!{python}
import json, os, sys, time
args = [a for a in sys.argv[1:] if a not in ("--format", "json")]
with open(os.environ["FAKE_FLWR_CALLS"], "a") as f:
    f.write(" ".join(args) + "\\n")
replies = json.load(open(os.environ["FAKE_FLWR"]))
key = " ".join(args[:2]) if args[0] == "supernode" else args[0]
reply = replies.get(key + " " + args[2], replies.get(key)) if args[0] == "supernode" else replies.get(key)
if isinstance(reply, str):  # plain output (flwr log --stream)
    print(reply)
    sys.exit(0)
print(json.dumps(reply))
sys.exit(0 if reply.get("success", True) else 1)
"""

REFUSED = {"success": False, "error-message": "Connection refused: the SuperLink at superlink:9093 is unreachable"}


def fake_flwr(tmp_path: Path, replies: dict) -> dict[str, str]:
    """An environment whose PATH starts with the stand-in ``flwr``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "flwr").write_text(FAKE_FLWR.format(python=sys.executable))
    (bin_dir / "flwr").chmod(0o755)
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    return {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_FLWR": str(tmp_path / "replies.json"),
        "FAKE_FLWR_CALLS": str(tmp_path / "calls.txt"), "PYTHONPATH": str(REPO),
    }  # fmt: skip


def submit(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fedsim.deploy.submit", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().splitlines()


def run_args(tmp_path: Path, rounds: int = 2) -> list[str]:
    return ["run", "--app", "/fedsim/app", "--run-config", "/fedsim/run-config.toml",
            "--run-dir", str(tmp_path / "run"), "--rounds", str(rounds)]  # fmt: skip


@pytest.mark.slow
def test_an_unreachable_superlink_is_shown_and_given_up_on(tmp_path: Path) -> None:
    env = fake_flwr(tmp_path, {"ls": REFUSED})
    t0 = time.monotonic()
    res = submit(env, "--timeout", "3", *run_args(tmp_path))
    assert res.returncode == 2
    assert time.monotonic() - t0 < 60
    # said once while waiting, and again when giving up: never silent
    assert res.stdout.count("waiting for the SuperLink: Connection refused") == 1, res.stdout
    assert "fedsim submit: error: the SuperLink did not answer within 3 s: Connection refused" in res.stdout
    assert all(c.startswith("ls fedsim") for c in calls(tmp_path))  # nothing submitted


def write_run(run_dir: Path, rounds: int) -> None:
    """What the ServerApp leaves in its run directory after ``rounds`` rounds, evaluated every round."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"round": r, "train_loss": 1.0 / r, "client_mean_acc": 0.4 + r / 100, "global_acc": 0.45 + r / 100,
              "time_s": 3.0 * r} for r in range(1, rounds + 1)]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "progress.json").write_text(written(round=rounds, loss=1.0 / rounds, acc=0.42))
    (run_dir / "summary.json").write_text(written(name="quickstart", rounds=rounds, final_client_mean_acc=0.42,
                                                  best_client_mean_acc=0.42, final_global_acc=0.466,
                                                  per_class_acc=[0.1], summary_sha256="0" * 64))  # fmt: skip


@pytest.mark.parametrize(("status", "code"), [("finished:completed", 0), ("finished:failed", 1),
                                               ("finished:stopped", 1)])  # fmt: skip
@pytest.mark.slow
def test_exit_status_is_the_runs_outcome(tmp_path: Path, status: str, code: int) -> None:
    write_run(tmp_path / "run", 2)  # as if the ServerApp wrote it while the log streamed
    env = fake_flwr(tmp_path, {
        "ls": {"success": True, "runs": [{"run-id": "7", "status": status}]},
        "run": {"success": True, "run-id": "7"},
        "log": "ERROR : DataError: no file at /data/missing.npz" if code else "INFO : round 2",
    })  # fmt: skip
    (tmp_path / "run" / "summary.json").unlink()  # a stale summary is removed first; none is written here
    res = submit(env, *run_args(tmp_path))
    assert res.returncode == code, res.stdout + res.stderr
    assert f"run 7: {status}" in res.stdout
    assert "run 7 submitted" in res.stdout
    assert "log 7 fedsim --stream" in calls(tmp_path)


@pytest.mark.slow
def test_rounds_and_summary_appear_in_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.deploy import submit as program

    run_dir = tmp_path / "run"
    write_run(run_dir, 1)  # the last run's files: not this run's progress

    def flwr(args: list[str], timeout: float = 120) -> dict:
        return {"run-id": "3"} if args[0] == "run" else {"runs": [{"status": "finished:completed"}]}

    def stream_log(run_id: int) -> None:  # the ServerApp writes its run directory while its log streams
        time.sleep(0.2)
        write_run(run_dir, 2)
        time.sleep(1.5)

    monkeypatch.setattr(program, "flwr", flwr)
    monkeypatch.setattr(program, "stream_log", stream_log)
    lines: list[str] = []
    assert program.submit("/fedsim/app", "/fedsim/run-config.toml", run_dir, 2, lines.append) == 0
    assert "round 2/2: train loss 0.5000, client-mean acc 0.4200, global acc 0.4700, 6.0 s" in lines
    assert not any(line.startswith("round 1/2") for line in lines)  # the stale progress.json was removed
    assert lines[-2] == (
        "summary: name quickstart, rounds 2, final_client_mean_acc 0.4200, best_client_mean_acc 0.4200, "
        "final_global_acc 0.4660"
    )
    assert lines[-1] == "run 3: finished:completed"


def test_resume_submits_the_run_config_with_fedsim_resume_and_leaves_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``docker compose run --rm submit --resume``: the project's run config as it is, but fedsim-resume = true."""
    import tomllib

    from fedsim.deploy import submit as program

    (tmp_path / "run-config.toml").write_text('fedsim-config = "{\\"name\\": \\"q\\"}"\nfedsim-resume = false\n')
    run_dir = tmp_path / "run"
    write_run(run_dir, 1)  # what the killed run left: a summary too is left to the ServerApp to refuse
    submitted: list[dict] = []

    def flwr(args: list[str], timeout: float = 120) -> dict:
        if args[0] == "run":
            submitted.append(tomllib.loads(Path(args[args.index("--run-config") + 1]).read_text()))
            return {"run-id": "5"}
        return {"runs": [{"status": "finished:completed"}]}

    monkeypatch.setattr(program, "flwr", flwr)
    monkeypatch.setattr(program, "stream_log", lambda run_id: None)
    assert program.main(["--timeout", "5", "run", "--app", "/fedsim/app", "--run-config",
                         str(tmp_path / "run-config.toml"), "--run-dir", str(run_dir), "--resume"]) == 0  # fmt: skip
    assert submitted == [{"fedsim-config": '{"name": "q"}', "fedsim-resume": True}]
    assert "fedsim-resume = false" in (tmp_path / "run-config.toml").read_text()  # the project's file unchanged
    assert (run_dir / "summary.json").is_file() and (run_dir / "metrics.jsonl").is_file()
    assert not (run_dir / "progress.json").exists()  # the killed run's last round is not shown as this one's


@pytest.mark.slow
def test_registering_again_is_not_an_error(tmp_path: Path) -> None:
    env = fake_flwr(tmp_path, {
        "ls": {"success": True, "runs": []},
        "supernode register /keys/supernode-0.pub": {"success": False, "error-message": "Public key already in use"},
        "supernode register /keys/supernode-1.pub": {"success": True},
    })  # fmt: skip
    res = submit(env, "register", "/keys/supernode-0.pub", "/keys/supernode-1.pub")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "registered before: /keys/supernode-0.pub" in res.stdout
    assert "registered /keys/supernode-1.pub" in res.stdout


@pytest.mark.slow
def test_a_refused_registration_fails(tmp_path: Path) -> None:
    env = fake_flwr(tmp_path, {
        "ls": {"success": True, "runs": []},
        "supernode register /keys/supernode-0.pub": {"success": False, "error-message": "Invalid public key"},
    })  # fmt: skip
    res = submit(env, "register", "/keys/supernode-0.pub")
    assert res.returncode == 2 and "fedsim submit: error: Invalid public key" in res.stdout


@pytest.mark.slow
def test_sigterm_stops_it_at_once_as_pid_1(tmp_path: Path) -> None:
    """In a PID namespace of its own, as in a container: PID 1 ignores a signal it has no handler for."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    env = fake_flwr(tmp_path, {"ls": REFUSED})
    cmd = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "fedsim.deploy.submit",
           "--timeout", "600", *run_args(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "calls.txt").exists():  # waiting for the SuperLink
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    child = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0])
    (nspid,) = [line for line in Path(f"/proc/{child}/status").read_text().splitlines() if line.startswith("NSpid:")]
    assert nspid.split()[-1] == "1"  # PID 1 in its namespace
    os.kill(child, signal.SIGTERM)
    # ignored, the signal would leave it waiting for the SuperLink for its --timeout of 600 s
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out


def test_the_program_is_what_the_services_run() -> None:
    """``python -m fedsim.deploy.submit`` is each service's first process (no ``sh -c`` in front of it)."""
    text = textwrap.dedent((REPO / "docker" / "quickstart" / "compose.yaml").read_text())
    assert "sh -c" not in text and "- sh" not in text
