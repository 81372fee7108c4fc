"""``fedsim run`` under Flower's runtime on a Ray cluster (``engine: flower`` with ``simulation.ray_address``)
runs its driver in a child process and speaks for it when it ends without a word.

A driver that shares a Ray node (the head's, on the head's machine) is ended by Ray's core worker, from C++,
within seconds of that node going away: exit status 1, nothing on stderr, no Python code of fedsim's run
(Ray's driver log says ``The connection to the plasma store is failed. Terminate the process.``). The local
engine's pool asks the head in its own waits and stops first (:mod:`fedsim.engines.ray_pool`); under
Flower's runtime the driver waits in Flower's code. So there the ``fedsim run`` process the user started
runs the same command again as its child, the driver (:func:`fedsim.processes.run_in_charge`: Ctrl-C and
SIGTERM passed on, dying with it), and when the driver ends with a status that is not one of fedsim's own
(:data:`SAID`; a signal such as the OOM killer's SIGKILL too) says in one line how it ended, whether the
cluster's head still answers (within ``RAY_HEAD_WAIT_S``) and where the run stands on disk. The driver notes
its run directory and the GCS it joined in the file ``FEDSIM_DRIVER_NOTE`` names, once it has joined.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from fedsim.config import RunConfig
from fedsim.errors import ChildExit, FedsimError
from fedsim.processes import run_in_charge

NOTE_ENV = "FEDSIM_DRIVER_NOTE"  # in the driver: the file where it notes its run directory and GCS
# the exit statuses of a fedsim run that has said why itself (fedsim.app.cli.main)
SAID = {0, 2, 128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGPIPE}


def wanted(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s driver runs watched: Flower's runtime on a Ray cluster, and this is not the driver."""
    return cfg.engine == "flower" and cfg.simulation.ray_address is not None and NOTE_ENV not in os.environ


def note_driver(run_dir: str, gcs: str) -> None:
    """In a watched driver: its run directory and the GCS (host:port) it joined, for its watcher."""
    if path := os.environ.get(NOTE_ENV):
        Path(path).write_text(json.dumps({"run_dir": run_dir, "gcs": gcs}))


def run_watched(argv: list[str]) -> int:
    """``fedsim ARGV`` (a ``fedsim run``) as a watched driver: its exit status if it said why it ended; else a
    :class:`FedsimError` saying how it ended and where the run stands."""
    with tempfile.TemporaryDirectory(prefix="fedsim-driver-") as tmp:
        note = Path(tmp, "note.json")
        env = {**os.environ, NOTE_ENV: str(note)}
        code = run_in_charge([sys.executable, "-m", "fedsim.app.cli", *argv], env=env)
        noted = json.loads(note.read_text()) if note.is_file() else None
    if code in SAID:
        if code:
            raise ChildExit(code)
        return 0
    raise FedsimError(describe_unsaid_end(code, noted))


def describe_unsaid_end(code: int, noted: dict[str, str] | None) -> str:
    """How a driver that said nothing ended (``code``: its return code), the head's answer and the run's state."""
    from fedsim.engines.ray_cluster import head_gone

    how = f"ended with exit status {code}" if code > 0 else f"was ended by {signal.Signals(-code).name}"
    ended = f"the run's driver (Flower's runtime on a Ray cluster) {how} and said nothing"
    if noted is None:
        return f"{ended}, before it had joined the Ray cluster"
    gone = head_gone(noted["gcs"])
    head = gone or (
        f"the Ray cluster's head (its GCS at {noted['gcs']}) still answers; Ray's log of the driver "
        "(python-core-driver-*.log in the logs of its node's Ray session) may say why"
    )
    return f"{ended}: {head}; {describe_run(Path(noted['run_dir']))}"


def describe_run(run_dir: Path) -> str:
    """Where a run stopped from outside stands on disk: its last checkpoint, its metrics, how to go on."""
    from fedsim.record.checkpoint import Checkpoint
    from fedsim.record.layout import METRICS

    metrics = f"the metrics so far are in {run_dir}" if (run_dir / METRICS).is_file() else "no metrics were written"
    try:
        last = Checkpoint.load(run_dir).round
    except FedsimError:  # none written, or none readable
        return f"no checkpoint was written in {run_dir}; {metrics}"
    resume = f"fedsim run --resume {run_dir} continues it"
    return f"the last good checkpoint (round {last}) is in {run_dir}; {metrics}; {resume}"
