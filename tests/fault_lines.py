"""The wording of every line fedsim says when a run meets a fault while it runs (a Ray worker or head lost, a driver
gone, a model that diverged, a signal, a plugin that exits or overruns, other data than the run's, a disk that fails)
or in the process's environment (a deleted working directory, a temp directory Ray cannot use, a library that does
not load, an address-space limit), in one table: rewording one of those messages edits its row here and nothing else.
Bad input's wording is the corpus of tests/test_bad_inputs.py.

Each row is a regular expression with ``{fields}``; a test that provokes the fault fills them in with expressions
of its own (``re.escape`` for paths) through :func:`fault_line` or :func:`assert_said`. The ``...kept`` rows are
the endings that say where the run stands on disk, shared by the lines that stop a run.
"""

from __future__ import annotations

import re

# phrases more than one line says
HEAD_UNANSWERED = r"the Ray cluster's head \(its GCS at {gcs}\) did not answer within {within} s \({why}\)"
DRIVER_SILENT = r"the run's driver \(Flower's runtime on a Ray cluster\) {how} and said nothing"
HEAD_ANSWERS = (
    r"the Ray cluster's head \(its GCS at {gcs}\) still answers; Ray's log of the driver \(python-core-driver-\*\.log "
    r"in the logs of its node's Ray session\) may say why"
)
RESUME = r"fedsim run --resume {run_dir} continues it"
WORKER_SILENT = r"their Ray worker sent no reply within train\.round_timeout_s = {timeout} s"
REPLACED = r"; a new one serves them, their client state \(Context\.state\) starting empty"
WITHOUT_RAY = r"or run the clients in this process \(engine: local, simulation\.backend: inline\)"
RAISE_LIMIT = r"raise it \(ulimit -v unlimited\) and run again"
AS_LIMIT = r"the address-space limit \(ulimit -v {kib} KiB\)"

