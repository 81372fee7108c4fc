"""The ``register`` and ``submit`` services of ``fedsim compose``: the flwr CLI against the project's
SuperLink, as the first process of their containers.

    python -m fedsim.deploy.submit register --timeout 120 /keys/supernode-0.pub ...
    python -m fedsim.deploy.submit run --timeout 120 --app /fedsim/app --run-config /fedsim/run-config.toml \
        --run-dir /fedsim/runs/quickstart [--resume]

Both first wait, at most ``--timeout`` seconds, until the SuperLink answers, printing why it does not
(each new reason once). ``register`` adds the SuperNodes' public keys; a key registered before counts
as registered, so it can run again. ``run`` submits the run, streams the ServerApp's log, prints one
line per round from the run directory (when the SuperLink's ``runs/`` is mounted, as in the generated
project) and the summary, and exits 0 only for a run that finished completed. ``run --resume`` submits
the run config with ``fedsim-resume = true``: the ServerApp goes on from the checkpoint in the run
directory, as under ``fedsim deploy --resume`` (``docker compose run --rm submit --resume``: the
service's entrypoint is this command, so the flag lands after its arguments).

Exit status: 0 done, 1 the run failed or was stopped, 2 the SuperLink never answered or refused a
request, 143 on SIGTERM (as PID 1 a process ignores a SIGTERM it has no handler for).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

from fedsim import wire
from fedsim.deploy.topology import CONNECTION
from fedsim.errors import FedsimError
from fedsim.files import remove
from fedsim.record.layout import PROGRESS, SUMMARY
from fedsim.record.manifest import CHECKS
from fedsim.record.reader import read_metrics, read_progress, read_summary

POLL_S = 2.0
ATTEMPT_S = 30.0  # one flwr CLI call: a Python start and a request, seconds on a busy machine
COMPLETED = "finished:completed"


class SubmitError(Exception):
    """The SuperLink did not answer, or refused what was asked."""


def flwr(args: list[str], timeout: float = 120) -> dict[str, Any]:
    """One flwr CLI command with JSON output, parsed; its error message as a SubmitError."""
    try:
        res = subprocess.run(["flwr", *args, "--format", "json"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"flwr {' '.join(args[:2])}: no answer within {timeout:.0f} s") from None
    try:
        out = json.loads(res.stdout[res.stdout.index("{") :])
    except ValueError:
        out = {"success": False, "error-message": (res.stdout + res.stderr).strip()[-2000:] or f"exit {res.returncode}"}
    if res.returncode != 0 or not out.get("success", True):
        raise SubmitError(str(out.get("error-message", out)).strip())
    return out


def wait_for_superlink(timeout: float, say: Callable[[str], None] = print) -> None:
    deadline, last = time.monotonic() + timeout, ""
    while True:
        try:
            flwr(["ls", CONNECTION], timeout=ATTEMPT_S)
            say("the SuperLink answers")
            return
        except SubmitError as err:
            if str(err) != last:
                say(f"waiting for the SuperLink: {err}")
                last = str(err)
            if time.monotonic() > deadline:
                raise SubmitError(f"the SuperLink did not answer within {timeout:.0f} s: {err}") from None
        time.sleep(POLL_S)


def register(keys: list[str], say: Callable[[str], None] = print) -> None:
    for key in keys:
        try:
            flwr(["supernode", "register", key, CONNECTION])
            say(f"registered {key}")
        except SubmitError as err:
            if "already in use" not in str(err):
                raise
            say(f"registered before: {key}")


def run_status(run_id: int) -> str:
    runs = flwr(["ls", CONNECTION, "--run-id", str(run_id)]).get("runs", [])
    return str(runs[0].get("status", "")) if runs else ""


def stream_log(run_id: int) -> None:
    """The ServerApp's log, passed through until the run ends (or the connection does)."""
    subprocess.run(["flwr", "log", str(run_id), CONNECTION, "--stream"], stdin=subprocess.DEVNULL)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"  # None: not measured (a round without evaluation)


def round_line(progress: dict[str, Any], total: int | None, metrics: dict[str, Any] | None) -> str:
    """``round 2/10: train loss 1.2345, client-mean acc 0.4660, global acc 0.4660, 3.1 s``."""
    parts = [f"train loss {_number(progress['loss'])}"]
    if metrics is not None:
        parts += [f"client-mean acc {_number(metrics.get('client_mean_acc'))}",
                  f"global acc {_number(metrics.get('global_acc'))}"]  # fmt: skip
        parts += [f"{metrics['time_s']:.1f} s"] if isinstance(metrics.get("time_s"), float) else []
    return f"round {progress['round']}{f'/{total}' if total else ''}: " + ", ".join(parts)


