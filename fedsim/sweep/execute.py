"""Running a sweep's plan (:mod:`fedsim.sweep.plan`): every unfinished cell, one after the other in this process,
as processes of their own (``parallel``), or as Ray tasks here or on a cluster (``ray:``).

A cell that fails while it runs (it diverges, its data cannot be read, a plugin raises, its process dies) is
isolated: it is logged as failed with its reason and recorded in ``<sweep dir>/failed.json`` (cell name ->
reason), the other cells run to the end, and the sweep then ends with :class:`CellsFailed` (exit status 1)
naming the failed cells.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedsim.config import THREADS_PER_CPU, RunConfig
from fedsim.environment import check_ray_temp_dir, check_working_directory
from fedsim.errors import ERROR_FILE_ENV, ConfigError, FedsimError, TrainingError
from fedsim.exclusive import claim_process
from fedsim.files import check_links, remove, write_file
from fedsim.layout import choose_layout, usable_cores
from fedsim.processes import die_with_parent, signals_ignored, sigterm_as_interrupt, stop_tree
from fedsim.reading import SUMMARY_BYTES, read_text
from fedsim.record.claim import claimed
from fedsim.record.paths import check_run_links
from fedsim.record.reader import read_summary
from fedsim.sweep.plan import (
    OUTPUT,
    RaySweep,
    SweepFile,
    check_against_data,
    plan,
    read_sweep,
    refuse_bad_cells,
    state_of,
)

FAILED = "failed.json"  # in the sweep directory: the cells that failed in the last sweep, and why


@contextmanager
def claimed_sweep(out: Path, cells: list[str]) -> Iterator[None]:
    """One ``fedsim sweep`` at a time in a sweep directory (its runs each own their own directory too). A cell
    that is a link, or a link in a cell, stops the sweep before any cell runs (:func:`fedsim.record.claim.claimed`)."""
    check_links(out, cells, deep=False)
    for cell in cells:
        check_run_links(out / cell)
    with claimed(out, resume=True, field=OUTPUT, owner="sweep", entries=[FAILED]):  # nothing cleared
        yield


def cell_layout(cfg: RunConfig, sweep: SweepFile, workers: int) -> RunConfig:
    """A cell's worker layout when the sweep runs several cells at once: inline on its share of the cores
    (``cpus_per_run`` on Ray), since a Ray pool per cell would put every cell on every core. One cell at a
    time chooses as ``fedsim run`` does (fedsim.layout)."""
    if sweep.ray is not None:
        return choose_layout(cfg, max(1, int(sweep.ray.cpus_per_run)), pool=False)
    if workers > 1:
        return choose_layout(cfg, max(1, usable_cores() // workers), pool=False)
    return cfg


def _run_one(cfg_json: str, resume: bool = False) -> dict[str, Any]:
    from fedsim.engines.runner import run
    from fedsim.record.checkpoint import resume_config

    cfg = RunConfig.from_json(cfg_json)
    return run(resume_config(cfg.output.run_dir or "") if resume else cfg, resume=resume)


class CellProcess:
    """One cell run as a ``fedsim run`` process of its own, which dies with the sweep."""

    def __init__(self, name: str, cfg: RunConfig, resume: bool, scratch: Path) -> None:
        self.name, self.run_dir = name, Path(cfg.output.run_dir or "")
        if resume:
            argv = ["run", "--resume", str(self.run_dir)]
        else:
            config = scratch / f"{name}.json"  # JSON is YAML: the cell's config, paths already absolute
            config.write_text(cfg.to_json())
            argv = ["run", str(config)]
        self.error_file, self.log = scratch / f"{name}.error.json", scratch / f"{name}.log"
        self.error_file.unlink(missing_ok=True)
        env = {**os.environ, ERROR_FILE_ENV: str(self.error_file)}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fedsim.app.cli", *argv], stdout=subprocess.DEVNULL, stderr=log, env=env,
                preexec_fn=die_with_parent(),
            )  # fmt: skip

    def outcome(self) -> tuple[dict[str, Any] | None, str | None]:
        """``(summary, None)`` on success, else ``(None, why it failed)``."""
        try:
            if self.proc.returncode == 0:
                return read_summary(self.run_dir), None
            if self.error_file.is_file():
                error = read_text(self.error_file, "a cell's error", SUMMARY_BYTES, FedsimError)
                return None, json.loads(error)["message"]
        except (FedsimError, ValueError, KeyError, TypeError) as err:  # a process that ended half-way through writing
            return None, f"exit status {self.proc.returncode}, and its result is unreadable: {err}"
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
        return None, f"exit status {self.proc.returncode}: " + " | ".join(tail)


Done = Callable[[str, dict[str, Any]], None]  # a cell finished: its name and summary
Failed = Callable[[str, str], None]  # a cell failed while it ran: its name and why


def _why(err: BaseException) -> str:
    """Why a cell failed: fedsim's own message, or the exception's type and message (a plugin's bug)."""
    return str(err) if isinstance(err, FedsimError) else f"{type(err).__name__}: {err}"


def _run_inline(todo: list[tuple[str, RunConfig, bool]], done: Done, failed: Failed) -> None:
    """One cell after the other, in this process."""
    for name, cfg, resume in todo:
        try:
            summary = _run_one(cfg.to_json(), resume)
        except Exception as err:  # noqa: BLE001 (a cell's crash, a plugin's bug among them, is that cell's alone)
            failed(name, _why(err))
        else:
            done(name, summary)


def _run_processes(
    todo: list[tuple[str, RunConfig, bool]], parallel: int, scratch: Path, done: Done, failed: Failed
) -> None:
    """At most ``parallel`` cells at once, each a process; on Ctrl-C or SIGTERM every running cell is
    stopped (a stopped cell resumes from its last checkpoint at the next ``fedsim sweep``)."""
    pending, running = list(todo), []
    try:
        while pending or running:
            while pending and len(running) < parallel:
                running.append(CellProcess(*pending.pop(0), scratch))
            time.sleep(0.2)
            for cell in [c for c in running if c.proc.poll() is not None]:
                running.remove(cell)
                summary, why = cell.outcome()
                if summary is not None:
                    done(cell.name, summary)
                else:
                    failed(cell.name, why or "")
    finally:
        with signals_ignored():
            stop_tree({c.proc.pid for c in running})
            for cell in running:
                cell.proc.wait()


def _run_on_ray(
    ray_cfg: RaySweep,
    todo: list[tuple[str, RunConfig, bool]],
    parallel: int,
    done: Done,
    failed: Failed,
) -> None:
    """At most ``parallel`` runs in flight (each holding ``cpus_per_run`` / ``gpus_per_run``: Ray
    starts a run when a node has them free), reported as they finish."""
    import ray

    from fedsim.engines.ray_cluster import start_ray
    from fedsim.engines.runner import OFFLINE_ENV, use_run_env

    use_run_env()  # for the raylet started here (its workers' niceness)
    if ray_cfg.address is None:
        check_ray_temp_dir()
    start_ray(ray_cfg.address, "ray.address", runtime_env={"env_vars": dict(OFFLINE_ENV)})
    task = ray.remote(num_cpus=ray_cfg.cpus_per_run, num_gpus=ray_cfg.gpus_per_run)(_run_one)
    names: dict[Any, str] = {}
    pending = list(todo)
    try:
        while pending or names:
            while pending and len(names) < parallel:
                name, cfg, resume = pending.pop(0)
                names[task.remote(cfg.to_json(), resume)] = name
            (ref,), _ = ray.wait(list(names), num_returns=1)
            name = names.pop(ref)
            try:
                summary = ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # what the run raised, as without Ray
                failed(name, _why(err.cause))
            except ray.exceptions.RayError as err:  # its worker died, or its node
                failed(name, _why(err))
            else:
                done(name, summary)
    finally:
        for ref in names:
            ray.cancel(ref, force=True)
        ray.shutdown()


class CellsFailed(TrainingError):
    """Some cells of a sweep failed while they ran, and the others ran to the end (``fedsim sweep``
    exits with status 1: the sweep itself was valid)."""


@claim_process("a sweep")
def run_sweep(
    path: str | Path,
    parallel: int | None = None,
    log: Callable[[str], Any] = print,
    overrides: Sequence[str] = (),
    output: str | Path | None = None,
) -> Path:
    """Run every unfinished cell of the sweep file ``path``; returns the sweep directory.

    Raises before any run if a cell is invalid, naming each bad cell. A cell that fails while it runs
    is logged and recorded in ``<sweep dir>/failed.json`` and the others go on; the sweep then raises
    :class:`CellsFailed` naming the failed cells. One sweep or run at a time in a process (:mod:`fedsim.exclusive`).
    """
    check_working_directory()  # the sweep file and its base may be relative paths
    out, runs = plan(path, overrides, output)
    sweep = read_sweep(path)
    workers = parallel if parallel is not None else sweep.parallel
    most = THREADS_PER_CPU * (os.cpu_count() or 1)  # local processes: a few per core, as simulation.threads
    if workers < 1 or (sweep.ray is None and workers > most):
        raise ConfigError(
            f"parallel (or --parallel) = {workers}: give a number of runs at once in 1..{most} for local processes "
            f"({THREADS_PER_CPU} x this machine's CPUs); a sweep with a ray: section may ask for more"
        )
    states, bad = {}, {}
    for name, cfg in runs:
        try:
            states[name] = state_of(cfg)
        except ConfigError as err:
            bad[name] = str(err)
    if not bad and (sweep.ray is None or sweep.ray.address is None):  # a cluster's nodes hold its own data
        bad = check_against_data([(n, c) for n, c in runs if states[n] != "done"])
    refuse_bad_cells(bad, len(runs))
    todo = [(n, cell_layout(c, sweep, workers), states[n] == "resume") for n, c in runs if states[n] != "done"]
    resumed = sum(resume for _, _, resume in todo)
    to_resume = f", {resumed} to resume from their checkpoints" if resumed else ""
    log(f"sweep {out}: {len(runs)} runs, {len(runs) - len(todo)} already complete{to_resume}")
    failures: dict[str, str] = {}

    def done(name: str, summary: dict[str, Any]) -> None:
        log(f"  {name}: client-mean acc {summary['final_client_mean_acc']}")

    def failed(name: str, why: str) -> None:
        failures[name] = why
        log(f"  {name}: failed: {why}")
        write_file(out / FAILED, json.dumps(failures, indent=1).encode())  # now: a Ctrl-C may come next

    with claimed_sweep(out, [name for name, _ in runs]), sigterm_as_interrupt():
        remove(out / FAILED)  # the last sweep's: its failed cells run again now
        if sweep.ray is not None:
            _run_on_ray(sweep.ray, todo, workers, done, failed)
        elif workers == 1:
            _run_inline(todo, done, failed)
        else:
            with tempfile.TemporaryDirectory(prefix=".cells-", dir=out) as scratch:
                _run_processes(todo, workers, Path(scratch), done, failed)
    if failures:
        raise CellsFailed(
            f"{len(failures)} of {len(todo)} sweep runs failed (why: {out / FAILED}; their metrics so far are in "
            f"{out}): " + ", ".join(failures)
        )
    return out
