"""fedsim's Flower ServerApp, for Flower's own runtimes (a SuperLink, ``flwr run``); ``fedsim run`` runs
:func:`fedsim.server.loop.run_server` itself, on its engine's Grid, and never loads this module.

It reads the run config from Flower's run config (inline JSON, or a YAML path inside the app
bundle), resolves it, and runs :func:`fedsim.server.loop.run_server`; with ``fedsim-resume = true`` in
the run config, from the checkpoint in the run directory (refused as ``fedsim run --resume`` refuses a
run that cannot resume). Under a SuperLink nobody sees this process's traceback, so an error also lands
in the run directory (``error.txt``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import HttpGrid

from fedsim import wire
from fedsim.config import RunConfig
from fedsim.config_file import load_config
from fedsim.deploy import flower_waits
from fedsim.deploy.packing import PackedGrid
from fedsim.errors import FedsimError
from fedsim.experiment.resolve import resolve
from fedsim.record.checkpoint import resume_config
from fedsim.record.claim import claimed
from fedsim.record.paths import default_run_dir
from fedsim.record.writer import RunDir
from fedsim.server.loop import run_server
from fedsim.server.polling import PromptGrid


def app_file(path: str) -> Path:
    """A path given in the run config: as is, else inside the Flower App bundle (``flwr run`` installs
    it in the SuperLink's FLWR_HOME and puts its directory on ``sys.path``)."""
    candidates = [Path(path)] + [Path(entry) / path for entry in sys.path if entry and not Path(path).is_absolute()]
    return next((c for c in candidates if c.is_file()), Path(path))


def config_from_context(context: Context) -> RunConfig:
    """The run config: inline JSON (``fedsim-config``) or a YAML path (``config``) in the run config."""
    run_config = context.run_config
    if run_config.get(wire.RUN_CONFIG):
        return RunConfig.from_json(str(run_config[wire.RUN_CONFIG]))
    if "config" in run_config:
        return load_config(app_file(str(run_config["config"])))
    raise FedsimError("the run config has neither 'fedsim-config' nor 'config' (a YAML path)")


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    under_superlink = isinstance(grid, HttpGrid)
    if under_superlink:  # replies' objects retried after 1 s, not 20 ms
        flower_waits.shorten_object_pulls()
    cfg = config_from_context(context)
    resume = bool(context.run_config.get(wire.RESUME, False))  # fedsim deploy --resume
    cfg.output.run_dir = str(default_run_dir(cfg))  # fixed once: an error lands in the run's own directory
    with claimed(Path(cfg.output.run_dir), resume):  # not ours (in use, finished): raised, nothing written
        try:
            if resume:  # a finished run, or one with no checkpoint: one line, as fedsim run --resume says it
                resume_config(cfg.output.run_dir)
            # no 3 s sleeps between a SuperLink's pulls, Messages packed for the way; and nobody sees a
            # ServerApp's console under a SuperLink: the launcher (fedsim deploy) or fedsim submit shows the run
            grid = PackedGrid(grid) if under_superlink else PromptGrid(grid)
            run_server(grid, resolve(cfg), resume, show=False if under_superlink else None)
        except Exception as err:  # under a SuperLink nobody sees this process's traceback: leave the reason
            message = str(err) if isinstance(err, FedsimError) else f"{type(err).__name__}: {err}"
            RunDir(cfg.output.run_dir).write_error(message)
            raise
