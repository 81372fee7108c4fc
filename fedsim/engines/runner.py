"""``fedsim run``: check everything that can be checked, then hand the run to its engine."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

import torch

from fedsim.client.vectorized import refusal
from fedsim.config import RunConfig
from fedsim.engines.ray_address import check_ray_address
from fedsim.environment import check_working_directory, fault_of
from fedsim.errors import ConfigError
from fedsim.exclusive import claim_process
from fedsim.experiment.diagnostics import probe_images
from fedsim.experiment.federation import AnyFederation
from fedsim.experiment.resolve import Experiment, build_server, resolve
from fedsim.layout import choose_layout
from fedsim.models import FedsimModel
from fedsim.ownership import check_not_in_a_run
from fedsim.plugin_guard import plugin_code, warn_stray_threads
from fedsim.record.claim import check_fresh, claimed, metrics_so_far
from fedsim.record.layout import CHECKPOINT
from fedsim.record.paths import make_dir, resolved
from fedsim.strategies.server_half import ServerSetup, check_strategy
from fedsim.trackers import resolve_trackers

# Flower must stay offline and quiet: no telemetry, no update check
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",  # silences a Ray FutureWarning on CPU-only actors
}
RUN_ENV = {
    **OFFLINE_ENV,
    # Ray starts its workers at niceness 15: beside any other busy process the Ray pool and Flower's
    # runtime starved (the paper setting did not finish 6 rounds in 7 minutes beside two CPU hogs, and
    # took 3.0 s per round at niceness 0). Read by the raylet that a run starts, not by a joined cluster.
    "RAY_worker_niceness": "0",
}


def use_run_env() -> None:
    """RUN_ENV in this process's environment, for what it starts (a user's own settings win)."""
    for key, value in RUN_ENV.items():
        os.environ.setdefault(key, value)


def plan(cfg: RunConfig, resume: bool = False) -> Experiment:
    """The experiment a run of ``cfg`` will be, after every check that needs no training (plugins and
    options, the run directory, the Ray address, the data and its split, ``vmap_clients``), with its run
    directory fixed: ``output.run_dir``, else a new ``<output.dir>/<name>-<time>`` made for it."""
    check_working_directory()  # relative paths are read from it
    use_run_env()
    cfg = choose_layout(cfg.model_copy(deep=True))  # before the Ray address check, which reads the backend
    experiment = resolve(cfg)
    if cfg.output.run_dir and not resume:
        check_fresh(resolved(Path(cfg.output.run_dir), "output.run_dir"))
    resolve_trackers(cfg.output.trackers)  # an unknown tracker or a missing extra: before any data loads
    check_ray_address(cfg)  # a few seconds' check, before minutes of data loading
    check_runnable(experiment)
    cfg.output.run_dir = str(cfg.output.run_dir or new_run_dir(Path(cfg.output.dir), cfg.name))
    return resolve(cfg)


def check_runnable(experiment: Experiment, launcher: Literal["run", "deploy"] = "run") -> None:
    """The checks of a config against its data, model and strategy (the device, sizes, the model and the
    strategy's server half, ``vmap_clients``): bad data fails here, before any process or directory is made.
    ``fedsim run``, ``fedsim local`` and each cell of ``fedsim sweep`` train only a config that passes them;
    ``fedsim compose`` (``launcher="deploy"``) writes only one, less the device, which is its nodes'."""
    cfg = experiment.config
    if launcher == "run":
        check_device(cfg)
    check_sizes(cfg, experiment.federation())
    model = check_halves(experiment)
    if why := refusal(cfg, launcher, lambda: model):
        raise ConfigError(why)


def check_device(cfg: RunConfig) -> None:
    """A CUDA run on a machine without CUDA fails here, once, not in every client."""
    if cfg.simulation.device == "cuda" and cfg.simulation.ray_address is None and not torch.cuda.is_available():
        raise ConfigError(
            "simulation.device = 'cuda' but torch sees no CUDA device here (torch.cuda.is_available() is False); "
            "use simulation.device: cpu, or run where a GPU and a CUDA build of torch are"
        )


def check_halves(experiment: Experiment) -> FedsimModel:
    """Build the model and the strategy's server half once, as the run will (a normaliser that does not
    fit the model, a Flower strategy that would wait for nodes that never come): errors before the run."""
    with torch.random.fork_rng(devices=[]):  # the run's initial model comes from its own seeded draw
        model = experiment.build_model()
    cfg = experiment.config
    setup = ServerSetup(cfg.train.num_clients, frozenset(n for n, _ in model.named_parameters()), cfg.seed)
    check_strategy(build_server(experiment, setup), experiment.config.train.num_clients)
    return model


def check_sizes(cfg: RunConfig, fed: AnyFederation) -> None:
    """Sizes that only the data can check: a batch or probe larger than the data it is drawn from (a dataset
    generated per client has no whole set to compare with: a client smaller than a batch wraps, as any does)."""
    ds = fed.dataset
    if ds is None:
        return
    if cfg.train.batch_size > len(ds.y_train):
        raise ConfigError(
            f"train.batch_size = {cfg.train.batch_size} is larger than the whole training set "
            f"({len(ds.y_train)} images of {ds.name!r}); give at most that"
        )
    probe_images(cfg.diagnostics, len(ds.y_test))


def new_run_dir(parent: Path, name: str) -> Path:
    """``<parent>/<name>-<time>``, made now, with a suffix when another run took that name this second."""
    check_not_in_a_run(parent, "output.dir")
    make_dir(parent, "output.dir")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = parent / (f"{name}-{stamp}" if k == 1 else f"{name}-{stamp}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"output.dir {parent}: 999 runs named {name!r} started this second; give output.run_dir")


@claim_process("a run")
def run(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Run ``cfg`` in a run directory it owns while it runs; ``resume``: go on from the checkpoint in its run
    dir (:func:`fedsim.record.checkpoint.resume_config`). One run at a time in a process
    (:mod:`fedsim.exclusive`); a library that does not load, or memory that runs out, is an
    :class:`~fedsim.errors.EnvironmentFault`; a plugin's ``sys.exit`` / ``os._exit`` is a
    :class:`~fedsim.errors.PluginExit`; threads its code left running are named in a warning."""
    from fedsim.engines import run_with_engine

    before = set(threading.enumerate())
    try:
        with plugin_code():  # the data, partitioner, model and strategy that plan() builds and checks, too
            experiment = plan(cfg, resume)
            run_dir = Path(experiment.config.output.run_dir or "")
            with claimed(run_dir, resume, made=not cfg.output.run_dir):  # plan made <output.dir>/<name>-<time>
                try:
                    return run_with_engine(experiment, resume)
                except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: fedsim's one line says where the run stands
                    err.add_note(metrics_so_far(run_dir))
                    if (run_dir / CHECKPOINT).is_file():  # written whole or not at all (a temporary file renamed)
                        err.add_note(f"fedsim run --resume {run_dir} continues it from its last checkpoint")
                    raise
    except (ImportError, MemoryError, RuntimeError) as err:
        if (fault := fault_of(err)) is None:
            raise
        raise fault from err
    finally:
        warn_stray_threads(before)