class RoundPrinter:
    """Prints each round the ServerApp reports in the run directory (progress.json, metrics.jsonl)."""

    def __init__(self, run_dir: Path, total: int | None, say: Callable[[str], None] = print) -> None:
        self.run_dir, self.total, self.say = run_dir, total, say
        self.shown = 0
        self.stop = threading.Event()

    def poll(self) -> None:
        """Say the latest round, once. What is not there yet or not readable (a FIFO, a foreign file) waits
        for the next poll: it never stops the thread that polls (fedsim.reading reads without blocking)."""
        try:
            progress = read_progress(self.run_dir)
        except FedsimError:
            return
        if progress["round"] <= self.shown:
            return
        try:
            evaluated = {record["round"]: record for record in read_metrics(self.run_dir)}
        except FedsimError:  # a line being appended: the round shows without its scores
            evaluated = {}
        self.shown = progress["round"]
        self.say(round_line(progress, self.total, evaluated.get(self.shown)))

    def follow(self) -> None:
        while not self.stop.wait(0.5):
            self.poll()

    def summary(self) -> None:
        self.poll()
        if not (self.run_dir / SUMMARY).exists():  # a run that failed writes none
            return
        try:
            summary = read_summary(self.run_dir)
        except FedsimError as err:
            self.say(f"summary: {err}")
            return
        shown = [
            (k, v) for k, v in summary.items() if k not in CHECKS and not isinstance(v, (list, dict)) and v is not None
        ]
        self.say("summary: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown))


def resuming(run_config: str, directory: Path) -> str:
    """A copy of the ``run_config`` file in ``directory`` that asks the ServerApp to resume (the flwr CLI takes
    one TOML file or key=value pairs, never both)."""
    config = tomllib.loads(Path(run_config).read_text())
    config[wire.RESUME] = True
    path = directory / "run-config.toml"
    path.write_text(tomli_w.dumps(config))
    return str(path)


def submit(
    app: str, run_config: str, run_dir: Path | None, rounds: int | None, say: Callable[[str], None],
    resume: bool = False,
) -> int:  # fmt: skip
    """Submit the run (``resume``: from its checkpoint), show it until it ends; 0 if it finished completed,
    else 1."""
    # this run's, not the last one's; a summary stays on resume: the ServerApp refuses to resume a finished run
    for stale in (PROGRESS,) if resume else (SUMMARY, PROGRESS):
        if run_dir is not None:
            remove(run_dir / stale)
    with tempfile.TemporaryDirectory(prefix="fedsim-submit-") as tmp:
        given = resuming(run_config, Path(tmp)) if resume else run_config
        run_id = int(flwr(["run", app, CONNECTION, "--run-config", given])["run-id"])
    say(f"run {run_id} {'resumed from its checkpoint' if resume else 'submitted'}; the ServerApp's log follows")
    printer = RoundPrinter(run_dir, rounds, say) if run_dir is not None else None
    if printer is not None:
        threading.Thread(target=printer.follow, daemon=True).start()
    stream_log(run_id)
    status = run_status(run_id)
    while not status.startswith("finished"):  # the stream may end before the status does
        time.sleep(POLL_S)
        status = run_status(run_id)
    if printer is not None:
        printer.stop.set()
        printer.summary()
    say(f"run {run_id}: {status}")
    return 0 if status == COMPLETED else 1


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsim.deploy.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="how long to wait for the SuperLink (s)")
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("register", help="register SuperNode public keys")
    reg.add_argument("keys", nargs="+")
    run = sub.add_parser("run", help="submit the run and follow it")
    run.add_argument("--app", required=True)
    run.add_argument("--run-config", required=True)
    run.add_argument("--run-dir", type=Path, default=None, help="the run directory, if mounted here")
    run.add_argument("--rounds", type=int, default=None)
    run.add_argument("--resume", action="store_true", help="go on from the checkpoint in the run directory")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        wait_for_superlink(args.timeout, say)
        if args.command == "register":
            register(args.keys, say)
            return 0
        return submit(args.app, args.run_config, args.run_dir, args.rounds, say, args.resume)
    except SubmitError as err:
        say(f"fedsim submit: error: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