LINES: dict[str, str] = {
    # where a stopped run stands on disk (fedsim/record/claim.py, fedsim/server/checkpoint.py, driver_watch.py)
    "nothing kept": r"nothing was recorded yet, and what the run wrote in {run_dir} is removed",
    "metrics kept": r"the metrics so far are in {run_dir}",
    "no metrics kept": r"no metrics were written yet \(the run directory is {run_dir}\)",
    "checkpoint kept": r"the last good checkpoint \(round {round}\) is in {run_dir}",
    "no checkpoint kept": r"no checkpoint was written \(output\.checkpoint_every: 0\); {kept}",
    # a signal: fedsim/app/cli.py
    "interrupted": r"fedsim: interrupted",
    "interrupted by SIGTERM": r"fedsim: interrupted by SIGTERM",
    "interrupted after a checkpoint": "{how}; {kept}; " + RESUME + " from its last checkpoint",
    # a diverged model: fedsim/server/replies.py
    "diverged": r"fedsim: error: training diverged in round {round}: {cause}; {kept}",
    "training loss": r"client {client}: training loss is {loss}",
    "weights": r"client {client}: non-finite weights in {name}",
    "evaluation": r"the global model's evaluation loss is not finite on {where} \(its largest weight is {largest}\); "
    r"lower train\.lr or train\.weight_decay",
    # a Ray worker lost: fedsim/engines/ray_pool.py, fedsim/server/loop.py
    "worker died, run stopped": r"fedsim: error: round {round}, training: {clients}: their Ray worker {node}died "
    r"during the round \({error}: .+\) \(train\.on_client_failure: skip goes on without them\); {kept}",
    "worker died, replaced": r"fedsim: warning: clients {clients}: their Ray worker {node}died during the round "
    r"\({error}: .+\)" + REPLACED,
    "worker silent, replaced": r"fedsim: warning: clients {clients}: " + WORKER_SILENT + REPLACED,
    "worker silent": WORKER_SILENT,  # a worker's record in workers.jsonl
    "worker unplaced": r"fedsim: warning: clients {clients}: no node of the Ray cluster took their Ray worker within "
    r"{within} s \(none has room for simulation\.client_resources: {resources}\); the pool's other workers serve "
    r"them from now on, their client state \(Context\.state\) starting empty",
    "rounds skipped": r"fedsim: warning: rounds that went on without clients that failed "
    r"\(train\.on_client_failure: skip; failed_clients in metrics\.jsonl\): {rounds}",
    # a Ray cluster's head or a driver lost: fedsim/engines/ray_cluster.py, fedsim/engines/driver_watch.py
    "head unanswered": HEAD_UNANSWERED,
    "head lost": r"fedsim: error: round {round}, training: " + HEAD_UNANSWERED + "; {kept}",
    "driver ended before joining": DRIVER_SILENT + ", before it had joined the Ray cluster",
    "driver ended, head answers": DRIVER_SILENT + ": " + HEAD_ANSWERS + "; {kept}",
    "driver silent, head lost": "fedsim: error: " + DRIVER_SILENT + ": " + HEAD_UNANSWERED + "; {kept}; " + RESUME,
    "driver killed, head answers": "fedsim: error: " + DRIVER_SILENT + ": " + HEAD_ANSWERS + "; {kept}; " + RESUME,
    "no checkpoint in": r"no checkpoint was written in {run_dir}",
    "no metrics": r"no metrics were written",
    # a deployment's processes: fedsim/deploy/
    "superlink exited": r"fedsim: error: the SuperLink exited.*",
    "serverapp ended": r"fedsim: error: .*its ServerApp process ended without a summary; the ServerApp's log: .+",
    # a plugin's code misbehaving: fedsim/plugin_guard.py, fedsim/server/contract.py
    "plugin exited": r"{who} called {call} at {file}:\d+: a plugin cannot end the run \(raise an exception to stop "
    r"it\)",
    "hook overran": r"{who} did not return within train\.round_timeout_s = {timeout} s \(raise it if the hook needs "
    r"longer\)",
    # what a run reads or writes while it runs: its data (fedsim/data/fingerprint.py), its disk (fedsim/files.py)
    "other data": r"fedsim: error: data\.root {data} holds other data than the run trained on \(data_sha256 "
    r"{now}\.\.\., {recorded_in} recorded {recorded}\.\.\.\): refused; give the run the data it began with",
    "a node's other data": r"fedsim: error: node {node} \(partition {partition}\): data\.root {data} holds other data "
    r"than the server's \(data_sha256 {theirs}\.\.\., the server's {ours}\.\.\.\): refused; give every node the data "
    r"the server reads \(a SuperNode trains on what its host holds there\)",
    "cannot write": r"fedsim: error: cannot write {path}: {why}; what was written before it is kept",
    # another writer of the filesystem: a link or a FIFO among the files fedsim writes (fedsim/files.py)
    "symbolic link among fedsim's files": r"{path} is a symbolic link \(to {target}\) in a directory of fedsim's, "
    r"which never writes or deletes through a link: remove the link \(what it points to is left as it is\)",
    "hard link among fedsim's files": r"{path} is one of {names} names of one file \(a hard link\) in a directory of "
    r"fedsim's, which would write into every name: remove this name, or put a copy of the file there",
    "not a file among fedsim's files": r"{path} is {kind} in a directory of fedsim's, where it writes only files and "
    r"directories: remove it",
    # the process's environment: fedsim/environment.py
    "working directory gone": r"fedsim: error: the working directory no longer exists \(deleted or moved after the "
    r"shell entered it\): cd into a directory that exists and run the command again",
    "ray temp dir": r"fedsim: error: Ray's temp directory {temp}/ray \(from {variable}={temp}\) {why} set RAY_TMPDIR "
    r"to a directory you can write, with a short path, " + WITHOUT_RAY,
    "ray temp dir unwritable": r"cannot be written: {why};",
    "ray temp dir too long": r"is too long a path for Ray's sockets \(at most {most} bytes\):",
    "libraries over the limit": r"fedsim: error: fedsim's libraries \(torch, Flower\) do not load under "
    + AS_LIMIT
    + r" \(.+\): "
    + RAISE_LIMIT,
    "ray over the limit": r"fedsim: error: Ray did not start here \(.+\) under " + AS_LIMIT + r", too low for Ray's "
    r"servers: " + RAISE_LIMIT + ", " + WITHOUT_RAY,
    "library broken on LD_LIBRARY_PATH": r"fedsim: error: cannot load {library}: {why}; LD_LIBRARY_PATH puts {dir} "
    r"first: take it out of LD_LIBRARY_PATH, or mend the library there",
    "library missing": r"fedsim: error: cannot load {library}: {why}; reinstall it \(pip install --force-reinstall "
    r"{dist}\)",
    "client failed, run stopped": r"fedsim: error: round {round}, training: client {client}: .+ "
    r"\(train\.on_client_failure: skip goes on without them\).*",
}


def fault_line(name: str, **fields: object) -> str:
    """Row ``name`` with ``fields`` (expressions; numbers as they print) in its ``{fields}``; a field the row has and
    ``fields`` lacks is a KeyError, so no row is matched looser than its test meant."""
    return LINES[name].format(**{k: str(v) for k, v in fields.items()})


def assert_said(name: str, said: str, **fields: object) -> None:
    """``said`` (one line, no newline) is row ``name`` with ``fields``."""
    expected = fault_line(name, **fields)
    assert re.fullmatch(expected, said), f"{said!r}\ndoes not match row {name!r}:\n{expected}"


def assert_said_among(name: str, err: str, **fields: object) -> None:
    """One of the lines fedsim said in ``err`` is row ``name`` with ``fields``."""
    expected = fault_line(name, **fields)
    said = said_lines(err)
    assert any(re.fullmatch(expected, line) for line in said), f"no line of\n{said}\nmatches row {name!r}:\n{expected}"


def said_lines(err: str) -> list[str]:
    """The lines of ``err`` that fedsim said (``fedsim: ...``), without what Ray, Flower or torch logged."""
    return [line for line in err.splitlines() if line.startswith("fedsim:")]
